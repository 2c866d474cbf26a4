"""ferry.bench_fp8: FP8 rollouts against the bf16 update of the same weights,
in one run (docs/weights.md, "FP8 rollouts"; ``ferry-lab bench weights
--torch --fp8`` and ``python3 -m ferry.bench_torch --fp8`` run it).

``python3 -m ferry.bench_torch --fp8 [--json] [--rounds 5] [--block 128,128]
[model options of ferry.bench_torch]``

The model, the layouts and the processes are ferry.bench_torch's: a
GPT-style model (332 MB in bf16 by default) held by 4 trainer processes as
FSDP dim-0 shards (``fsdp:4``, one flat bf16 buffer each) and wanted by 4
rollout processes in TP2 x DP2 (``tp:2,dp:2``). Two models are published
from the same shards (``ferry.torch.publish_module``: ``ferry_publish_shards``):
``torchbench`` in bf16 and ``tbfp8`` through a publisher with FP8 rules
(:data:`RULES`: every ``*_proj.weight``, the attention and MLP projections,
in f8e4m3 with f32 scales per ``--block``; the embeddings, lm_head, norms
and biases stay bf16, as FP8 checkpoints keep them). Each rollout holds one
torch module per model and updates it with a ``ferry.torch.Subscriber``
group (the FP8 one with ``quant=RULES``: uint8 parameters of its boxes'
FP8 bytes and float32 ``*_scale_inv`` parameters of their blocks).

Each round the trainers fill their shards with new values
(``ferry.bench_torch.fill``), then both sides run, alternating which goes
first: ``bf16`` and ``fp8``, each timed from the moment all 8 processes
left a barrier to the last rollout's end of its update (publish,
quantization included, announcement, the rollouts' wait and update).
After every run each rollout hashes each parameter (BLAKE2b of its bytes)
and the parent compares it with the hash of the same box computed here:
the bf16 values from the trainers' fill, the FP8 bytes and scales from
:func:`ref_quantize`, a numpy quantizer written from docs/weights.md's
block formula (no code of the library). The first round is reported alone
(``*_first``), the steady state is the median of the ``--rounds`` rounds
after it.

``fp8_bytes_ratio``: bytes the rollouts read from the store plus the bytes
they pushed to each other, FP8 over bf16 (steady median);
``fp8_bytes_ratio_quantized``: the same for the quantized tensors alone
(FP8 bytes and scales over their bf16 bytes); ``fp8_speedup``: bf16 time
over FP8 time. ``quant_ratio`` is ``ferry-lab bench weights
--convert-only``'s (f32 bytes quantized per second by one thread over its
memcpy), run before the cluster starts (``FERRY_LAB``, else ``ferry-lab``
next to ``FERRY_BIN``).
"""

import argparse
import hashlib
import json
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

import ferry
import ferry.torch as ft
from . import bench_torch as bt

MODEL_B, MODEL_F = "torchbench", "tbfp8"
SIDES = ("bf16", "fp8")
RULES = {"include": "*_proj.weight"}
FP8_MAX = np.float32(448.0)
AMAX_FLOOR = np.float32(1e-4)
POISON_Q = 0x55
LAB_S = 300.0       # a bound on ferry-lab --convert-only (not a measure)


# ---- the reference: docs/weights.md's block formula in numpy ---------------------------------

def _e4m3_codes(p):
    """E4M3 codes of f32 products ``p``: rounded once to the nearest value
    (ties to even), |p| beyond 448 (infinities too) saturating, NaN 0x7f,
    the sign kept (zeros included). Written from the format: a value of
    exponent e >= -6 has 3 fraction bits (spacing 2^(e-3)); below, the
    subnormals are multiples of 2^-9."""
    mag = np.minimum(np.abs(p), FP8_MAX)                 # NaN stays NaN
    finite = np.where(np.isnan(mag), np.float32(0), mag)
    _, k = np.frexp(finite)                              # finite = f * 2^k, f in [0.5, 1)
    e = np.maximum(k.astype(np.int32) - 1, -6)
    steps = np.rint(np.ldexp(finite, 3 - e))             # exact scaling; rint: ties to even
    q = np.ldexp(steps, e - 3)                           # the rounded value (may be 2^(e+1))
    _, k2 = np.frexp(q)
    e2 = k2.astype(np.int32) - 1
    normal = q >= np.float32(2.0 ** -6)
    mant = np.where(normal, np.ldexp(q, 3 - e2) - 8, 0).astype(np.int32)
    code = np.where(normal, ((e2 + 7) << 3) | mant, np.ldexp(q, 9).astype(np.int32))
    code = np.where(np.isnan(mag), 0x7f, code)
    return (code | np.where(np.signbit(p), 0x80, 0)).astype(np.uint8)


def ref_quantize(x, block):
    """(codes uint8, scales f32) of a 2-D float32 array in ``block`` blocks:
    amax = the largest finite |x| of each block (0 if none), s =
    max(amax, 1e-4) / 448 in f32, p = x * (1 / s) in f32, then the E4M3
    code of p (``_e4m3_codes``)."""
    rows, cols = x.shape
    b0, b1 = block
    nbr, nbc = -(-rows // b0), -(-cols // b1)
    pad = np.zeros((nbr * b0, nbc * b1), np.float32)
    pad[:rows, :cols] = x
    a = np.abs(pad)
    a[~np.isfinite(a)] = 0
    amax = a.reshape(nbr, b0, nbc, b1).max(axis=(1, 3))
    s = (np.maximum(amax, AMAX_FLOOR) / FP8_MAX).astype(np.float32)
    m = (np.float32(1) / s).astype(np.float32)
    p = (pad.reshape(nbr, b0, nbc, b1) * m[:, None, :, None]).astype(np.float32)
    return _e4m3_codes(p).reshape(nbr * b0, nbc * b1)[:rows, :cols], s


def digest(t):
    """BLAKE2b-128 of a tensor's or array's bytes in row-major order."""
    if isinstance(t, np.ndarray):
        raw = np.ascontiguousarray(t).reshape(-1).view(np.uint8)
    else:
        raw = t.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
    return hashlib.blake2b(raw, digest_size=16).hexdigest()


# ---- the FP8 rollout layout ---------------------------------------------------------------------

class QLayout:
    """The rollouts' quantized layout of ferry.bench_torch's model, built
    alike in every process: ``tensors`` (name, shape, dtype) with the scale
    tensors after the weights, ``dst[r]`` {tensor index: (offset, shape)},
    ``quant[i]`` the tensor's role ("weight", "scale" or None) and partner."""

    def __init__(self, L, rules):
        m = ft.build_layout(MODEL_F, L.specs, bt.DST_LAYOUT).quantize(**ferry.weights.quant_rules(rules))
        self.tensors = [(n, tuple(shape), dtype) for n, dtype, _, shape in
                        (m.tensor(i) for i in range(m.tensor_count))]
        self.names = [n for n, _, _ in self.tensors]
        self.dst = bt.Layout._boxes(m, bt.ROLLOUTS)
        self.quant = [m.tensor_quant(i) for i in range(m.tensor_count)]
        self.block = next(q["block"] for q in self.quant if q)

    def fp8_bytes(self, L):
        """(bytes the quantized tensors hold in bf16, in FP8 with their scales)."""
        src = sum(2 * bt._numel(self.tensors[i][1]) for i, q in enumerate(self.quant) if q and q["role"] == "weight")
        dst = sum(bt._numel(s) * (1 if d.startswith("f8") else 4) for (_, s, d), q in zip(self.tensors, self.quant)
                  if q)
        return src, dst


def expected(L, Q, rnd):
    """{side: hashes of every rollout parameter}, from the round's values
    rebuilt here (bf16) and the numpy reference (FP8 bytes and scales)."""
    want = {s: [[None] * len(names) for _ in range(bt.ROLLOUTS)] for s, names in (("bf16", L.names),
                                                                                    ("fp8", Q.names))}
    at = {n: i for i, n in enumerate(Q.names)}
    scale_of = {q["partner"]: i for i, q in enumerate(Q.quant) if q and q["role"] == "scale"}

    def boxes(side, boxes_of, ti, arr):
        seen = {}
        for r in range(bt.ROLLOUTS):
            box = boxes_of[r][ti]
            if box not in seen:
                seen[box] = digest(bt.box_view(arr, *box) if isinstance(arr, torch.Tensor) else
                                   arr[tuple(slice(o, o + n) for o, n in zip(*box))])
            want[side][r][ti] = seen[box]

    for ti, (name, shape) in enumerate(L.tensors):
        parts = []
        for r in range(bt.TRAINERS):
            off, shp = L.src[r][ti]
            t = torch.empty(shp, dtype=torch.bfloat16)
            bt.fill(t, rnd, r, ti)
            parts.append((off[0], t))
        full = torch.cat([t for _, t in sorted(parts, key=lambda x: x[0])])
        boxes("bf16", L.dst, ti, full)
        qi = at[name]
        if Q.quant[qi] is None:
            boxes("fp8", Q.dst, qi, full)
            continue
        codes, scales = ref_quantize(full.float().numpy(), Q.block)
        boxes("fp8", Q.dst, qi, codes)
        boxes("fp8", Q.dst, scale_of[qi], scales)
    return want


# ---- workers ----------------------------------------------------------------------------------

def _trainer(a, rank, cmd, out):
    c = bt._Ctx(a, rank)
    L = c.layout
    flat = torch.empty(L.flat_max, dtype=torch.bfloat16)
    views = L.shard_views(flat, rank)
    module = bt.module_of([(n, L.src[rank][ti][1]) for ti, n in enumerate(L.names)],
                          {n: views[ti] for ti, n in enumerate(L.names)})
    tmo = a["timeout_s"] * 1000
    pubs = {"bf16": ferry.WeightPublisher(c.store, MODEL_B, rank, bt.TRAINERS, keep=2, timeout_ms=tmo),
            "fp8": ferry.WeightPublisher(c.store, MODEL_F, rank, bt.TRAINERS, keep=2, timeout_ms=tmo,
                                         quant=a["quant"])}

    def new_round(rnd):
        for ti in range(len(L.names)):
            bt.fill(views[ti], rnd, rank, ti)
        return {}

    def run(side, gen):
        t0 = c.start()
        st = ft.publish_module(pubs[side], gen, module, layout=bt.SRC_LAYOUT, shapes=L.shapes)
        return {"t0": t0, "publish_s": time.monotonic() - t0, "cpu_s": c.cpu(), "stored_bytes": st["bytes"]}

    def warm():
        t0 = time.monotonic()
        b = sum(ft.warm_publisher(p, module, layout=bt.SRC_LAYOUT, shapes=L.shapes) for p in pubs.values())
        return {"warm_s": time.monotonic() - t0, "bytes": b}

    bt._serve(("trainer", rank), cmd, out, {"round": new_round, "run": run, "warm": warm})
    c.close()


def _rollout(a, rank, cmd, out):
    c = bt._Ctx(a, bt.TRAINERS + rank)
    L = c.layout
    Q = QLayout(L, a["quant"])
    tmo = a["timeout_s"] * 1000
    mods = {"bf16": bt.module_of([(n, L.dst[rank][ti][1]) for ti, n in enumerate(L.names)]),
            "fp8": bt.module_of([(n, Q.dst[rank][i][1]) for i, n in enumerate(Q.names)],
                                {n: (ft.fp8_empty(Q.dst[rank][i][1]) if d.startswith("f8") else
                                     torch.zeros(Q.dst[rank][i][1], dtype=ft.torch_dtype(d)))
                                 for i, (n, _, d) in enumerate(Q.tensors)})}
    subs = {"bf16": ft.Subscriber(c.store, MODEL_B, mods["bf16"], bt.DST_LAYOUT, rank, group="bench-bf16",
                                  tensors=L.specs, timeout_ms=tmo),
            "fp8": ft.Subscriber(c.store, MODEL_F, mods["fp8"], bt.DST_LAYOUT, rank, group="bench-fp8",
                                 tensors=L.specs, timeout_ms=tmo, quant=a["quant"])}

    def run(side, gen):
        model = MODEL_B if side == "bf16" else MODEL_F
        named = dict(mods[side].named_parameters())     # a module's order puts each scale beside its weight
        params = [named[n] for n in (L.names if side == "bf16" else Q.names)]
        for p in params:
            p.data.fill_(POISON_Q if p.dtype == torch.uint8 else bt.POISON)
        t0 = c.start()
        ferry.weights.wait_active(c.store, model, gen, tmo)
        t1 = time.monotonic()
        st = subs[side].update()
        if st["generation"] != gen:
            raise RuntimeError(f"{side}: the update took generation {st['generation']}, not {gen}")
        t2 = time.monotonic()
        return {"t0": t0, "t1": t2, "wait_s": t1 - t0, "update_s": t2 - t1, "bytes_read": st["bytes_read"],
                "bytes_pushed": st["bytes_pushed"], "params": [digest(p) for p in params],
                "phases": {k: v for k, v in st.items() if k.endswith("_s") and isinstance(v, float)}}

    def warm():
        t0 = time.monotonic()
        b = subs["bf16"].warm() + subs["fp8"].warm()
        return {"warm_s": time.monotonic() - t0, "bytes": b}

    bt._serve(("rollout", rank), cmd, out, {"run": run, "warm": warm})
    for s in subs.values():
        s.close()
    c.close()


# ---- the parent -------------------------------------------------------------------------------

def quant_bench():
    """``ferry-lab bench weights --convert-only --json``'s result (quant_ratio
    and the rest): one thread, 256 MiB, nothing else of this benchmark
    running."""
    lab = os.environ.get("FERRY_LAB") or os.path.join(os.path.dirname(os.path.abspath(bt._ferry_bin())),
                                                      "ferry-lab")
    try:
        p = subprocess.run([lab, "bench", "weights", "--convert-only", "--json"], capture_output=True, text=True,
                           timeout=LAB_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RuntimeError(f"quant_ratio: cannot run {lab} bench weights --convert-only ({e}); set FERRY_LAB")
    if p.returncode != 0:
        raise RuntimeError(f"quant_ratio: {lab} bench weights --convert-only exited {p.returncode}: "
                           f"{p.stderr.strip()[-500:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def _check(L, Q, side, rnd, got, want):
    names = L.names if side == "bf16" else Q.names
    for (kind, r), v in sorted(got.items()):
        if kind != "rollout":
            continue
        bad = [names[i] for i, h in enumerate(v["params"]) if h != want[side][r][i]]
        if bad:
            raise RuntimeError(f"{side}, round {rnd}: rollout {r}'s {bad[:3]} do not hash equal to the reference")
    return sum(len(want[side][r]) for r in range(bt.ROLLOUTS))


def run(cfg, opts, log=None):
    log = log or (lambda s: None)
    quant = dict(RULES, block=tuple(opts["block"]))
    L = bt.Layout(cfg)
    Q = QLayout(L, quant)
    model_bytes = 2 * L.params
    load0 = os.getloadavg()
    touch = bt.first_touch_gbps()
    warm = bt.warm_memcpy_gbps()
    qb = quant_bench()
    log(f"first touch {touch:.3f} GB/s, warm memcpy {warm:.3f} GB/s; quant_ratio {qb['quant_ratio']:.3f} "
        f"(bf16 {qb['quant_ratio_bf16']:.3f})")
    tmp = tempfile.mkdtemp(prefix="ferry-bench-fp8-")
    cluster, job = None, None
    try:
        cluster = bt.Cluster(tmp, 4 * model_bytes + (256 << 20))
        a = {"cfg": cfg, "addr": cluster.addr, "token_file": cluster.token_file, "shm_dir": tmp,
             "pg_file": os.path.join(tmp, "pg"), "timeout_s": int(opts["timeout_s"]), "quant": quant}
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["torch", "torch.distributed", "ferry", "ferry.torch", __name__])
        job = bt.Job(ctx, a)
        trainers = [("trainer", r) for r in range(bt.TRAINERS)]
        rollouts = [("rollout", r) for r in range(bt.ROLLOUTS)]
        for r in range(bt.TRAINERS):
            job.start(trainers[r], _trainer, r)
        for r in range(bt.ROLLOUTS):
            job.start(rollouts[r], _rollout, r)
        job.ask(trainers + rollouts, "warm")
        rows, checks, gens = [], 0, {s: 0 for s in SIDES}
        for rnd in range(1, opts["rounds"] + 2):
            job.ask(trainers, "round", rnd)
            want = expected(L, Q, rnd)
            row = {}
            for side in (SIDES if rnd % 2 else SIDES[::-1]):
                gens[side] += 1
                got = job.ask(trainers + rollouts, "run", side, gens[side])
                checks += _check(L, Q, side, rnd, got, want)
                tr = [v for w, v in got.items() if w[0] == "trainer"]
                ro = [v for w, v in got.items() if w[0] == "rollout"]
                row[side] = {"s": max(v["t1"] for v in ro) - min(v["t0"] for v in got.values()),
                             "publish_s": max(v["publish_s"] for v in tr),
                             "update_s": max(v["update_s"] for v in ro),
                             "stored_bytes": sum(v["stored_bytes"] for v in tr),
                             "read_bytes": sum(v["bytes_read"] for v in ro),
                             "pushed_bytes": sum(v["bytes_pushed"] for v in ro),
                             "cpu_s": sum(v["cpu_s"] for v in tr)}
                for k in ro[0]["phases"]:        # the update's own phases, the slowest rollout's
                    row[side]["update." + k] = max(v["phases"].get(k, 0.0) for v in ro)
            b, f = row["bf16"], row["fp8"]
            log(f"round {rnd}{' (first)' if rnd == 1 else ''}: bf16 {b['s']:.3f} s (publish {b['publish_s']:.3f}, "
                f"update {b['update_s']:.3f}; read {b['read_bytes']}, pushed {b['pushed_bytes']}), fp8 "
                f"{f['s']:.3f} s (publish {f['publish_s']:.3f}, update {f['update_s']:.3f}; read {f['read_bytes']}, "
                f"pushed {f['pushed_bytes']}): {b['s'] / f['s']:.2f}x")
            rows.append(row)
    finally:
        if job is not None:
            job.stop()
        if cluster is not None:
            cluster.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    def moved(r, side):
        return r[side]["read_bytes"] + r[side]["pushed_bytes"]

    steady = rows[1:]
    res = {"params": L.params, "model_bytes": model_bytes, "tensors": len(L.names), "trainers": bt.TRAINERS,
           "rollouts": bt.ROLLOUTS, "src_layout": bt.SRC_LAYOUT, "dst_layout": bt.DST_LAYOUT, "config": cfg,
           "rounds": opts["rounds"], "quant": {k: list(v) if isinstance(v, tuple) else v for k, v in quant.items()},
           "fp8_tensors": sum(1 for q in Q.quant if q and q["role"] == "weight"),
           "first_touch_gbps": touch, "warm_memcpy_gbps": warm, "first": rows[0], "steady": {}}
    for side in SIDES:
        res["steady"][side] = {k: statistics.median(r[side][k] for r in steady) for k in rows[0][side]}
    src, dst = Q.fp8_bytes(L)
    res["fp8_bytes_ratio"] = statistics.median(moved(r, "fp8") / moved(r, "bf16") for r in steady)
    res["fp8_bytes_ratio_first"] = moved(rows[0], "fp8") / moved(rows[0], "bf16")
    res["fp8_bytes_ratio_quantized"] = dst / src
    res["fp8_stored_ratio"] = res["steady"]["fp8"]["stored_bytes"] / res["steady"]["bf16"]["stored_bytes"]
    res["fp8_speedup"] = res["steady"]["bf16"]["s"] / res["steady"]["fp8"]["s"]
    res["fp8_speedup_first"] = rows[0]["bf16"]["s"] / rows[0]["fp8"]["s"]
    for k in ("quant_ratio", "quant_ratio_bf16", "quant_gbps", "quant_bf16_gbps", "memcpy_gbps"):
        res[k] = qb[k]
    res["hashes_ok"] = True
    res["hash_checks"] = checks
    res["rounds_s"] = {side: [r[side]["s"] for r in rows] for side in SIDES}
    res["loadavg_start"], res["loadavg_end"] = list(load0), list(os.getloadavg())
    return res


def human(res):
    b, f = res["steady"]["bf16"], res["steady"]["fp8"]
    return "\n".join([
        f"fp8 bench: {res['params'] / 1e6:.1f}M params ({res['model_bytes'] / 1e6:.0f} MB bf16, {res['fp8_tensors']} "
        f"of {res['tensors']} tensors FP8 in {res['quant']['block'][0]} x {res['quant']['block'][1]} blocks), "
        f"{res['trainers']} trainers {res['src_layout']} -> {res['rollouts']} rollouts {res['dst_layout']}; first touch "
        f"{res['first_touch_gbps']:.2f} GB/s, warm memcpy {res['warm_memcpy_gbps']:.2f} GB/s",
        f"  first round: bf16 {res['first']['bf16']['s']:.3f} s, fp8 {res['first']['fp8']['s']:.3f} s "
        f"(fp8_speedup_first {res['fp8_speedup_first']:.2f})",
        f"  steady state, median of {res['rounds']}: bf16 {b['s']:.3f} s (publish {b['publish_s']:.3f}, update "
        f"{b['update_s']:.3f}), fp8 {f['s']:.3f} s (publish {f['publish_s']:.3f}, update {f['update_s']:.3f}); "
        f"fp8_speedup {res['fp8_speedup']:.2f}",
        f"  fp8_bytes_ratio {res['fp8_bytes_ratio']:.3f} (read + pushed; the quantized tensors alone "
        f"{res['fp8_bytes_ratio_quantized']:.3f}), quant_ratio {res['quant_ratio']:.3f}; {res['hash_checks']} "
        f"parameter hashes equal to the reference"])


def _block(x):
    try:
        b = tuple(int(v) for v in x.split(","))
    except ValueError:
        b = ()
    if len(b) != 2 or min(b) < 1:
        raise argparse.ArgumentTypeError(f"wants ROWS,COLS (two whole numbers of at least 1), not {x!r}")
    return b


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m ferry.bench_torch --fp8",
                                 description="FP8 rollouts: 4 FSDP bf16 torch trainers publish with FP8 rules "
                                             "(quantized once, before the network) into 4 TP2xDP2 rollouts "
                                             "holding FP8 weights and block scales, against the bf16 update of "
                                             "the same weights.",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--rounds", type=bt._positive, default=5,
                    help="steady-state rounds after the first one (their median)")
    ap.add_argument("--block", type=_block, default=(128, 128), help="FP8 blocks, ROWS,COLS")
    ap.add_argument("--hidden", type=bt._positive, help="the model's width", default=1024)
    ap.add_argument("--layers", type=bt._positive, help="transformer blocks", default=8)
    ap.add_argument("--ffn", type=bt._positive, help="the MLP's inner width", default=4096)
    ap.add_argument("--vocab", type=bt._positive, help="vocabulary size", default=15000)
    ap.add_argument("--ctx", type=bt._positive, help="context length (position embeddings)", default=1024)
    ap.add_argument("--timeout", type=bt._positive, default=600, help="seconds any one step may take")
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    ap.add_argument("--quiet", action="store_true", help="no per-round lines on stderr")
    o = ap.parse_args(argv)
    cfg = {"hidden": o.hidden, "layers": o.layers, "ffn": o.ffn, "vocab": o.vocab, "ctx": o.ctx}
    for k in ("hidden", "ffn", "vocab", "ctx"):
        if cfg[k] % (bt.TRAINERS * 2):
            ap.error(f"--{k} must be a multiple of {bt.TRAINERS * 2} (FSDP4 and TP2 cut it evenly), not {cfg[k]}")
    for k in ("hidden", "ffn"):   # TP2 shards of the projections must hold whole blocks
        if (cfg[k] // 2) % o.block[0] or (cfg[k] // 2) % o.block[1]:
            ap.error(f"--block {o.block[0]},{o.block[1]}: TP2 cuts --{k} {cfg[k]} at {cfg[k] // 2}, inside a block "
                     f"(a rollout shard must hold whole blocks)")
    opts = {"rounds": o.rounds, "block": o.block, "timeout_s": o.timeout}
    log = None if o.quiet else (lambda s: print("ferry.bench_fp8: " + s, file=sys.stderr, flush=True))
    try:
        res = run(cfg, opts, log)
    except (RuntimeError, TimeoutError, OSError, ferry.Error) as e:
        print(f"ferry.bench_fp8: {e}", file=sys.stderr)
        return 1
    print(json.dumps(res) if o.json else human(res), flush=True)
    return 0
