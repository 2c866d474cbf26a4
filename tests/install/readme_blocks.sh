#!/usr/bin/env bash
# ctest readme_blocks: every ```sh, ```bash and ```python block of README.md
# run as it is written, in order, in one shell, as a new user would after
# the two set-up commands: in a fresh directory laid out like a clone (the
# source tree's top-level entries linked in, `build` the built tree), with
# a HOME of its own (so ~/.ferry is new) and none of the FERRY_* variables
# of whoever runs the test. A python block runs with the interpreter the
# package was built for and the package of the build (PYTHONPATH, as make
# assembles it: the README's `pip install .` is the pip_install test).
#
# A block right after a line `<!-- readme-test: skip (why) -->` is not run
# (set-up commands, `make test` itself, what another test runs); the
# reasons are printed. Whatever the blocks start (`ferry up --detach`) is
# stopped at the end, also when a block fails.
#
# The same for a page of docs/ (ctest doc_blocks.<page>): every block of
# it runs or is marked; a page whose every block is marked passes (it says
# so), the README must run at least one.
#
# Usage: readme_blocks.sh BUILD_DIR SOURCE_DIR [PYTHON [LIBASAN [FILE]]]
#        FILE: the markdown file, relative to SOURCE_DIR (default README.md)
set -euo pipefail
build=$(cd "$1" && pwd) src=$(cd "$2" && pwd)
python=${3:-/usr/bin/python3}
libasan=${4:-}
file=${5:-README.md}
tmp=$(mktemp -d /tmp/ferry-readme-XXXXXX)
cleanup() {
  local rc=$?
  if [ -f "$tmp/home/.ferry/up.pids" ]; then
    echo "readme_blocks: stopping the cluster a block left running"
    "$build/ferry" down --dir "$tmp/home/.ferry" || rc=1
  fi
  rm -rf "$tmp"
  exit $rc
}
trap cleanup EXIT
mkdir -p "$tmp/home" "$tmp/clone"
for f in "$src"/* "$src"/.[!.]*; do
  [ -e "$f" ] || continue
  case "$(basename "$f")" in build|build-*|.git) continue ;; esac
  ln -s "$f" "$tmp/clone/$(basename "$f")"
done
ln -s "$build" "$tmp/clone/build"

# README.md as one bash script: sh blocks verbatim, python blocks as
# here-documents to the interpreter, each announced with its line number.
awk -v q="'" -v file="$file" '
  /^<!-- readme-test: skip/ { skip = $0; next }
  !inb && /^```/ {
    inb = 1; lang = substr($0, 4); mode = "other"
    if (lang == "sh" || lang == "bash" || lang == "python") {
      if (skip != "") {
        mode = "skip"; sub(/^<!-- readme-test: skip */, "", skip); sub(/ *-->$/, "", skip); sub(/^\(/, "", skip); sub(/\)$/, "", skip); gsub(q, q "\\" q q, skip)
        printf "echo %sreadme_blocks: %s line %d (%s): not run: %s%s\n", q, file, NR, lang, skip, q
      } else if (lang == "python") {
        mode = "py"; printf "echo %sreadme_blocks: %s line %d (python)%s\n", q, file, NR, q
        print "\"$FERRY_README_PY\" - <<" q "FERRY_README_PY_EOF" q
      } else {
        mode = "sh"; printf "echo %sreadme_blocks: %s line %d (%s)%s\n", q, file, NR, lang, q
      }
      blocks++
    }
    skip = ""; next
  }
  inb && /^```/ { if (mode == "py") print "FERRY_README_PY_EOF"; inb = 0; next }
  inb && (mode == "sh" || mode == "py") { print }
  !inb && !/^[ \t]*$/ { skip = "" }   # a marker applies to the very next block only
  END { if (blocks == 0) exit 1 }
' "$src/$file" > "$tmp/readme.sh" || { echo "readme_blocks: no shell or python block in $file"; exit 1; }

ran=$(grep -c "^echo 'readme_blocks: [^ ]* line [0-9]* ([a-z]*)'$" "$tmp/readme.sh" || true)
echo "readme_blocks: $file: $ran blocks to run, $(grep -c ': not run: ' "$tmp/readme.sh" || true) marked not to"
if [ "$ran" -eq 0 ]; then
  [ "$file" != README.md ] && { echo "readme_blocks: $file: every block is marked as a fragment"; exit 0; }
  echo "readme_blocks: every block is marked not to run"; exit 1
fi

py=("$python")
[ -n "$libasan" ] && py=(env "LD_PRELOAD=$libasan" ASAN_OPTIONS=detect_leaks=0 "$python")
# `python3` in a block is that interpreter too
mkdir -p "$tmp/bin"
printf '#!/bin/sh\nexec %s "$@"\n' "$(printf '%q ' "${py[@]}")" > "$tmp/bin/python3"
chmod +x "$tmp/bin/python3"
cd "$tmp/clone"
env -u FERRY_MASTER -u FERRY_TOKEN -u FERRY_TOKEN_FILE -u FERRY_HOME -u FERRY_LISTEN \
    -u FERRY_TRANSPORT HOME="$tmp/home" PATH="$tmp/bin:$PATH" PYTHONPATH="$build/python" \
    FERRY_README_PY="$tmp/bin/python3" bash -euo pipefail -x "$tmp/readme.sh"
echo "readme_blocks: $file: every block ran"
