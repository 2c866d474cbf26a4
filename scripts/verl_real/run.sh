#!/usr/bin/env bash
# ferry's verl adapter under verl's own checkpoint-engine package
# (docs/adapters.md, "Run under verl's own code"). Usage:
#   scripts/verl_real/run.sh VERL_DIR [STEPS]
# VERL_DIR: a checkout of verl-project/verl (the directory holding verl/);
# its checkpoint_engine, single_controller and utils run unmodified. Ray,
# the inference server, the trainer's model engine and config objects are
# stood in (fakeray/, roles.py); packages verl imports but this path never
# uses are empty modules (FAKE_RAY_STUBS), and Debian's torch 1.13 gets
# init_process_group(timeout=None) as torch 2 takes it. Needs Debian's
# python3-torch and a built tree (make). Starts and stops its own cluster.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
verl=${1:?usage: $0 VERL_DIR [STEPS]}
steps=${2:-10}
tmp=$(mktemp -d /tmp/ferry-verl-XXXXXX)
trap '"$root/build/ferry" down --dir "$tmp/cluster" >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
"$root/build/ferry" up --dir "$tmp/cluster" --size 256M --detach >/dev/null
export FERRY_MASTER=$(cat "$tmp/cluster/master.addr") FERRY_TOKEN_FILE="$tmp/cluster/token"
export VERL_RUN_OUT="$tmp/out" STEPS="$steps" FAKE_RAY_TORCH_COMPAT=1
export FAKE_RAY_STUBS=tensordict,transformers,omegaconf,codetiming,orjson,torch.distributed.device_mesh,torch.distributed.fsdp,pydantic,uvicorn,fastapi
export PYTHONPATH="$here/fakeray:$verl:$root/build/python:$here"
cd "$here"
/usr/bin/python3 run_verl.py
