#!/usr/bin/env bash
# Timed fuzzing of every libFuzzer target of the fuzz build (`make fuzz`,
# which builds FUZZDIR first):
#
#   scripts/fuzz.sh FUZZDIR SECONDS [JOBS]
#
# Each target tests/fuzz/fuzz_<name>.c (built as FUZZDIR/fuzz_<name>) fuzzes
# for SECONDS seconds from its seed corpus tests/fuzz/corpus_<name>/, JOBS
# targets at a time (default 2). New inputs go to FUZZDIR/run/fuzz_<name>/
# corpus (emptied at the start; the seed directories are never written).
# Prints one line per target as it ends; exits non-zero if any target finds
# a crash, leak, undefined behaviour or hang (one input running past 60 s):
# the input is kept in FUZZDIR/run/fuzz_<name>/ as crash-*, leak-*,
# timeout-* or oom-*, and the line names it with the command that
# reproduces it.
set -euo pipefail

die() { echo "fuzz.sh: $*" >&2; exit 2; }

[ $# -ge 2 ] && [ $# -le 3 ] || { echo "usage: $0 FUZZDIR SECONDS [JOBS]" >&2; exit 2; }
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
[ -d "$1" ] || die "no fuzz build in $1 (make fuzz builds it)"
dir=$(cd "$1" && pwd)
seconds=$2 jobs=${3:-2}
[[ $seconds =~ ^[1-9][0-9]*$ ]] || die "SECONDS must be a positive whole number, not '$seconds'"
[[ $jobs =~ ^[1-9][0-9]*$ ]] || die "JOBS must be a positive whole number, not '$jobs'"

shopt -s nullglob
names=()
for src in "$root"/tests/fuzz/fuzz_*.c; do
  name=$(basename "$src" .c)
  [ -x "$dir/$name" ] || die "$dir/$name is not built (make fuzz builds it)"
  names+=("$name")
done
[ ${#names[@]} -gt 0 ] || die "no targets under tests/fuzz/"

fuzz_one() { # name -> libFuzzer's exit status; one line on stdout
  local name=$1 work="$dir/run/$1" seeds="$root/tests/fuzz/corpus_${1#fuzz_}" rc=0
  rm -rf "$work"
  mkdir -p "$work/corpus"
  local t0 t1
  t0=$(date +%s%N)
  # -timeout is a hang detector: an input here takes milliseconds.
  "$dir/$name" -max_total_time="$seconds" -timeout=60 -print_final_stats=1 \
    -artifact_prefix="$work/" "$work/corpus" "$seeds" >"$work/$name.log" 2>&1 || rc=$?
  t1=$(date +%s%N)
  local ms=$(( (t1 - t0) / 1000000 )) execs
  execs=$(sed -n 's/^stat::number_of_executed_units: *\([0-9]*\).*/\1/p' "$work/$name.log" | tail -n 1)
  execs=${execs:-0}
  local line
  line=$(printf '%s: %s execs in %d.%03d s (%s/s)' "$name" "$execs" $((ms / 1000)) $((ms % 1000)) \
         $(( ms > 0 ? execs * 1000 / ms : 0 )))
  if [ "$rc" -eq 0 ]; then
    echo "$line: ok"
    return 0
  fi
  echo "$line: FAILED (exit $rc); log in $work/$name.log"
  tail -n 60 "$work/$name.log" | sed "s/^/  $name| /"
  local a
  for a in "$work"/crash-* "$work"/leak-* "$work"/timeout-* "$work"/oom-*; do
    echo "$name: input kept in $a; reproduce with: $dir/$name $a"
  done
  return "$rc"
}

echo "fuzzing ${#names[@]} targets for $seconds s each, $jobs at a time"
failed=0 running=0
for name in "${names[@]}"; do
  if [ "$running" -ge "$jobs" ]; then
    wait -n || failed=1
    running=$((running - 1))
  fi
  fuzz_one "$name" &
  running=$((running + 1))
done
while [ "$running" -gt 0 ]; do
  wait -n || failed=1
  running=$((running - 1))
done
[ "$failed" -eq 0 ] && echo "fuzzing: no findings" || echo "fuzzing: FAILED (see above)"
exit "$failed"
