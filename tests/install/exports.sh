#!/usr/bin/env bash
# libferry.so exports the public API only (src/libferry.map): every
# defined dynamic symbol is ferry_*, and the public API is there.
set -euo pipefail
lib=$1
syms=$(nm -D --defined-only "$lib" | awk 'NF == 3 {print $3}')
total=$(printf '%s\n' "$syms" | grep -c . || true)
other=$(printf '%s\n' "$syms" | grep -v '^ferry_' || true)
echo "exports: $total defined dynamic symbols in $lib"
if [ -n "$other" ]; then
    echo "exports: $(printf '%s\n' "$other" | grep -c .) are not ferry_*:"
    head -20 <<< "$other"
    exit 1
fi
for want in ferry_store_open ferry_engine_open ferry_publish ferry_subscriber_update_next \
            ferry_publish_stream_begin ferry_store_put_begin ferry_remote_access_begin; do
    # a here-string, not a pipe: grep -q stops at its match, and under
    # pipefail the writer's SIGPIPE would fail the check now and then
    grep -qx "$want" <<< "$syms" || { echo "exports: $want is missing"; exit 1; }
done
# Every call a header declares FERRY_API is exported (the library is built
# with -fvisibility=hidden: a declaration without the marker would be
# hidden), and nothing else is.
inc=$(dirname "$0")/../../include/ferry
declared=$(grep -ho '^FERRY_API [^(]*(' "$inc"/*.h | grep -o 'ferry_[a-z0-9_]*($' | tr -d '(' | sort -u)
missing=$(comm -23 <(printf '%s\n' "$declared") <(printf '%s\n' "$syms" | sort -u))
extra=$(comm -13 <(printf '%s\n' "$declared") <(printf '%s\n' "$syms" | sort -u))
[ -z "$missing" ] || { echo "exports: declared FERRY_API but not exported:"; echo "$missing"; exit 1; }
[ -z "$extra" ] || { echo "exports: exported but not declared FERRY_API in include/ferry:"; echo "$extra"; exit 1; }
echo "exports: all ferry_*, $(printf '%s\n' "$declared" | grep -c .) declared FERRY_API, each exported"
