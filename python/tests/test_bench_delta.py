"""`ferry-lab bench weights --torch --delta` (python/ferry/bench_delta.py) at
a few MB through the C launcher: every rollout parameter of both updates
(dense and delta) hash-checked against the trainers' model in every
round, the JSON keys there (the goals' figures, the cases, the machine's
memcpy rates; no timing asserted), each case's kind as the encoder's rule
gives it, and a usage error relayed as exit status 2."""

import json
import subprocess

import pytest

pytest.importorskip("torch")

from conftest import FERRY_LAB, REPO, require_ferry_lab   # noqa: E402
from test_bench_torch import RUN_S, SMALL, _env          # noqa: E402


def test_bench_delta_small():
    require_ferry_lab()
    p = subprocess.run([FERRY_LAB, "bench", "weights", "--torch", "--delta", "--json", "--fractions",
                        "0.01,0.3", *SMALL], capture_output=True, text=True, timeout=RUN_S, env=_env(), cwd=REPO)
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(p.stdout.strip().splitlines()[-1])
    assert res["hashes_ok"] is True
    # generation 1, the warm round, then real, 1 % and 30 %: two updates each, every rollout parameter
    assert res["hash_checks"] == 5 * 2 * res["rollouts"] * res["tensors"]
    for k in ("delta_speedup_1pct", "delta_speedup_min", "delta_real_fraction", "delta_real_speedup",
              "encode_ratio", "encode_gbps_solo", "encode_memcpy_gbps", "first_touch_gbps", "warm_memcpy_gbps"):
        assert k in res and res[k] > 0, (k, res.get(k))
    assert res["first"]["delta"]["kind"] == "dense_first" and res["warm"]["delta"]["kind"] == "sparse"
    cases = res["delta_cases"]
    assert list(cases) == ["real", "0.01", "0.3"]
    assert cases["0.01"]["delta"]["kind"] == ["sparse"]
    assert cases["0.3"]["delta"]["kind"] == ["dense_fraction"]
    assert 0 < cases["real"]["delta"]["changed_fraction"] < 0.05      # Adam at lr 1e-6 after bf16 rounding
    d, dense = cases["0.01"]["delta"], cases["0.01"]["dense"]
    assert 0 < d["stored_bytes"] < dense["stored_bytes"] == res["model_bytes"]
    assert d["nnz"] > 0 and d["part_bytes"] > 0 and d["chain"] >= 1
    for c in cases.values():
        assert c["speedup"] == pytest.approx(c["dense"]["s"] / c["delta"]["s"])
    assert res["delta_speedup_1pct"] == cases["0.01"]["speedup"]
    assert res["delta_speedup_min"] == min(c["speedup"] for c in cases.values())


def test_bench_delta_usage_error():
    require_ferry_lab()
    p = subprocess.run([FERRY_LAB, "bench", "weights", "--torch", "--delta", "--fractions", "2"],
                       capture_output=True, text=True, timeout=120, env=_env(), cwd=REPO)
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    assert "--fractions" in p.stderr
