#!/usr/bin/env bash
# Build every libFuzzer target tests/fuzz/fuzz_<name>.c and give each a short
# run on a copy of its seed corpus tests/fuzz/corpus_<name>/ (if there is
# one). ctest calls it as the fuzz_decoders test:
#
#   scripts/fuzz.sh OUTDIR
#
# Each run stops after FERRY_FUZZ_SECONDS seconds (default 60) or 1,000,000
# executions, whichever comes first. Prints one line per target; exits
# non-zero if any target fails to build or finds a crash (the reproducer is
# left in OUTDIR as fuzz_<name>-crash-*).
set -euo pipefail

die() { echo "fuzz.sh: $*" >&2; exit 1; }

[ $# -eq 1 ] || { echo "usage: $0 OUTDIR" >&2; exit 2; }
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mkdir -p "$1"
out=$(cd "$1" && pwd)
seconds=${FERRY_FUZZ_SECONDS:-60}
runs=1000000
[[ $seconds =~ ^[1-9][0-9]*$ ]] || die "FERRY_FUZZ_SECONDS must be a positive integer, not '$seconds'"

command -v clang >/dev/null || die "clang not found; install it: apt-get install clang libclang-rt-14-dev"

# Without clang's libFuzzer runtime every target would fail to link with an
# obscure error; say what is missing instead.
probe="$out/.libfuzzer-probe"
printf 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n)\n{ (void)d; (void)n; return 0; }\n' >"$probe.c"
if ! clang -fsanitize=fuzzer,address,undefined "$probe.c" -o "$probe" 2>"$probe.log"; then
  cat "$probe.log" >&2
  die "clang cannot link the libFuzzer runtime; install it: apt-get install libclang-rt-14-dev"
fi

libs=$(pkg-config --cflags --libs libxxhash jansson libsodium) \
  || die "pkg-config cannot find libxxhash, jansson or libsodium (run scripts/deps.sh)"

shopt -s nullglob
# src/store holds the client library too, which drives the engine.
srcs=("$root"/src/base/*.c "$root"/src/wire/*.c "$root"/src/engine/*.c "$root"/src/engine/transport/*.c
      "$root"/src/reshard/*.c "$root"/src/store/*.c "$root"/src/exec/*.c "$root"/src/rl/*.c "$root"/src/sparse/*.c)
targets=("$root"/tests/fuzz/fuzz_*.c)
[ ${#targets[@]} -gt 0 ] || die "no targets under tests/fuzz/"

# -fno-sanitize-recover: an undefined-behaviour report is a finding, so it
# must stop the run like a crash rather than scroll past.
# shellcheck disable=SC2054  # the commas are clang's, not array separators
cflags=(-std=c11 -D_GNU_SOURCE -g -O1 -fsanitize=fuzzer,address,undefined
        -fno-sanitize-recover=undefined -I"$root/include" -I"$root/src")

build() { # name source -> 0 when OUTDIR/name was built
  # $libs is a list of flags: split on purpose.
  # shellcheck disable=SC2086
  clang "${cflags[@]}" "$2" "${srcs[@]}" $libs -lpthread -o "$out/$1" 2>"$out/$1.build.log"
}

run() { # name -> libFuzzer's exit status; log in OUTDIR/name.log
  local name=$1 corpus="$out/corpus_${1#fuzz_}" seeds="$root/tests/fuzz/corpus_${1#fuzz_}"
  rm -rf "$corpus"
  mkdir -p "$corpus"
  if [ -d "$seeds" ]; then cp -R "$seeds"/. "$corpus"/; fi
  # -timeout: one input running this long is a hang, reported as a crash.
  (cd "$out" && "$out/$name" -max_total_time="$seconds" -runs="$runs" -timeout=25 \
     -print_final_stats=1 -artifact_prefix="$out/$name-" "$corpus") >"$out/$name.log" 2>&1
}

failed=0
for src in "${targets[@]}"; do
  name=$(basename "$src" .c)
  if ! build "$name" "$src"; then
    echo "$name: BUILD FAILED"
    cat "$out/$name.build.log"
    failed=1
    continue
  fi
  t0=$(date +%s%N)
  rc=0
  run "$name" || rc=$?
  t1=$(date +%s%N)
  ms=$(( (t1 - t0) / 1000000 ))
  execs=$(sed -n 's/^stat::number_of_executed_units: *\([0-9]*\).*/\1/p' "$out/$name.log" | tail -n 1)
  execs=${execs:-0}
  rate=$(( ms > 0 ? execs * 1000 / ms : 0 ))
  line=$(printf '%s: %s execs in %d.%03d s (%s/s)' "$name" "$execs" $((ms / 1000)) $((ms % 1000)) "$rate")
  if [ "$rc" -ne 0 ]; then
    echo "$line: FAILED (exit $rc)"
    tail -n 60 "$out/$name.log"
    failed=1
  else
    echo "$line: ok"
  fi
done
exit "$failed"
