#!/usr/bin/env bash
# One fuzz target as a ctest test (CMakeLists.txt registers one per target):
#
#   tests/fuzz/replay.sh TARGET SEEDS WORKDIR RUNS
#
# Replays every seed in SEEDS through TARGET (a libFuzzer binary of the fuzz
# build), then fuzzes on from them until RUNS executions in all, from a
# fixed seed: the same work on every machine, however fast. New inputs go to
# WORKDIR/corpus (emptied first, so the seed directory is never written);
# a crash, leak, undefined behaviour or hang (one input running past 60 s)
# fails the test and leaves the input in WORKDIR as crash-*, leak-*, oom-*,
# timeout-*, with the command that reproduces it.
set -euo pipefail

[ $# -eq 4 ] || { echo "usage: $0 TARGET SEEDS WORKDIR RUNS" >&2; exit 2; }
target=$1 seeds=$2 work=$3 runs=$4
name=$(basename "$target")

if [ ! -x "$target" ]; then
  echo "$name: $target is not built. The fuzz targets live in the fuzz build" >&2
  echo "(clang, libFuzzer): \`make test\` builds it before running ctest, or \`make fuzz-build\`." >&2
  exit 1
fi
shopt -s nullglob
seed_files=("$seeds"/*)
[ ${#seed_files[@]} -gt 0 ] || { echo "$name: no seed corpus in $seeds" >&2; exit 1; }

rm -rf "$work"
mkdir -p "$work/corpus"
log="$work/$name.log"
rc=0
# -timeout is a hang detector (an input here takes milliseconds), not a
# measure of speed.
"$target" -seed=1 -runs="$runs" -timeout=60 -print_final_stats=1 \
  -artifact_prefix="$work/" "$work/corpus" "$seeds" >"$log" 2>&1 || rc=$?

execs=$(sed -n 's/^stat::number_of_executed_units: *\([0-9]*\).*/\1/p' "$log" | tail -n 1)
if [ "$rc" -ne 0 ]; then
  tail -n 80 "$log"
  for a in "$work"/crash-* "$work"/leak-* "$work"/timeout-* "$work"/oom-*; do
    echo "$name: input kept in $a; reproduce with: $target $a"
  done
  echo "$name: FAILED (exit $rc); full log in $log"
  exit 1
fi
echo "$name: ${#seed_files[@]} seeds replayed, ${execs:-?} executions in all (-runs=$runs -seed=1): ok"
