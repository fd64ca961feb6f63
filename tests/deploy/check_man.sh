#!/bin/sh
# check_man.sh — the man pages render without a warning (the man_pages test,
# suite 'deploy'): each page through `groff -man -Tutf8 -ww -z` and through
# `man --warnings -l` (its own preprocessors and defaults), where those
# tools exist; any message on stderr, or a non-zero exit, fails. The page
# must also have a NAME and a SYNOPSIS section. Exits 77 (skipped) when
# neither groff nor man exists.
#
# Usage: check_man.sh PAGE...
set -u

if [ $# -eq 0 ]; then
	echo "usage: $0 PAGE..." >&2
	exit 2
fi
have_groff=0 have_man=0
command -v groff >/dev/null 2>&1 && have_groff=1
command -v man >/dev/null 2>&1 && have_man=1
if [ $have_groff -eq 0 ] && [ $have_man -eq 0 ]; then
	echo "check_man: neither groff nor man is installed: skipped"
	exit 77
fi

fail=0
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
for page in "$@"; do
	for s in '^\.SH NAME' '^\.SH SYNOPSIS' '^\.TH '; do
		if ! grep -q "$s" "$page"; then
			echo "FAIL $page: no $s"
			fail=1
		fi
	done
	if [ $have_groff -eq 1 ]; then
		if ! LC_ALL=C.UTF-8 groff -man -Tutf8 -ww -z "$page" \
			>"$tmp/out" 2>"$tmp/err" || [ -s "$tmp/err" ]; then
			echo "FAIL $page: groff -man -Tutf8 -ww:"
			cat "$tmp/err"
			fail=1
		else
			echo "ok   $page: groff -man -Tutf8 -ww"
		fi
	fi
	if [ $have_man -eq 1 ]; then
		if ! LC_ALL=C.UTF-8 MANWIDTH=80 man --warnings -l "$page" \
			>"$tmp/out" 2>"$tmp/err" || [ -s "$tmp/err" ]; then
			echo "FAIL $page: man --warnings -l:"
			cat "$tmp/err"
			fail=1
		elif ! [ -s "$tmp/out" ]; then
			echo "FAIL $page: man -l printed nothing"
			fail=1
		else
			echo "ok   $page: man --warnings -l"
		fi
	fi
done
exit $fail
