"""`ferry bench weights --torch` (python/ferry/bench_torch.py) at a few MB:
one round of all three variants through the C launcher, every rollout
parameter hash-checked against the trainers' model, the JSON keys there
(no timing asserted), and a usage error relayed as exit status 2."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

from conftest import FERRY_BIN, REPO, require_ferry_bin   # noqa: E402

RUN_S = 900       # deadline for the whole run on a loaded machine (a bound, not a measure)
SMALL = ["--hidden", "128", "--layers", "2", "--ffn", "512", "--vocab", "4096", "--ctx", "64"]   # 1.6 M params


def _env():
    env = dict(os.environ)
    env["FERRY_PYTHON"] = sys.executable        # the interpreter running the tests has torch
    pp = os.path.join(os.path.dirname(os.path.abspath(FERRY_BIN)), "python")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pp, env.get("PYTHONPATH")) if p)
    return env


def test_bench_torch_small():
    require_ferry_bin()
    p = subprocess.run([FERRY_BIN, "bench", "weights", "--torch", "--json", "--rounds", "1", "--warmup", "0",
                        *SMALL], capture_output=True, text=True, timeout=RUN_S, env=_env(), cwd=REPO)
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(p.stdout.strip().splitlines()[-1])
    for k in ("torch_save_s", "gloo_bcast_s", "ferry_shard_s", "speedup_vs_torch_save", "speedup_vs_gloo"):
        assert k in res and res[k] > 0, (k, res.get(k))
    assert res["hashes_ok"] is True
    # every parameter of every rollout, once per variant
    assert res["hash_checks"] == 3 * res["rollouts"] * res["tensors"]
    assert res["trainers"] == 4 and res["rollouts"] == 4
    assert res["src_layout"] == "fsdp:4" and res["dst_layout"] == "tp:2,dp:2"
    assert res["model_bytes"] == 2 * res["params"]
    assert all(len(res["rounds_s"][v]) == 1 for v in ("torch_save", "gloo_bcast", "ferry_shard"))
    # the per-variant lines on stderr name each variant of the round
    for v in ("torch_save", "gloo_bcast", "ferry_shard"):
        assert f"round 1: {v}" in p.stderr, p.stderr[-3000:]


def test_bench_torch_usage_error():
    require_ferry_bin()
    p = subprocess.run([FERRY_BIN, "bench", "weights", "--torch", "--rounds", "0"], capture_output=True, text=True,
                       timeout=RUN_S, env=_env(), cwd=REPO)
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    assert "--rounds" in p.stderr and "at least 1" in p.stderr, p.stderr[-2000:]
    assert p.stdout == ""
