"""`ferry-lab bench weights --torch --fp8` (python/ferry/bench_fp8.py) at a
few MB: the first round and one steady-state round of bf16 and FP8
rollouts through the C launcher, every rollout parameter (FP8 bytes and
scales included) hash-checked against the numpy reference, the JSON keys
of issue 31 item 6 (no timing asserted), the bytes each side stores and
reads computed here from the shapes, and usage errors relayed as exit
status 2. The bench's numpy reference itself is checked against the
tests' (fp8_ref.py) on special values."""

import json
import subprocess

import numpy as np
import pytest

pytest.importorskip("torch")

from conftest import FERRY_LAB, REPO, require_ferry_lab   # noqa: E402
from fp8_ref import ref_fp8_blocks                        # noqa: E402
from test_bench_torch import RUN_S, SMALL, _env           # noqa: E402

BLOCK = 64    # FSDP4 cuts the 128-row projections at 32 rows (inside blocks); TP2 at 64 (whole)


def _bytes(cfg, block):
    """(bf16 bytes of the model, its bytes with every *_proj.weight in FP8 plus f32 scales)."""
    from ferry import bench_torch as bt
    bf16 = fp8 = 0
    for name, shape in bt.tensors_of(cfg):
        n = int(np.prod(shape))
        bf16 += 2 * n
        if name.endswith("_proj.weight"):
            fp8 += n + 4 * (-(-shape[0] // block)) * (-(-shape[1] // block))
        else:
            fp8 += 2 * n
    return bf16, fp8


def test_bench_fp8_small():
    require_ferry_lab()
    p = subprocess.run([FERRY_LAB, "bench", "weights", "--torch", "--fp8", "--json", "--rounds", "1",
                        "--block", f"{BLOCK},{BLOCK}", *SMALL], capture_output=True, text=True, timeout=RUN_S,
                       env=_env(), cwd=REPO)
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(p.stdout.strip().splitlines()[-1])
    assert res["hashes_ok"] is True
    fp8_tensors = res["fp8_tensors"]
    assert fp8_tensors == 7 * res["config"]["layers"]          # q, k, v, o, gate, up, down per block
    # every parameter of every rollout, both sides, both rounds: bf16 tensors, FP8 ones and their scales
    assert res["hash_checks"] == 2 * res["rollouts"] * (2 * res["tensors"] + fp8_tensors)
    bf16, fp8 = _bytes(res["config"], BLOCK)
    assert res["model_bytes"] == bf16
    for row in (res["first"], res["steady"]):
        assert row["bf16"]["stored_bytes"] == bf16 and row["fp8"]["stored_bytes"] == fp8
        for side in ("bf16", "fp8"):      # single-pull: the group reads each stored byte once
            assert row[side]["read_bytes"] == row[side]["stored_bytes"], (side, row[side])
            assert row[side]["pushed_bytes"] > 0 and row[side]["s"] > 0
    assert res["fp8_stored_ratio"] == pytest.approx(fp8 / bf16)
    assert 0 < res["fp8_bytes_ratio"] < 1 and 0 < res["fp8_bytes_ratio_first"] < 1
    from ferry import bench_torch as bt
    q = sum(int(np.prod(s)) for n, s in bt.tensors_of(res["config"]) if n.endswith("_proj.weight"))
    assert res["fp8_bytes_ratio_quantized"] == pytest.approx((q + 4 * q // BLOCK ** 2) / (2 * q))
    for k in ("fp8_speedup", "fp8_speedup_first", "quant_ratio", "quant_ratio_bf16", "first_touch_gbps",
              "warm_memcpy_gbps"):
        assert res[k] > 0, (k, res.get(k))
    assert len(res["rounds_s"]["fp8"]) == len(res["rounds_s"]["bf16"]) == 2
    assert "round 1 (first): bf16" in p.stderr and "round 2: bf16" in p.stderr, p.stderr[-3000:]


def test_bench_fp8_reference_matches_the_tests():
    from ferry import bench_fp8
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((80, 70)) * np.exp2(rng.integers(-30, 30, size=(80, 1)))).astype(np.float32)
    x[:16, :16] = 0
    x[16:32, 16:32] = -0.0
    x[3, 20], x[40, 41], x[41, 40], x[70, 3] = np.nan, np.inf, -np.inf, -np.nan
    x[50, 50] = 1e-30                       # an f32 far below every FP8 subnormal after scaling
    for block in ((16, 16), (32, 8), (128, 128)):
        got, want = bench_fp8.ref_quantize(x, block), ref_fp8_blocks(x, block)
        assert np.array_equal(got[0], want[0]), block
        assert np.array_equal(got[1].view(np.uint32), want[1].view(np.uint32)), block


@pytest.mark.parametrize("args, names", [
    (["--block", "48,48"], ["--block 48,48", "inside a block"]),
    (["--block", "64"], ["--block", "ROWS,COLS"]),
])
def test_bench_fp8_usage_error(args, names):
    require_ferry_lab()
    p = subprocess.run([FERRY_LAB, "bench", "weights", "--torch", "--fp8", *args, *SMALL], capture_output=True,
                       text=True, timeout=RUN_S, env=_env(), cwd=REPO)
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    assert all(n in p.stderr for n in names), p.stderr[-2000:]
