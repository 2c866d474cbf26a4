#!/usr/bin/env bash
# ctest install_pkgconfig: `cmake --install` (what `make install PREFIX=...`
# runs) into a fresh prefix, then the C example of README.md ("Using the
# engine"), extracted as it is written there, compiled against the install
# with pkg-config twice — shared (`cc app.c $(pkg-config --cflags --libs
# ferry)`) and static (`cc -static app.c $(pkg-config --static --cflags
# --libs ferry)`) — and run; bin/ferry is there and bin/ferry-lab is not. Usage: install_pkgconfig.sh BUILD_DIR SOURCE_DIR SANITIZE(0|1)
set -euo pipefail
build=$1 src=$2 sanitize=${3:-0}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

cmake --install "$build" --prefix "$tmp/prefix" > "$tmp/install.log"
pc=$(find "$tmp/prefix" -name ferry.pc)
[ -n "$pc" ] || { echo "no ferry.pc installed"; cat "$tmp/install.log"; exit 1; }
libdir=$(dirname "$(dirname "$pc")")
export PKG_CONFIG_PATH=$(dirname "$pc")
echo "installed: $(cd "$tmp/prefix" && find . -type f -o -type l | sort | tr '\n' ' ')"
soname=$(objdump -p "$libdir/libferry.so" | awk '/SONAME/ {print $2}')
echo "SONAME: $soname; pkg-config --modversion ferry: $(pkg-config --modversion ferry)"
case "$soname" in libferry.so.[0-9]*) ;; *) echo "libferry.so has no versioned SONAME"; exit 1 ;; esac
# the operator's ferry is installed; ferry-lab (the demos and benchmarks) is not
[ -x "$tmp/prefix/bin/ferry" ] || { echo "bin/ferry is not installed"; exit 1; }
[ ! -e "$tmp/prefix/bin/ferry-lab" ] || { echo "bin/ferry-lab is installed: it must not be"; exit 1; }

# the first ```c block after the "## Using the engine" heading
awk '/^## Using the engine/ {s=1} s && /^```c/ {c=1; next} c && /^```/ {exit} c {print}' "$src/README.md" \
    > "$tmp/app.c"
[ -s "$tmp/app.c" ] || { echo "no C example under '## Using the engine' in README.md"; exit 1; }
export FERRY_TOKEN=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
unset FERRY_TOKEN_FILE FERRY_TRANSPORT
san=()
[ "$sanitize" = 1 ] && san=(-fsanitize=address,undefined)

cd "$tmp"
# shared, exactly as the README says (plus the sanitizer when libferry has it)
cc "${san[@]}" app.c $(pkg-config --cflags --libs ferry) -o app_shared
deps=$(ldd app_shared)   # whole, before grep: a grep -q that stops early would break the pipe
grep -q "$soname" <<< "$deps" || { echo "app_shared does not load $soname:"; echo "$deps"; exit 1; }
LD_LIBRARY_PATH=$libdir ./app_shared
echo "shared: ok (loads $soname)"

if [ "$sanitize" = 1 ]; then
  echo "static: not built: ASan and UBSan do not link into a -static executable (SANITIZE=1)"
  exit 0
fi
cc -static app.c $(pkg-config --static --cflags --libs ferry) -o app_static 2> static.log || {
  cat static.log; exit 1; }
if ldd app_static > /dev/null 2>&1; then echo "app_static is dynamic:"; ldd app_static; exit 1; fi
./app_static
echo "static: ok ($(file -b app_static | cut -d, -f1-2))"
