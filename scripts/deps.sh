#!/usr/bin/env bash
# Installs the Debian packages ferry's build and tests need.
#   scripts/deps.sh          install what is missing (as root), else print the apt-get line and fail
#   scripts/deps.sh --check  exit 0 when everything is present, 1 otherwise; installs nothing
#   --demo (with either)     only what the library and the CLI need (`make demo`): no test
#                            framework, no clang, no Python, no torch
set -u
# libdlpack-dev: the DLPack header the Python extension takes tensors with;
# python3-cffi: the Python binding, declared from include/ferry/*.h at build time;
# python3-venv: the environment `pip install .` goes into (README.md);
# python3-torch: the Python tests of torch tensors in and out;
# libmicrohttpd-dev: the /metrics endpoint of `ferry master` and `ferry node`;
# curl: the test that scrapes it (tests/store/test_store_metrics.c);
# libucx-dev: the ucx transport (src/engine/transport/ucx*.c, RDMA fabrics
# through UCX; tested here over UCX's tcp and shared-memory transports);
# ucx-utils: ucx_perftest, the baseline of `ferry-lab bench engine --transport ucx`;
# libcurl4-openssl-dev: the etcd client of a replicated master (src/store/etcd.c,
# etcd's v3 JSON gateway over HTTP; libcurl is loaded when it first talks to etcd);
# etcd-server: the etcd the tests of that client and of a replicated master start.
# gnuplot-nox: `ferry-lab bench cluster --plot FILE.svg` (each host's link per
# 100 ms, one panel per strategy; tests/lab/test_lab_bench_cluster.c).
DEMO_PKGS=(cmake make gcc pkg-config libxxhash-dev libjansson-dev libsodium-dev libmicrohttpd-dev
           libucx-dev libcurl4-openssl-dev)
PKGS=("${DEMO_PKGS[@]}" libcmocka-dev python3-dev python3-numpy python3-pytest iproute2 clang
      libclang-rt-14-dev libdlpack-dev python3-cffi python3-venv python3-torch curl ucx-utils etcd-server
      gnuplot-nox)
check=""
for a in "$@"; do
  case "$a" in
    --check) check=1 ;;
    --demo) PKGS=("${DEMO_PKGS[@]}") ;;
    *) echo "usage: scripts/deps.sh [--check] [--demo]" >&2; exit 2 ;;
  esac
done
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
[ -n "$check" ] && exit 1
line="apt-get install -y ${missing[*]}"
if [ "$(id -u)" -ne 0 ]; then
  echo "ferry: missing Debian packages; run as root:" >&2
  echo "  apt-get update && $line" >&2
  exit 1
fi
echo "ferry: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq && apt-get install -y -qq "${missing[@]}"
