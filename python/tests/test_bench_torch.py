"""`ferry-lab bench weights --torch` (python/ferry/bench_torch.py) at a few MB:
the first round and one steady-state round of all four variants through
the C launcher, every rollout parameter hash-checked against the trainers'
model (p2p's too), the JSON keys there (first/steady split, faults, the
machine's memcpy rates; no timing asserted), the p2p schedule covering
every rollout element exactly once, and a usage error relayed as exit
status 2."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

from conftest import FERRY_BIN, FERRY_LAB, REPO, require_ferry_lab   # noqa: E402

RUN_S = 900       # deadline for the whole run on a loaded machine (a bound, not a measure)
SMALL = ["--hidden", "128", "--layers", "2", "--ffn", "512", "--vocab", "4096", "--ctx", "64"]   # 1.6 M params


def _env():
    env = dict(os.environ)
    env["FERRY_PYTHON"] = sys.executable        # the interpreter running the tests has torch
    pp = os.path.join(os.path.dirname(os.path.abspath(FERRY_BIN)), "python")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pp, env.get("PYTHONPATH")) if p)
    return env


VARIANTS = ("torch_save", "gloo_bcast", "p2p", "ferry_shard", "ferry_overlap")


def test_bench_torch_small():
    require_ferry_lab()
    p = subprocess.run([FERRY_LAB, "bench", "weights", "--torch", "--json", "--rounds", "1", *SMALL],
                       capture_output=True, text=True, timeout=RUN_S, env=_env(), cwd=REPO)
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(p.stdout.strip().splitlines()[-1])
    for v in VARIANTS:
        for k in (v + "_s", v + "_first_s", v + "_max_s"):
            assert k in res and res[k] > 0, (k, res.get(k))
        assert res[v + "_max_s"] >= res[v + "_s"]
    for k in ("speedup_vs_torch_save", "speedup_vs_gloo", "speedup_vs_p2p", "first_touch_gbps",
              "warm_memcpy_gbps"):
        assert k in res and res[k] > 0, (k, res.get(k))
    assert isinstance(res["timing_rule"], str) and all(v in res["timing_rule"] for v in VARIANTS)
    assert res["hashes_ok"] is True
    # every parameter of every rollout, once per variant (p2p included) and round (the first and one steady)
    assert res["rounds"] == 1 and res["warmup"] == 0
    assert res["hash_checks"] == len(VARIANTS) * 2 * res["rollouts"] * res["tensors"]
    assert res["trainers"] == 4 and res["rollouts"] == 4
    assert res["src_layout"] == "fsdp:4" and res["dst_layout"] == "tp:2,dp:2"
    assert res["model_bytes"] == 2 * res["params"]
    # rounds_s: the first round at [0], then the steady ones
    for v in VARIANTS:
        assert len(res["rounds_s"][v]) == 2
        assert res["rounds_s"][v][0] == res[v + "_first_s"]
        assert res["rounds_s"][v][1] == res[v + "_s"] == res[v + "_max_s"]
        assert set(res["phases_s"][v]) == set(res["phases_first_s"][v]) >= {"cpu_s", "cluster_cpu_s"}
        for d in (res["faults"][v], res["faults_first"][v]):
            assert set(d) == {"trainers", "rollouts", "cluster"} and all(x >= 0 for x in d.values()), d
    assert {"stage_s", "send_s", "recv_s"} <= set(res["phases_s"]["p2p"])
    assert res["faults_per_update"] == res["faults"]["ferry_shard"]["rollouts"]
    # the overlapped group: its first update is a plain one, the steady round overlapped
    assert res["overlapped_rounds"] == 1
    assert res["phases_first_s"]["ferry_overlap"]["overlapped"] == 0.0
    assert res["overlap_s"] == res["ferry_overlap_s"]
    assert res["overlap_ratio"] == pytest.approx(res["ferry_overlap_s"] / res["ferry_shard_s"])
    ov = res["phases_s"]["ferry_overlap"]
    assert res["cpus"] >= 1 and res["overlap_cpu_floor_ratio"] == pytest.approx(
        (ov["cpu_s"] + ov["cluster_cpu_s"]) / res["cpus"] / res["ferry_shard_s"])
    assert res["overlap_speedup_vs_p2p"] == pytest.approx(res["p2p_s"] / res["ferry_overlap_s"])
    # the rollouts' boxes: DP2 copies of the model, plus the whole tensors every TP rank holds
    assert res["pages_written"] == res["rollout_bytes"] // 4096
    assert 2 * res["model_bytes"] <= res["rollout_bytes"] < 4 * res["model_bytes"]
    plan = res["p2p_plan"]
    assert plan["bytes"] == res["rollout_bytes"] and plan["messages"] > 0
    assert plan["staged_send_buffers"] > 0 and plan["staged_recv_buffers"] == 0
    # the per-variant lines on stderr name each variant of each round
    for v in VARIANTS:
        assert f"round 1 (first): {v}" in p.stderr, p.stderr[-3000:]
        assert f"round 2: {v}" in p.stderr, p.stderr[-3000:]


def test_p2p_plan_covers_every_rollout_element_once():
    import torch
    from ferry import bench_torch as bt
    cfg = {"hidden": 64, "layers": 1, "ffn": 128, "vocab": 256, "ctx": 32}
    L = bt.Layout(cfg)
    plan = bt.p2p_plan(L)
    seen = {}
    for r, q, ti, lo, hi in plan:
        assert (r, q, ti) not in seen, "one piece per trainer, rollout and tensor"
        seen[(r, q, ti)] = (lo, hi)
        poff, pshp = L.src[r][ti]
        assert poff[0] <= lo < hi <= poff[0] + pshp[0]
    for q in range(bt.ROLLOUTS):
        for ti, (name, shape) in enumerate(L.tensors):
            off, shp = L.dst[q][ti]
            cover = torch.zeros(shp[0], dtype=torch.int32)
            for r in range(bt.TRAINERS):
                if (r, q, ti) in seen:
                    lo, hi = seen[(r, q, ti)]
                    cover[lo - off[0]:hi - off[0]] += 1
            assert bool((cover == 1).all()), (name, q, cover.tolist())


@pytest.mark.parametrize("args, names", [
    (["--rounds", "0"], ["--rounds", "at least 1"]),
    (["--warmup", "-1"], ["--warmup", "at least 0"]),
    (["--variants", "p2p,nccl"], ["--variants", "nccl", "p2p"]),
])
def test_bench_torch_usage_error(args, names):
    require_ferry_lab()
    p = subprocess.run([FERRY_LAB, "bench", "weights", "--torch", *args], capture_output=True, text=True,
                       timeout=RUN_S, env=_env(), cwd=REPO)
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    assert all(n in p.stderr for n in names), p.stderr[-2000:]
    assert p.stdout == ""
