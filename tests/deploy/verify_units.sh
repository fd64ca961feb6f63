#!/bin/sh
# verify_units.sh — checks deploy/'s systemd files (the deploy_units test,
# suite 'deploy'):
#   1. `systemd-analyze verify` of kilnd.service and kilnd.socket: exit 0 and
#      no output at all (v252 only warns about unknown keys, so any message
#      fails the test);
#   2. `systemd-analyze security --offline=true --threshold=N` of
#      kilnd.service: its exposure score (0-100 scale; the printed 1.3 is 13)
#      must not exceed N;
#   3. when running as root and systemd-sysusers/systemd-tmpfiles exist:
#      kiln.sysusers creates the kiln user in a scratch root, and
#      kiln.tmpfiles then creates its /run/kiln 0750 kiln:kiln.
# Copies go to a temporary directory; ExecStart= points at a stub executable
# there (verify insists that the binary exists). Nothing outside it changes.
# Exits 77 (skipped) when systemd-analyze is missing.
#
# Usage: verify_units.sh KILND.SERVICE KILND.SOCKET KILN.SYSUSERS \
#                        KILN.TMPFILES THRESHOLD
set -eu

if [ $# -ne 5 ]; then
	echo "usage: $0 SERVICE SOCKET SYSUSERS TMPFILES THRESHOLD" >&2
	exit 2
fi
threshold=$5
# Absolute paths: systemd-sysusers --root reads relative ones inside the root.
service=$(readlink -f "$1") socket=$(readlink -f "$2")
sysusers=$(readlink -f "$3") tmpfiles=$(readlink -f "$4")

if ! command -v systemd-analyze >/dev/null 2>&1; then
	echo "SKIP: systemd-analyze not found in PATH ($PATH)"
	exit 77
fi
systemd-analyze --version | head -n 1

tmp=$(mktemp -d "${TMPDIR:-/tmp}/kiln-deploy-XXXXXX")
trap 'rm -rf "$tmp"' EXIT INT TERM
mkdir "$tmp/units" "$tmp/bin" "$tmp/root"
printf '#!/bin/sh\nexit 0\n' >"$tmp/bin/kilnd"
chmod 0755 "$tmp/bin/kilnd"
sed "s|^ExecStart=.*/kilnd\$|ExecStart=$tmp/bin/kilnd|" "$service" \
	>"$tmp/units/kilnd.service"
cp "$socket" "$tmp/units/kilnd.socket"
if ! grep -q "^ExecStart=$tmp/bin/kilnd\$" "$tmp/units/kilnd.service"; then
	echo "FAIL: no ExecStart=.../kilnd line in $service"
	exit 1
fi

fail=0

# 1. verify. --man=no: no man pages here; --recursive-errors=no: judge these
# two units, not the targets they name (no systemd as PID 1 in containers).
echo "== systemd-analyze verify"
if ! out=$(systemd-analyze verify --man=no --recursive-errors=no \
	"$tmp/units/kilnd.socket" "$tmp/units/kilnd.service" 2>&1); then
	echo "$out"
	echo "FAIL: systemd-analyze verify failed"
	fail=1
elif [ -n "$out" ]; then
	echo "$out"
	echo "FAIL: systemd-analyze verify printed warnings"
	fail=1
else
	echo "ok: kilnd.service kilnd.socket"
fi

# 2. security.
echo "== systemd-analyze security --offline=true --threshold=$threshold"
if out=$(systemd-analyze security --offline=true --threshold="$threshold" \
	"$tmp/units/kilnd.service" 2>&1); then
	rc=0
else
	rc=$?
fi
# The exposed settings, then the score.
echo "$out" | grep -E '^ *✗|Overall exposure' || true
if [ "$rc" -ne 0 ]; then
	echo "FAIL: exposure above the threshold $threshold (exit $rc)"
	fail=1
fi

# 3. sysusers.d and tmpfiles.d, applied to a scratch root.
echo "== sysusers.d / tmpfiles.d"
if [ "$(id -u)" -ne 0 ]; then
	echo "SKIP (part 3): not root, so tmpfiles cannot chown in a scratch root"
elif ! command -v systemd-sysusers >/dev/null 2>&1 ||
	! command -v systemd-tmpfiles >/dev/null 2>&1; then
	echo "SKIP (part 3): systemd-sysusers or systemd-tmpfiles not found"
else
	mkdir -p "$tmp/root/etc" "$tmp/root/run"
	if ! systemd-sysusers --root="$tmp/root" "$sysusers"; then
		echo "FAIL: systemd-sysusers $sysusers"
		fail=1
	elif ! systemd-tmpfiles --root="$tmp/root" --create "$tmpfiles"; then
		echo "FAIL: systemd-tmpfiles $tmpfiles"
		fail=1
	else
		uid=$(awk -F: '$1 == "kiln" { print $3 }' "$tmp/root/etc/passwd")
		gid=$(awk -F: '$1 == "kiln" { print $3 }' "$tmp/root/etc/group")
		got=$(stat -c '%a %u %g' "$tmp/root/run/kiln" 2>&1 || true)
		if [ -z "$uid" ] || [ -z "$gid" ]; then
			echo "FAIL: no kiln user/group after systemd-sysusers"
			fail=1
		elif [ "$got" != "750 $uid $gid" ]; then
			echo "FAIL: /run/kiln is '$got', want '750 $uid $gid'"
			fail=1
		else
			echo "ok: user kiln ($uid:$gid), /run/kiln 0750 kiln:kiln"
		fi
	fi
fi

exit $fail
