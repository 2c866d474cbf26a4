"""ferry.bench_delta: deltas from a torch trainer against the dense shard
update of the same weights, in one run (docs/sparse.md, "Deltas from a
trainer"; ``ferry-lab bench weights --torch --delta`` and
``python3 -m ferry.bench_torch --delta`` run it).

``python3 -m ferry.bench_torch --delta [--json] [--rounds 1]
[--fractions 0.005,0.01,0.05,0.2,0.5] [--real-steps 2] [--lr 1e-6]
[--crossover 0.05] [--max-chain 8] [model options of ferry.bench_torch]``

The model, the layouts and the processes are ferry.bench_torch's: a
GPT-style model (332 MB in bf16 by default) held by 4 trainer processes as
FSDP dim-0 shards (``fsdp:4``, one flat bf16 buffer each) and wanted by 4
rollout processes in TP2 x DP2 (``tp:2,dp:2``). Two models are published
side by side from the same shards: ``torchbench`` dense
(``ferry.torch.publish_module``: ``ferry_publish_shards``) and ``tbdelta``
through a ``ferry.sparse.DeltaEncoder`` per trainer
(``ferry.torch.publish_delta``); each rollout holds one torch module per
model and updates it with a ``ferry.torch.Subscriber`` (a single-pull group
for dense generations; a sparse one follows the chain).

Cases, each ``--rounds`` rounds: ``real`` — ``--real-steps`` steps of
``torch.optim.Adam`` (lr ``--lr``, default 1e-6, a typical RL learning
rate) on every trainer's f32 master copy of its shards with a synthetic
gradient (normal, per rank and round), the bf16 shards then the master's
rounding: the changed fraction is what Adam's step leaves after bf16
rounding; then every ``--fractions`` value — that fraction of each shard's
elements (a random mask) takes new random values. In every round both
variants run (alternating which goes first): ``dense`` (publish_module +
every rollout's update) and ``delta`` (publish_delta + every rollout's
update); the time of each is from the moment all 8 processes left a
barrier to the last rollout's end. After every run each rollout hashes
each parameter (BLAKE2b) and the parent compares it with the hash of the
same box of the full model it rebuilt by running the trainers' steps
itself.

Before the cases one round publishes generation 1 of both models (the
encoders' first publish is dense) and one synthetic 1 % round is not
counted (``warm``): the first sparse generation's objects land on fresh
pages. ``encode_ratio`` comes from a solo run after the cases (nothing
else running): one encoder over one trainer's shards (model ``tbsolo``),
its 1 % delta's ``encode_gbps`` against a single-thread memcpy measured
just before it.
"""

import argparse
import json
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import time

import torch

import ferry
import ferry.torch as ft
from . import bench_torch as bt

MODEL_S, MODEL_D, MODEL_SOLO = "torchbench", "tbdelta", "tbsolo"
FRACTIONS = (0.005, 0.01, 0.05, 0.2, 0.5)
SIDES = ("dense", "delta")


# ---- the trainers' values, computed alike by the trainers and the parent -------------------

class Shard:
    """A trainer's flat bf16 shard buffer, its f32 master copy and the
    master's Adam optimizer (made at the first real step)."""

    def __init__(self, L, rank):
        self.rank = rank
        self.flat = torch.empty(L.flat[rank], dtype=torch.bfloat16)
        for ti, v in L.shard_views(self.flat, rank).items():
            bt.fill(v, 0, rank, ti)
        self.master = torch.nn.Parameter(self.flat.float(), requires_grad=True)
        self.opt = None

    def real(self, rnd, steps, lr):
        if self.opt is None:
            self.opt = torch.optim.Adam([self.master], lr=lr)
        for k in range(steps):
            g = torch.Generator().manual_seed(rnd * 7919 + k * 104729 + self.rank)
            self.master.grad = torch.randn(self.master.shape, generator=g)
            self.opt.step()
        self.master.grad = None
        with torch.no_grad():
            self.flat.copy_(self.master)

    def frac(self, rnd, f):
        g = torch.Generator().manual_seed(rnd * 1_000_003 + self.rank * 10_007 + 17)
        mask = torch.rand(self.flat.shape, generator=g) < f
        new = torch.randn(int(mask.sum()), generator=g).mul_(0.02).to(torch.bfloat16)
        self.flat[mask] = new
        with torch.no_grad():
            self.master[mask] = new.float()

    def step(self, rnd, case, a):
        if case == "real":
            self.real(rnd, a["real_steps"], a["lr"])
        else:
            self.frac(rnd, float(case))


def expected(L, shards):
    """Hashes of every rollout parameter from the four shards' values."""
    params = [[None] * len(L.names) for _ in range(bt.ROLLOUTS)]
    views = [L.shard_views(s.flat, s.rank) for s in shards]
    for ti in range(len(L.names)):
        full = torch.cat([views[r][ti] for r in sorted(range(bt.TRAINERS), key=lambda r: L.src[r][ti][0][0])])
        seen = {}
        for q in range(bt.ROLLOUTS):
            box = L.dst[q][ti]
            if box not in seen:
                seen[box] = bt.digest(bt.box_view(full, *box))
            params[q][ti] = seen[box]
    return params


# ---- workers ----------------------------------------------------------------------------------

def _trainer(a, rank, cmd, out):
    c = bt._Ctx(a, rank)
    L = c.layout
    sh = Shard(L, rank)
    views = L.shard_views(sh.flat, rank)
    module = bt.module_of([(n, L.src[rank][ti][1]) for ti, n in enumerate(L.names)],
                          {n: views[ti] for ti, n in enumerate(L.names)})
    tmo = a["timeout_s"] * 1000
    pub_s = ferry.WeightPublisher(c.store, MODEL_S, rank, bt.TRAINERS, keep=2, timeout_ms=tmo)
    pub_d = ferry.WeightPublisher(c.store, MODEL_D, rank, bt.TRAINERS, keep=2, timeout_ms=tmo)
    enc = ferry.sparse.DeltaEncoder(pub_d, crossover=a["crossover"], max_chain=a["max_chain"])

    def step(rnd, case):
        sh.step(rnd, case, a)
        return {}

    def run(side, gen):
        t0 = c.start()
        if side == "dense":
            st = ft.publish_module(pub_s, gen, module, layout=bt.SRC_LAYOUT, shapes=L.shapes)
            st = {"stored_bytes": st["bytes"], "kind": "dense"}
        else:
            st = ft.publish_delta(enc, gen, module, bt.SRC_LAYOUT, shapes=L.shapes)
            st = {k: v for k, v in st.items() if k != "dense"}
        return {"t0": t0, "publish_s": time.monotonic() - t0, "cpu_s": c.cpu(), "stats": st}

    def warm():
        t0 = time.monotonic()
        b = ft.warm_publisher(pub_s, module, layout=bt.SRC_LAYOUT, shapes=L.shapes)
        return {"warm_s": time.monotonic() - t0, "bytes": b}

    bt._serve(("trainer", rank), cmd, out, {"step": step, "run": run, "warm": warm})
    enc.close()
    c.close()


def _rollout(a, rank, cmd, out):
    c = bt._Ctx(a, bt.TRAINERS + rank)
    L = c.layout
    mine = L.dst[rank]
    tmo = a["timeout_s"] * 1000
    mods, subs = {}, {}
    for side, model in (("dense", MODEL_S), ("delta", MODEL_D)):
        mods[side] = bt.module_of([(n, mine[ti][1]) for ti, n in enumerate(L.names)])
        subs[side] = ft.Subscriber(c.store, model, mods[side], bt.DST_LAYOUT, rank, group="bench-" + side,
                                   tensors=L.specs, timeout_ms=tmo)

    def wait_active(w, model, gen):
        deadline = time.monotonic() + a["timeout_s"]
        act = ferry.weights.active(c.store, model)
        while act is None or act[0] < gen:
            ev = w.next(timeout_ms=max(1, int((deadline - time.monotonic()) * 1000)))
            if ev is None:
                raise TimeoutError(f"generation {gen} of {model} was not announced within {a['timeout_s']} s")
            if ev[2]:
                act = (int(ev[2].split()[0]), None)

    def run(side, gen):
        model = MODEL_S if side == "dense" else MODEL_D
        params = [p for _, p in mods[side].named_parameters()]
        with c.store.watch(f"ferry/wk/{model}/active") as w:
            t0 = c.start()
            wait_active(w, model, gen)
        t1 = time.monotonic()
        st = subs[side].update()
        if st["generation"] != gen:
            raise RuntimeError(f"{side}: the update took generation {st['generation']}, not {gen}")
        t2 = time.monotonic()
        phases = {k: v for k, v in st.items() if k.endswith("_s") and isinstance(v, float)}
        if isinstance(st.get("read"), dict):
            phases.update({"read." + k: v for k, v in st["read"].items() if k.endswith("_s")})
        return {"t0": t0, "t1": t2, "update_s": t2 - t1, "bytes_read": st.get("bytes_read", 0), "phases": phases,
                "group_bytes_read": st.get("group_bytes_read", 0), "deltas": st.get("deltas", 0),
                "params": [bt.digest(p) for p in params]}

    def warm():
        t0 = time.monotonic()
        b = subs["dense"].warm() + subs["delta"].warm()
        return {"warm_s": time.monotonic() - t0, "bytes": b}

    bt._serve(("rollout", rank), cmd, out, {"run": run, "warm": warm})
    for s in subs.values():
        s.close()
    c.close()


# ---- the parent -------------------------------------------------------------------------------

def _solo(addr, token_file, L, touch_log):
    """encode_gbps of one encoder alone over trainer 0's shards (1 %
    changed), and a single-thread memcpy measured just before."""
    memcpy = bt.warm_memcpy_gbps()
    with ft.Store(master=addr, token_file=token_file) as s:
        pub = ferry.WeightPublisher(s, MODEL_SOLO, 0, 1, keep=2)
        sh = Shard(L, 0)
        views = L.shard_views(sh.flat, 0)
        names = [f"solo.{ti}" for ti in range(len(L.names))]
        module = bt.module_of([(names[ti], tuple(views[ti].shape)) for ti in range(len(L.names))],
                              {names[ti]: views[ti] for ti in range(len(L.names))})
        with ferry.sparse.DeltaEncoder(pub, crossover=0.5) as enc:
            ft.publish_delta(enc, 1, module, "fsdp:1")
            best = 0.0
            for g in range(2, 5):
                sh.frac(g, 0.01)
                st = ft.publish_delta(enc, g, module, "fsdp:1")
                best = max(best, st["encode_gbps"])
    touch_log(f"solo encoder: {best:.2f} GB/s of shard compared, memcpy {memcpy:.2f} GB/s")
    return best, memcpy


def run(cfg, a_opts, log=None):
    log = log or (lambda s: None)
    L = bt.Layout(cfg)
    model_bytes = 2 * L.params
    load0 = os.getloadavg()
    touch = bt.first_touch_gbps()
    warm = bt.warm_memcpy_gbps()
    log(f"first touch {touch:.3f} GB/s, warm memcpy {warm:.3f} GB/s (one thread, best of {bt.PASSES})")
    tmp = tempfile.mkdtemp(prefix="ferry-bench-delta-")
    cluster, job = None, None
    cases = ["real"] + [repr(f) for f in a_opts["fractions"]]
    try:
        cluster = bt.Cluster(tmp, 7 * model_bytes + (256 << 20))
        a = {"cfg": cfg, "addr": cluster.addr, "token_file": cluster.token_file, "shm_dir": tmp,
             "pg_file": os.path.join(tmp, "pg"), "timeout_s": int(a_opts["timeout_s"]),
             "crossover": a_opts["crossover"], "max_chain": a_opts["max_chain"], "lr": a_opts["lr"],
             "real_steps": a_opts["real_steps"]}
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
        shards = [Shard(L, r) for r in range(bt.TRAINERS)]     # the parent's copy of the trainers' values
        gens = {"dense": 0, "delta": 0}
        checks = 0
        results = {c: [] for c in cases}

        def one(rnd, label):
            nonlocal checks
            want = expected(L, shards)
            row = {}
            for side in (SIDES if rnd % 2 else SIDES[::-1]):
                gens[side] += 1
                got = job.ask(trainers + rollouts, "run", side, gens[side])
                for (kind, q), v in got.items():
                    if kind == "rollout" and v["params"] != want[q]:
                        bad = [L.names[ti] for ti, h in enumerate(v["params"]) if h != want[q][ti]]
                        raise RuntimeError(f"{label} {side}: rollout {q}'s {bad[:3]} differ from the trainers' model")
                checks += bt.ROLLOUTS * len(L.names)
                tr = [v for w, v in got.items() if w[0] == "trainer"]
                ro = [v for w, v in got.items() if w[0] == "rollout"]
                t = max(v["t1"] for v in ro) - min(v["t0"] for v in got.values())
                st = [v["stats"] for v in tr]
                row[side] = {"s": t, "publish_s": max(v["publish_s"] for v in tr),
                             "update_s": max(v["update_s"] for v in ro),
                             "stored_bytes": sum(x["stored_bytes"] for x in st),
                             "store_read_bytes": (ro[0]["group_bytes_read"] if side == "dense" or
                                                  st[0]["kind"] != "sparse" else
                                                  sum(v["bytes_read"] for v in ro)),
                             "kind": st[0]["kind"]}
                if side == "delta":
                    row[side].update({"encode_s": max(x["encode_s"] for x in st),
                                      "encode_gbps_min": min(x["encode_gbps"] for x in st),
                                      "changed_fraction": st[0]["total_changed"] / st[0]["total_elements"],
                                      "nnz": sum(x["nnz"] for x in st), "part_bytes": sum(x["part_bytes"] for x in st),
                                      "chain": st[0]["chain"]})
                    for k in ("exchange_s", "store_s", "commit_s", "snapshot_s", "total_s"):
                        row[side]["publish." + k] = max(x[k] for x in st)
                    for k in ro[0]["phases"]:
                        row[side]["update." + k] = max(v["phases"].get(k, 0.0) for v in ro)
            d = row["delta"]
            log(f"{label}: changed {d['changed_fraction'] * 100:.3f} %, delta {d['kind']} {d['s']:.3f} s "
                f"(encode {d.get('encode_s', 0):.3f}, publish {d['publish_s']:.3f} ["
                f"{', '.join(f'{k[8:]} {v:.3f}' for k, v in d.items() if k.startswith('publish.'))}], "
                f"update {d['update_s']:.3f} ["
                f"{', '.join(f'{k[7:]} {v:.3f}' for k, v in d.items() if k.startswith('update.'))}], "
                f"stored {d['stored_bytes']}, read {d['store_read_bytes']}) vs dense {row['dense']['s']:.3f} s "
                f"(publish {row['dense']['publish_s']:.3f}, update {row['dense']['update_s']:.3f}): "
                f"{row['dense']['s'] / d['s']:.2f}x")
            return row

        rnd = 1
        first = one(rnd, "generation 1 (both dense)")
        rnd += 1
        for s in shards:
            s.frac(rnd, 0.01)
        job.ask(trainers, "step", rnd, "0.01")
        warm_row = one(rnd, "warm (1 %, not counted)")
        for case in cases:
            for _ in range(a_opts["rounds"]):
                rnd += 1
                for s in shards:
                    s.step(rnd, case, a)
                job.ask(trainers, "step", rnd, case)
                results[case].append(one(rnd, f"case {case} round {rnd}"))
        job.stop()
        job = None
        solo_gbps, solo_memcpy = _solo(cluster.addr, cluster.token_file, L, log)
    finally:
        if job is not None:
            job.stop()
        if cluster is not None:
            cluster.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    def med(rows, side, k):
        # a case's rounds may differ in kind (a chain cut by a dense generation among sparse ones): each
        # phase over the rounds that have it
        vals = [r[side][k] for r in rows if k in r[side]]
        return statistics.median(vals) if vals else None

    res = {"params": L.params, "model_bytes": model_bytes, "tensors": len(L.names), "trainers": bt.TRAINERS,
           "rollouts": bt.ROLLOUTS, "src_layout": bt.SRC_LAYOUT, "dst_layout": bt.DST_LAYOUT, "config": cfg,
           "rounds": a_opts["rounds"], "crossover": a_opts["crossover"], "max_chain": a_opts["max_chain"],
           "lr": a_opts["lr"], "real_steps": a_opts["real_steps"], "optimizer": "torch.optim.Adam",
           "first_touch_gbps": touch, "warm_memcpy_gbps": warm, "first": first, "warm": warm_row,
           "delta_cases": {}}
    speed = {}
    for case in cases:
        rows = results[case]
        out = {side: {k: med(rows, side, k) for k in dict.fromkeys(k for r in rows for k in r[side])
                      if k not in ("kind",)} for side in SIDES}
        for side in SIDES:
            out[side]["kind"] = [r[side]["kind"] for r in rows]
        out["speedup"] = out["dense"]["s"] / out["delta"]["s"]
        speed[case] = out["speedup"]
        res["delta_cases"][case] = out
    res["delta_speedup_1pct"] = speed.get(repr(0.01), 0.0)
    res["delta_speedup_min"] = min(speed.values())
    res["delta_real_fraction"] = res["delta_cases"]["real"]["delta"]["changed_fraction"]
    res["delta_real_speedup"] = speed["real"]
    res["encode_gbps_solo"] = solo_gbps
    res["encode_memcpy_gbps"] = solo_memcpy
    res["encode_ratio"] = solo_gbps / solo_memcpy if solo_memcpy else 0.0
    res["hashes_ok"] = True
    res["hash_checks"] = checks
    res["loadavg_start"], res["loadavg_end"] = list(load0), list(os.getloadavg())
    return res


def human(res):
    lines = [f"delta bench: {res['params'] / 1e6:.1f}M params ({res['model_bytes'] / 1e6:.0f} MB bf16), "
             f"{res['trainers']} trainers {res['src_layout']} -> {res['rollouts']} rollouts {res['dst_layout']}; "
             f"crossover {res['crossover']}, K {res['max_chain']}; first touch {res['first_touch_gbps']:.2f} GB/s, "
             f"warm memcpy {res['warm_memcpy_gbps']:.2f} GB/s",
             f"  {'case':>8} {'changed':>9} {'kind':>15} {'encode s':>9} {'publish s':>10} {'update s':>9} "
             f"{'delta s':>8} {'dense s':>8} {'speedup':>8} {'stored':>12} {'read':>12}"]
    for case, c in res["delta_cases"].items():
        d = c["delta"]
        lines.append(f"  {case:>8} {d['changed_fraction'] * 100:8.3f}% {d['kind'][-1]:>15} {d['encode_s']:9.3f} "
                     f"{d['publish_s']:10.3f} {d['update_s']:9.3f} {d['s']:8.3f} {c['dense']['s']:8.3f} "
                     f"{c['speedup']:7.2f}x {int(d['stored_bytes']):12d} {int(d['store_read_bytes']):12d}")
    lines.append(f"  delta_speedup_1pct {res['delta_speedup_1pct']:.2f}, delta_speedup_min "
                 f"{res['delta_speedup_min']:.2f}, real: {res['delta_real_fraction'] * 100:.3f} % changed, "
                 f"{res['delta_real_speedup']:.2f}x; encode {res['encode_gbps_solo']:.2f} GB/s solo = "
                 f"{res['encode_ratio']:.2f} x memcpy; {res['hash_checks']} parameter hashes equal")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m ferry.bench_torch --delta",
                                 description="Deltas from 4 FSDP torch trainers (ferry.torch.publish_delta) "
                                             "against the dense shard update of the same weights, into 4 "
                                             "TP2xDP2 rollouts.",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--rounds", type=bt._positive, default=1, help="rounds of every case (their median)")
    ap.add_argument("--fractions", default=",".join(repr(f) for f in FRACTIONS),
                    help="synthetic changed fractions, comma-separated")
    ap.add_argument("--real-steps", type=bt._positive, default=2, help="Adam steps a real round takes")
    ap.add_argument("--lr", type=float, default=1e-6, help="the real rounds' Adam learning rate")
    ap.add_argument("--crossover", type=float, default=0.05, help="the encoders' crossover")
    ap.add_argument("--max-chain", type=bt._positive, default=8, help="the encoders' K")
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
    try:
        fr = tuple(float(x) for x in o.fractions.split(",") if x)
    except ValueError:
        fr = ()
    if not fr or any(not 0 < f <= 1 for f in fr):
        ap.error(f"--fractions: fractions in (0, 1], comma-separated, not {o.fractions!r}")
    opts = {"rounds": o.rounds, "fractions": fr, "real_steps": o.real_steps, "lr": o.lr, "crossover": o.crossover,
            "max_chain": o.max_chain, "timeout_s": o.timeout}
    log = None if o.quiet else (lambda s: print("ferry.bench_delta: " + s, file=sys.stderr, flush=True))
    try:
        res = run(cfg, opts, log)
    except (RuntimeError, TimeoutError, OSError, ferry.Error) as e:
        print(f"ferry.bench_delta: {e}", file=sys.stderr)
        return 1
    print(json.dumps(res) if o.json else human(res), flush=True)
    return 0
