#!/bin/sh
# test_pkgconfig.sh BUILD_DIR SOURCE_ROOT KILND [B_SANITIZE]
#
# libkiln as an installed package: `meson install` of BUILD_DIR into a
# temporary DESTDIR; kiln.pc found through PKG_CONFIG_PATH with its prefix
# redefined to the DESTDIR copy; clients/libkiln/example.c built with
#   cc example.c $(pkg-config --cflags --libs kiln)
# and run against a kilnd started here (twice: "compiled", then "memory").
# Also checks that the example in clients/libkiln/README.md is example.c.
# With a sanitizer build, the example is built with the same -fsanitize
# (the installed library needs its runtime).
set -eu

build=$1
src=$2
kilnd=$3
san=${4:-none}

tmp=$(mktemp -d /tmp/kiln-pkgconfig-XXXXXX)
kpid=
cleanup() {
	if [ -n "$kpid" ]; then
		kill "$kpid" 2>/dev/null || true
		wait "$kpid" 2>/dev/null || true
	fi
	rm -rf "$tmp"
}
trap cleanup EXIT INT TERM

fail() {
	echo "FAIL: $*" >&2
	exit 1
}

# The README's C block is example.c, byte for byte.
awk '/^```c$/ {on = 1; next} /^```$/ {on = 0} on' \
	"$src/clients/libkiln/README.md" >"$tmp/readme_example.c"
cmp -s "$tmp/readme_example.c" "$src/clients/libkiln/example.c" ||
	fail "the example in clients/libkiln/README.md differs from example.c"

# Install.
meson install -C "$build" --destdir "$tmp/dest" --no-rebuild --quiet \
	>"$tmp/install.log" 2>&1 || { cat "$tmp/install.log"; fail "meson install"; }
pc=$(find "$tmp/dest" -name kiln.pc -path '*/pkgconfig/*' | head -n 1)
[ -n "$pc" ] || fail "no kiln.pc installed"
pcdir=$(dirname "$pc")
export PKG_CONFIG_PATH="$pcdir${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
prefix=$(pkg-config --variable=prefix kiln)
dprefix="$tmp/dest$prefix"
pcflags="--define-variable=prefix=$dprefix"
[ -f "$dprefix/include/kiln/kiln.h" ] || fail "kiln/kiln.h not installed"
[ -f "$dprefix/include/kiln/protocol/protocol.h" ] ||
	fail "kiln/protocol/protocol.h not installed"
libdir=$(pkg-config "$pcflags" --variable=libdir kiln)
[ -e "$libdir/libkiln.so" ] || fail "no libkiln.so in $libdir"
# The shared library carries no LLVM.
if ldd "$libdir/libkiln.so" | grep -qi llvm; then
	fail "libkiln.so links LLVM"
fi

# Build the example the README's way (plus warnings as errors).
extra=
if [ "$san" != none ] && [ -n "$san" ]; then
	extra="-fsanitize=$san"
fi
cp "$src/clients/libkiln/example.c" "$tmp/example.c"
# shellcheck disable=SC2046,SC2086
cc -Wall -Wextra -Werror $extra "$tmp/example.c" \
	$(pkg-config "$pcflags" --cflags --libs kiln) -o "$tmp/kiln-example" ||
	fail "cc example.c \$(pkg-config --cflags --libs kiln)"

# A kilnd of our own.
mkdir -p "$tmp/run"
printf '[kilnd]\n' >"$tmp/empty.conf"
env -u KILN_SOCKET -u KILN_STORE_DIR "$kilnd" --config "$tmp/empty.conf" \
	--socket="$tmp/run/kilnd.sock" --store-dir="$tmp/store" \
	--workers=1 --log-level=info >"$tmp/kilnd.log" 2>&1 &
kpid=$!
i=0
until [ -S "$tmp/run/kilnd.sock" ]; do
	i=$((i + 1))
	[ $i -lt 600 ] || { cat "$tmp/kilnd.log"; fail "kilnd did not start"; }
	kill -0 "$kpid" 2>/dev/null || { cat "$tmp/kilnd.log"; fail "kilnd exited"; }
	sleep 0.1
done

run_example() {
	KILN_SOCKET="$tmp/run/kilnd.sock" KILN_AUTOSTART=0 \
		LD_LIBRARY_PATH="$libdir" \
		"$tmp/kiln-example" "$src/tests/data/graphs/mlp_fwd.graph.msgpack"
}
out=
for _ in 1 2 3 4 5; do
	if out=$(run_example 2>"$tmp/example.err"); then
		break
	fi
	# The socket exists a moment before kilnd listens on it.
	grep -q '^connect:' "$tmp/example.err" || break
	sleep 0.2
done
echo "$out"
cat "$tmp/example.err" >&2
echo "$out" | grep -qx 'source compiled' || fail "first run: $out"
echo "$out" | grep -qE '^signature [0-9a-f]{64}$' || fail "signature: $out"
echo "$out" | grep -qE '^size [1-9][0-9]*$' || fail "size: $out"
sig=$(echo "$out" | sed -n 's/^signature //p')
out=$(run_example) || fail "second run"
echo "$out"
echo "$out" | grep -qx 'source memory' || fail "second run: $out"
echo "$out" | grep -qx "signature $sig" || fail "second run's signature"

# Without a kilnd (and without auto-start): a plain error, exit 1.
if KILN_SOCKET="$tmp/none/kilnd.sock" KILN_AUTOSTART=0 \
	LD_LIBRARY_PATH="$libdir" "$tmp/kiln-example" \
	"$src/tests/data/graphs/mlp_fwd.graph.msgpack" 2>"$tmp/none.err"; then
	fail "the example succeeded without a kilnd"
fi
grep -q "$tmp/none/kilnd.sock" "$tmp/none.err" ||
	fail "the error does not name the socket: $(cat "$tmp/none.err")"
echo "ok"
