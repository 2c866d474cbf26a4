"""ferry.bench_torch: a torch weight update through ferry against what users
do today, on the same shards in one run (docs/weights.md, "Against
torch.save, gloo and point-to-point"; ``ferry-lab bench weights --torch``
runs it).

``python3 -m ferry.bench_torch [--json] [--rounds 5] [--warmup 0]
[--hidden 1024] [--layers 8] [--ffn 4096] [--vocab 15000] [--ctx 1024]
[--variants torch_save,gloo_bcast,p2p,ferry_shard]``; with ``--delta`` it
runs ferry.bench_delta instead (deltas from the trainers against the dense
shard update; its options follow ``--delta --help``), with ``--fp8``
ferry.bench_fp8 (FP8 rollouts against the bf16 update; ``--fp8 --help``).

A GPT-style model (the tensors of python/tests/gpt_model.py's GPT, scaled
up: about 166 M parameters, 332 MB in bf16 by default) is held by 4 trainer
processes as FSDP dim-0 shards (``fsdp:4``: every tensor cut along dim 0;
each rank's shards are views into one flat buffer, as FSDP keeps them) and
is wanted by 4 rollout processes in TP2 x DP2 (``tp:2,dp:2``: torch
parameters of their TP boxes, the role rules of ferry.torch). Each round the
trainers fill their shards with new values, then four updates run back to
back, in an order that rotates from round to round:

- ``torch_save``: gather the shards to trainer 0 (gloo), which rebuilds the
  full tensors and ``torch.save``s them into /dev/shm (a temporary name,
  then renamed); each rollout polls for the file and, as soon as it is
  there, ``torch.load``s it and copies its TP slices into its parameters;
- ``gloo_bcast``: gather the shards to trainer 0, which broadcasts them
  (gloo, every rank's shards as one buffer) to the rollouts, each copying
  its slices out of them;
- ``p2p``: point-to-point (gloo ``isend``/``irecv`` over loopback, the same
  world): each trainer sends every rollout exactly the part of each of its
  shards that the rollout's TP box holds (shard rows x the box's columns;
  each piece once to each rollout that wants it, no gather), received
  straight into the rollout's parameter (a run of its whole rows). The
  schedule is computed once; pieces that are not contiguous in the shard
  (column-cut tensors) are copied into send buffers allocated once;
- ``ferry_shard``: every trainer publishes its own shards
  (``ferry.torch.publish_module(..., layout="fsdp:4")`` over
  ``ferry_publish_shards``: no gather), and the rollouts, told by a watch
  of the model's active generation, update parameter-direct into their
  torch parameters (``ferry.torch.Subscriber``, a single-pull group).

A variant's time runs from the moment every process has left a barrier
(the trainers hold the round's values in their shards; the rollouts'
parameters are overwritten with a poison value before it) to the moment
the last rollout has its parameters updated (one machine: the processes'
CLOCK_MONOTONIC readings compare). After each variant every rollout
hashes each parameter (BLAKE2b) and the parent compares it with the hash
of the same slice of the full model that it rebuilt from the trainers'
values (and the trainers' hashes of their shards with the parent's).
The first round (the first update of a fresh process set) is reported on
its own (``<variant>_first_s``); the steady state is the ``--rounds``
rounds after it (and after ``--warmup`` more, 0 by default): their median
(``<variant>_s``) and max (``<variant>_max_s``). Each worker's minor page
faults (getrusage) over its part of each variant are summed per side.

Processes: the parent starts a ferry cluster with ``ferry up`` (FERRY_BIN,
else ``ferry`` next to build/python, else on PATH) in a temporary
directory, and the 8 workers through a forkserver (torch imported once);
gloo uses loopback only (GLOO_SOCKET_IFNAME=lo, a FileStore rendezvous).
Everything started is stopped on exit, also on failure.
"""

import argparse
import hashlib
import json
import mmap
import multiprocessing
import os
import queue
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import ferry
import ferry.torch as ft

MODEL = "torchbench"
TRAINERS, ROLLOUTS = 4, 4
SRC_LAYOUT, DST_LAYOUT = "fsdp:4", "tp:2,dp:2"
VARIANTS = ("torch_save", "gloo_bcast", "p2p", "ferry_shard", "ferry_overlap")
FERRY = ("ferry_shard", "ferry_overlap")
POISON = -3.0
START_S = 120.0        # deadline for the cluster to come up (a bound, not a measure)
POLL_S = 0.001         # torch_save: how long a rollout sleeps between looks for the file
TOUCH_BYTES, WARM_BYTES, PASSES = 16 << 20, 256 << 20, 5
TIMING_RULE = (
    "every variant: from the moment all 8 processes have left one gloo barrier (the trainers hold the round's "
    "values in their FSDP shards, the rollouts' parameters were poisoned before it) to the moment the last "
    "rollout has all its parameters written (latest rollout end - earliest start, CLOCK_MONOTONIC); filling, "
    "poisoning and hashing are outside. ferry_shard: the trainers' publish (packing and any conversion of the "
    "shards, the store writes, the publishers' barrier and the generation's announcement), then each "
    "rollout's wait for the announcement (a watch) and its update into its parameters. p2p: copying the "
    "column-cut pieces into send buffers allocated once, posting and completing every isend/irecv (gloo, "
    "loopback) straight into the rollouts' parameters. torch_save: the gather to trainer 0, rebuilding the "
    "full tensors, torch.save into /dev/shm (temporary name, rename), the rollouts' polling for the file, "
    "torch.load and the copy of each rollout's boxes. gloo_bcast: the gather to trainer 0, its broadcast of "
    "the four shard buffers, each rollout's slice copy into its parameters. ferry_overlap: the same publish, "
    "while the rollouts (a group with a standby copy of every parameter) take the generation with an "
    "overlapped update (WeightSubscriber.update(next=...)): demands exchanged and planned at once, reads "
    "started as soon as every trainer has stored its part, all into the standby copy, flipped once the "
    "generation is announced and checked; its end is the last rollout's flip (its first round, the group's "
    "first update, is a plain one). The first round (fresh processes, "
    "fresh buffers) is reported alone as <variant>_first_s; <variant>_s / <variant>_max_s are the median / "
    "max of the steady-state rounds after it.")


# ---- the model: names and shapes --------------------------------------------------------------

def tensors_of(cfg):
    """(name, full shape) of every tensor, in the order gpt_model.GPT's
    named_parameters() gives them."""
    h, f, v, c = cfg["hidden"], cfg["ffn"], cfg["vocab"], cfg["ctx"]
    out = [("embed.weight", (v, h)), ("pos.weight", (c, h))]
    for i in range(cfg["layers"]):
        p = f"blocks.{i}."
        out += [(p + "ln1.weight", (h,)), (p + "ln1.bias", (h,))]
        for t in "qkvo":
            out += [(p + f"attn.{t}_proj.weight", (h, h)), (p + f"attn.{t}_proj.bias", (h,))]
        out += [(p + "ln2.weight", (h,)), (p + "ln2.bias", (h,))]
        out += [(p + "mlp.gate_proj.weight", (f, h)), (p + "mlp.gate_proj.bias", (f,)),
                (p + "mlp.up_proj.weight", (f, h)), (p + "mlp.up_proj.bias", (f,)),
                (p + "mlp.down_proj.weight", (h, f)), (p + "mlp.down_proj.bias", (h,))]
    return out + [("ln_f.weight", (h,)), ("ln_f.bias", (h,)), ("lm_head.weight", (v, h))]


def _numel(shape):
    n = 1
    for x in shape:
        n *= x
    return n


class Layout:
    """The tensors and both placements, built alike in every process:
    ``src[r]`` / ``dst[r]`` are {tensor index: (offset, shape)} of trainer /
    rollout rank r (one box per tensor and rank in these layouts)."""

    def __init__(self, cfg):
        self.tensors = tensors_of(cfg)
        self.names = [n for n, _ in self.tensors]
        self.shapes = {n: s for n, s in self.tensors}
        specs = [(n, s, "bf16") for n, s in self.tensors]
        self.specs = specs
        self.src = self._boxes(ft.build_layout(MODEL, specs, SRC_LAYOUT), TRAINERS)
        self.dst = self._boxes(ft.build_layout(MODEL, specs, DST_LAYOUT), ROLLOUTS)
        for ti, (name, shape) in enumerate(self.tensors):
            pieces = sorted(self.src[r][ti] for r in range(TRAINERS))
            at = 0
            for off, shp in pieces:     # the trainer layout cuts dim 0 only
                if off[0] != at or any(off[1:]) or tuple(shp[1:]) != tuple(shape[1:]):
                    raise ValueError(f"tensor {name}: {SRC_LAYOUT} piece {off}+{shp} is not a dim-0 shard")
                at += shp[0]
        self.flat = [sum(_numel(self.src[r][ti][1]) for ti in range(len(self.tensors))) for r in range(TRAINERS)]
        self.flat_max = max(self.flat)
        self.params = sum(_numel(s) for _, s in self.tensors)

    @staticmethod
    def _boxes(placement, ranks):
        out = [dict() for _ in range(ranks)]
        for fid in range(placement.fragment_count):
            f = placement.fragment(fid)
            if f["tensor"] in out[f["rank"]]:
                raise ValueError(f"rank {f['rank']} holds two pieces of tensor {f['tensor']}")
            out[f["rank"]][f["tensor"]] = (tuple(f["offset"]), tuple(f["shape"]))
        return out

    def shard_views(self, flat, rank):
        """{tensor index: view of flat} of trainer rank's shards, in tensor order."""
        views, at = {}, 0
        for ti in range(len(self.tensors)):
            shp = self.src[rank][ti][1]
            n = _numel(shp)
            views[ti] = flat[at:at + n].view(shp)
            at += n
        return views


def fill(view, rnd, rank, ti):
    """The values of trainer rank's shard of tensor ti in round rnd (the
    trainers' "new weights"; the parent computes the same)."""
    g = torch.Generator().manual_seed(rnd * 1_000_003 + rank * 10_007 + ti)
    view.copy_(torch.randn(tuple(view.shape), generator=g).mul_(0.02))


def digest(t):
    """BLAKE2b-128 of a tensor's bytes (bf16 words in row-major order)."""
    t = t.detach().contiguous()
    return hashlib.blake2b(t.view(torch.int16).numpy(), digest_size=16).hexdigest()


def box_view(t, off, shape):
    for d, (o, n) in enumerate(zip(off, shape)):
        t = t.narrow(d, o, n)
    return t


def module_of(shapes, tensors=None):
    """A torch module whose named_parameters() are ``shapes``' (name,
    shape) in order: bf16 Parameters, zeros, or the given tensors
    (``tensors[name]``, shared, not copied)."""
    root = torch.nn.Module()
    for name, shape in shapes:
        *path, leaf = name.split(".")
        m = root
        for part in path:
            if part not in m._modules:
                m.add_module(part, torch.nn.Module())
            m = m._modules[part]
        data = tensors[name] if tensors is not None else torch.zeros(shape, dtype=torch.bfloat16)
        m.register_parameter(leaf, torch.nn.Parameter(data, requires_grad=False))
    return root


def _u8(t):
    return t.view(-1).view(torch.uint8)      # gloo in torch 1.13 has no bf16 (nor int16) collectives


def p2p_plan(L):
    """The point-to-point schedule, the same in every process: (trainer,
    rollout, tensor index, lo, hi) for every trainer shard that meets a
    rollout's box, rows [lo, hi) of the full tensor (the shard's rows inside
    the box's; the piece is those rows x the box's other extents). Each
    piece goes once to each rollout whose box holds it."""
    out = []
    for ti in range(len(L.names)):
        for r in range(TRAINERS):
            poff, pshp = L.src[r][ti]
            for q in range(ROLLOUTS):
                off, shp = L.dst[q][ti]
                lo, hi = max(off[0], poff[0]), min(off[0] + shp[0], poff[0] + pshp[0])
                if lo < hi:
                    out.append((r, q, ti, lo, hi))
    return out


# ---- workers ----------------------------------------------------------------------------------

class _Ctx:
    """What every worker has: rank (0-3 trainers, 4-7 rollouts), the layout,
    gloo groups, a ferry store."""

    def __init__(self, a, grank):
        self.a, self.grank = a, grank
        self.layout = Layout(a["cfg"])
        torch.set_num_threads(1)
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"
        dist.init_process_group("gloo", init_method="file://" + a["pg_file"], rank=grank,
                                world_size=TRAINERS + ROLLOUTS, timeout=timedelta(seconds=a["timeout_s"]))
        self.gather_group = dist.new_group(list(range(TRAINERS)))
        self.bcast_group = dist.new_group([0] + list(range(TRAINERS, TRAINERS + ROLLOUTS)))
        self.store = ft.Store(master=a["addr"], token_file=a["token_file"])

    def start(self):
        """Leave the barrier: the variant's clock starts here (and this
        process's CPU clock and minor-fault count, all its threads, for
        cpu() and faults())."""
        dist.barrier()
        self.cpu0 = time.process_time()
        self.flt0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        return time.monotonic()

    def cpu(self):
        return time.process_time() - self.cpu0

    def faults(self):
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - self.flt0

    def close(self):
        self.store.close()
        dist.destroy_process_group()


def _serve(who, cmd, out, handlers):
    while True:
        c = cmd.get()
        if c[0] == "exit":
            return
        try:
            out.put((who, handlers[c[0]](*c[1:])))
        except BaseException as e:   # noqa: B902 - the parent reports it and stops everything
            import traceback
            out.put((who, "ERROR " + "".join(traceback.format_exception(type(e), e, e.__traceback__))[-3000:]))
            return


def _trainer(a, rank, cmd, out):
    c = _Ctx(a, rank)
    L = c.layout
    flat = torch.empty(L.flat_max, dtype=torch.bfloat16)
    views = L.shard_views(flat, rank)
    # the trainer's FSDP module: Parameters over the shards, full shapes on the side
    module = module_of([(n, L.src[rank][ti][1]) for ti, n in enumerate(L.names)],
                       {n: views[ti] for ti, n in enumerate(L.names)})
    gathered = [torch.empty(L.flat_max, dtype=torch.bfloat16) for _ in range(TRAINERS)] if rank == 0 else None
    pub = ferry.WeightPublisher(c.store, MODEL, rank, TRAINERS, keep=2, timeout_ms=a["timeout_s"] * 1000)
    shm_dir = a["shm_dir"]
    # p2p, once: what this trainer sends to whom; a piece not contiguous in the shard (a column box) gets a
    # send buffer of its own, allocated here, filled each round, sent to every rollout that wants it
    sends, staged = [], {}
    for r, q, ti, lo, hi in p2p_plan(L):
        if r != rank:
            continue
        off, shp = L.dst[q][ti]
        src = box_view(views[ti].narrow(0, lo - L.src[rank][ti][0][0], hi - lo),
                       (0,) + tuple(off[1:]), (hi - lo,) + tuple(shp[1:]))
        if not src.is_contiguous():
            key = (ti, lo, hi, tuple(off[1:]), tuple(shp[1:]))
            if key not in staged:
                staged[key] = (torch.empty(tuple(src.shape), dtype=torch.bfloat16), src)
            src = staged[key][0]
        sends.append((TRAINERS + q, ti, _u8(src)))
    staged = list(staged.values())

    def new_round(rnd):
        for f in os.listdir(shm_dir) if rank == 0 else ():   # the last round's file, outside any timing
            os.unlink(os.path.join(shm_dir, f))
        for ti in range(len(L.names)):
            fill(views[ti], rnd, rank, ti)
        return {"shards": [digest(views[ti]) for ti in range(len(L.names))]}

    def gather():
        dist.gather(_u8(flat), [_u8(g) for g in gathered] if rank == 0 else None, dst=0, group=c.gather_group)

    def full_tensors():
        out = {}
        for ti, name in enumerate(L.names):
            pieces = sorted((L.src[r][ti][0][0], r) for r in range(TRAINERS))
            out[name] = torch.cat([L.shard_views(gathered[r], r)[ti] for _, r in pieces])
        return out

    def run(variant, rnd, gen):
        t0 = c.start()
        ph = {}
        if variant == "torch_save":
            gather()
            ph["gather_s"] = time.monotonic() - t0
            if rank == 0:
                t1 = time.monotonic()
                sd = full_tensors()
                path = os.path.join(shm_dir, f"weights-{rnd}.pt")
                torch.save(sd, path + ".tmp")
                os.rename(path + ".tmp", path)        # the rollouts poll for this name
                ph["save_s"] = time.monotonic() - t1
        elif variant == "gloo_bcast":
            gather()
            ph["gather_s"] = time.monotonic() - t0
            if rank == 0:
                t1 = time.monotonic()
                for g in gathered:
                    dist.broadcast(_u8(g), 0, group=c.bcast_group)
                ph["bcast_s"] = time.monotonic() - t1
        elif variant == "p2p":
            for buf, src in staged:
                buf.copy_(src)
            t1 = time.monotonic()
            ph["stage_s"] = t1 - t0
            works = [dist.isend(u8, dst, tag=tag) for dst, tag, u8 in sends]
            for w in works:
                w.wait()
            ph["send_s"] = time.monotonic() - t1
        else:
            st = ft.publish_module(pub, gen, module, layout=SRC_LAYOUT, shapes=L.shapes)
            ph["publish_s"] = time.monotonic() - t0
            ph.update({"publish." + k: v for k, v in st.items() if k.endswith("_s")})
        return {"t0": t0, "cpu_s": c.cpu(), "faults": c.faults(), "phases": ph}

    def plan():
        return {"messages": len(sends), "bytes": sum(u8.numel() for _, _, u8 in sends), "staged": len(staged),
                "staged_bytes": sum(2 * b.numel() for b, _ in staged)}

    def warm():
        """ferry's documented warm-up of a trainer (ft.warm_publisher)."""
        t0 = time.monotonic()
        b = ft.warm_publisher(pub, module, layout=SRC_LAYOUT, shapes=L.shapes)
        return {"warm_s": time.monotonic() - t0, "bytes": b}

    _serve(("trainer", rank), cmd, out, {"round": new_round, "run": run, "plan": plan, "warm": warm})
    for f in os.listdir(shm_dir) if rank == 0 else ():
        os.unlink(os.path.join(shm_dir, f))
    c.close()


def _rollout(a, rank, cmd, out):
    c = _Ctx(a, TRAINERS + rank)
    L = c.layout
    mine = L.dst[rank]
    module = module_of([(n, mine[ti][1]) for ti, n in enumerate(L.names)])
    params = [p for _, p in module.named_parameters()]
    recv = [torch.empty(L.flat_max, dtype=torch.bfloat16) for _ in range(TRAINERS)]
    sub = ft.Subscriber(c.store, MODEL, module, DST_LAYOUT, rank, group="bench", tensors=L.specs,
                        timeout_ms=a["timeout_s"] * 1000)
    active_key = f"ferry/wk/{MODEL}/active"
    # ferry_overlap: a second group over the same boxes, with a standby copy of every parameter; the copy that
    # holds the round's generation after the flip is the one hashed
    copies = ([p.data for p in params], [torch.empty_like(p.data) for p in params])
    sub_ov = ferry.WeightSubscriber(c.store, MODEL, "bench-ov", rank, ROLLOUTS,
                                    [(n, tuple(mine[ti][0]), copies[0][ti]) for ti, n in enumerate(L.names)],
                                    standby=[copies[1][ti] for ti in range(len(L.names))],
                                    timeout_ms=a["timeout_s"] * 1000)
    active_copy = [0]
    # p2p, once: what this rollout receives from whom, straight into its parameter (the piece is a run of the
    # parameter's whole rows, so contiguous there; a piece that were not would land in a buffer allocated
    # here and be copied: none in these layouts)
    recvs, rstaged = [], []
    for r, q, ti, lo, hi in p2p_plan(L):
        if q != rank:
            continue
        dst = params[ti].data.narrow(0, lo - mine[ti][0][0], hi - lo)
        if not dst.is_contiguous():
            buf = torch.empty(tuple(dst.shape), dtype=torch.bfloat16)
            rstaged.append((buf, dst))
            dst = buf
        recvs.append((r, ti, _u8(dst)))

    def from_full(sd):
        for ti, name in enumerate(L.names):
            params[ti].data.copy_(box_view(sd[name], *mine[ti]))

    def from_pieces():
        """Each parameter's box out of the trainers' dim-0 shards."""
        for ti in range(len(L.names)):
            off, shp = mine[ti]
            dst = params[ti].data
            for r in range(TRAINERS):
                poff, pshp = L.src[r][ti]
                lo, hi = max(off[0], poff[0]), min(off[0] + shp[0], poff[0] + pshp[0])
                if lo >= hi:
                    continue
                src = L.shard_views(recv[r], r)[ti].narrow(0, lo - poff[0], hi - lo)
                src = box_view(src, (0,) + tuple(off[1:]), (hi - lo,) + tuple(shp[1:]))
                dst.narrow(0, lo - off[0], hi - lo).copy_(src)

    def wait_active(w, gen):
        deadline = time.monotonic() + a["timeout_s"]
        act = ferry.weights.active(c.store, MODEL)
        while act is None or act[0] < gen:
            left = deadline - time.monotonic()
            ev = w.next(timeout_ms=max(1, int(left * 1000)))
            if ev is None:
                raise TimeoutError(f"generation {gen} was not announced within {a['timeout_s']} s")
            if ev[2]:
                act = (int(ev[2].split()[0]), None)

    def run(variant, rnd, gen):
        for p in params:
            p.data.fill_(POISON)
        for t in copies[1]:
            t.fill_(POISON)
        ph = {}
        hashed = params
        if variant == "torch_save":
            path = os.path.join(a["shm_dir"], f"weights-{rnd}.pt")
            t0 = c.start()
            deadline = t0 + a["timeout_s"]
            while not os.path.exists(path):         # load it the moment it is there (renamed: complete)
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{path} did not appear within {a['timeout_s']} s")
                time.sleep(POLL_S)
            t1 = time.monotonic()
            ph["wait_s"] = t1 - t0
            sd = torch.load(path)
            t2 = time.monotonic()
            ph["load_s"] = t2 - t1
            from_full(sd)
            del sd
            ph["slice_s"] = time.monotonic() - t2
        elif variant == "gloo_bcast":
            t0 = c.start()
            for r in range(TRAINERS):
                dist.broadcast(_u8(recv[r]), 0, group=c.bcast_group)
            t1 = time.monotonic()
            ph["recv_s"] = t1 - t0
            from_pieces()
            ph["slice_s"] = time.monotonic() - t1
        elif variant == "p2p":
            t0 = c.start()
            works = [dist.irecv(u8, src, tag=tag) for src, tag, u8 in recvs]
            for w in works:
                w.wait()
            for buf, dst in rstaged:
                dst.copy_(buf)
            ph["recv_s"] = time.monotonic() - t0
        elif variant == "ferry_overlap":
            t0 = c.start()
            st = sub_ov.update(next=gen)
            if st["generation"] != gen:
                raise RuntimeError(f"the overlapped update took generation {st['generation']}, not {gen}")
            active_copy[0] = 1 - active_copy[0]
            ph["update_s"] = time.monotonic() - t0
            ph["overlapped"] = float(st["overlapped"])
            ph.update({"update." + k: v for k, v in st.items() if k.endswith("_s")})
            hashed = copies[active_copy[0]]
        else:
            with c.store.watch(active_key) as w:
                t0 = c.start()
                wait_active(w, gen)
            t1 = time.monotonic()
            ph["wait_s"] = t1 - t0
            st = sub.update()
            if st["generation"] != gen:
                raise RuntimeError(f"the update took generation {st['generation']}, not {gen}")
            ph["update_s"] = time.monotonic() - t1
            ph.update({"update." + k: v for k, v in st.items() if k.endswith("_s")})
        t_end, cpu, flt = time.monotonic(), c.cpu(), c.faults()
        return {"t0": t0, "t1": t_end, "cpu_s": cpu, "faults": flt, "phases": ph,
                "params": [digest(p) for p in hashed]}

    def plan():
        return {"messages": len(recvs), "bytes": sum(u8.numel() for _, _, u8 in recvs), "staged": len(rstaged)}

    def warm():
        """ferry's documented warm-up of a rollout (Subscriber.warm)."""
        t0 = time.monotonic()
        b = sub.warm()
        return {"warm_s": time.monotonic() - t0, "bytes": b}

    _serve(("rollout", rank), cmd, out, {"run": run, "plan": plan, "warm": warm})
    sub_ov.close()
    sub.close()
    c.close()


# ---- the parent -------------------------------------------------------------------------------

def _ferry_bin():
    env = os.environ.get("FERRY_BIN")
    if env:
        return env
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # build/python
    cand = os.path.join(os.path.dirname(here), "ferry")
    if os.access(cand, os.X_OK):
        return cand
    return shutil.which("ferry") or "ferry"


class Cluster:
    """``ferry up`` in a directory of its own, in the foreground; stopped by SIGTERM."""

    def __init__(self, tmp, size):
        self.log = open(os.path.join(tmp, "up.log"), "wb")
        env = {k: v for k, v in os.environ.items() if k not in ("FERRY_MASTER", "FERRY_TOKEN", "FERRY_TOKEN_FILE")}
        self.proc = subprocess.Popen([_ferry_bin(), "up", "--dir", os.path.join(tmp, "ferry"), "--size",
                                      f"{size >> 20}M", "--listen", "127.0.0.1:0"], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=self.log, env=env)
        try:
            line = self._export_line()
            kv = dict(x.split("=", 1) for x in line.split()[1:])
            self.addr, self.token_file = kv["FERRY_MASTER"], kv["FERRY_TOKEN_FILE"]
        except BaseException:
            self.stop()
            raise
        threading.Thread(target=lambda: self.proc.stdout.read(), daemon=True).start()

    def _export_line(self):
        got = []
        timer = threading.Timer(START_S, self.proc.kill)      # a bound on a hung start, not a measure
        timer.start()
        try:
            for raw in self.proc.stdout:
                text = raw.decode(errors="replace").strip()
                got.append(text)
                if text.startswith("export FERRY_MASTER="):
                    return text
        finally:
            timer.cancel()
        self.log.flush()
        raise RuntimeError(f"ferry up exited ({self.proc.wait()}) before it was ready: {' | '.join(got)}")

    def usage(self):
        """(CPU seconds, minor faults) the master and the node (the children
        of ferry up) have had so far."""
        ticks = flt = 0
        try:
            kids = set()
            for tid in os.listdir(f"/proc/{self.proc.pid}/task"):
                with open(f"/proc/{self.proc.pid}/task/{tid}/children") as f:
                    kids.update(f.read().split())
            for pid in kids:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                ticks += int(fields[11]) + int(fields[12])     # utime, stime (fields 14, 15)
                flt += int(fields[7])                          # minflt (field 10)
        except OSError:
            return 0.0, 0
        return ticks / os.sysconf("SC_CLK_TCK"), flt

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


class Job:
    def __init__(self, ctx, a):
        self.ctx, self.a = ctx, a
        self.out = ctx.Queue()
        self.procs, self.cmds = {}, {}

    def start(self, who, target, rank):
        q = self.ctx.Queue()
        p = self.ctx.Process(target=target, args=(self.a, rank, q, self.out), daemon=True)
        p.start()
        self.procs[who], self.cmds[who] = p, q

    def ask(self, whos, *c):
        for w in whos:
            self.cmds[w].put(c)
        got, deadline = {}, time.monotonic() + self.a["timeout_s"]
        while len(got) < len(whos):
            try:
                who, v = self.out.get(timeout=1.0)
            except queue.Empty:
                dead = {w: p.exitcode for w, p in self.procs.items() if p.exitcode is not None}
                if dead or time.monotonic() > deadline:
                    raise RuntimeError(f"no reply from {sorted(set(whos) - set(got))} to {c[0]} "
                                       f"(exited: {dead or 'none'}; waited up to {self.a['timeout_s']} s)")
                continue
            if isinstance(v, str) and v.startswith("ERROR"):
                raise RuntimeError(f"{who[0]} {who[1]}: {v[6:]}")
            got[who] = v
        return got

    def stop(self):
        for w, p in self.procs.items():
            if p.is_alive():
                self.cmds[w].put(("exit",))
        deadline = time.monotonic() + 30     # one deadline for all: a worker stuck in a collective is killed
        for p in self.procs.values():
            p.join(max(0.0, deadline - time.monotonic()))
        for p in self.procs.values():
            if p.is_alive():
                p.kill()
                p.join(5)


def expected(L, rnd):
    """Hashes of the round's values: every trainer shard and every rollout
    parameter, from the full tensors rebuilt here."""
    shards = [[None] * len(L.names) for _ in range(TRAINERS)]
    params = [[None] * len(L.names) for _ in range(ROLLOUTS)]
    for ti, (name, shape) in enumerate(L.tensors):
        parts = []
        for r in range(TRAINERS):
            off, shp = L.src[r][ti]
            t = torch.empty(shp, dtype=torch.bfloat16)
            fill(t, rnd, r, ti)
            shards[r][ti] = digest(t)
            parts.append((off[0], t))
        full = torch.cat([t for _, t in sorted(parts, key=lambda x: x[0])])
        seen = {}
        for r in range(ROLLOUTS):
            box = L.dst[r][ti]
            if box not in seen:
                seen[box] = digest(box_view(full, *box))
            params[r][ti] = seen[box]
    return shards, params


def _check(L, variant, rnd, got, want):
    for (kind, r), v in sorted(got.items()):
        if kind != "rollout":
            continue
        for ti, h in enumerate(v["params"]):
            if h != want[r][ti]:
                off, shp = L.dst[r][ti]
                raise RuntimeError(f"{variant}, round {rnd}: rollout {r}'s {L.names[ti]} (box {list(off)} + "
                                   f"{list(shp)}) does not hash equal to the trainers' model")
    return ROLLOUTS * len(L.names)


def _median(xs):
    return statistics.median(xs) if xs else 0.0


def first_touch_gbps(n=TOUCH_BYTES, passes=PASSES):
    """GB/s of a memcpy into n bytes of memfd pages that are resident
    (another mapping wrote them, as a node's segment is) but that a fresh
    mapping never touched; best of ``passes`` (bench_first_touch of
    src/cli/bench_weights.c). 0.0 where memfd_create is missing."""
    src = bytearray(b"\x01") * n                  # touched
    try:
        fd = os.memfd_create("ferry-bench-touch", os.MFD_CLOEXEC)
    except (AttributeError, OSError):
        return 0.0
    best = 0.0
    try:
        os.ftruncate(fd, n)
        with mmap.mmap(fd, n) as own:
            own[:] = bytes(n)                         # resident, written through another mapping
            for _ in range(passes):
                with mmap.mmap(fd, n) as m:
                    t0 = time.perf_counter()
                    m[:] = src                        # one memcpy (mmap slice assignment)
                    dt = time.perf_counter() - t0
                best = max(best, n / dt / 1e9 if dt > 0 else 0.0)
    finally:
        os.close(fd)
    return best


def warm_memcpy_gbps(n=WARM_BYTES, passes=PASSES):
    """GB/s of a single-thread memcpy between two already-touched n-byte
    buffers (numpy), best of ``passes``."""
    import numpy as np
    a, b = np.empty(n, np.uint8), np.empty(n, np.uint8)
    a.fill(1)
    b.fill(2)
    best = 0.0
    for _ in range(passes):
        t0 = time.perf_counter()
        np.copyto(b, a)
        dt = time.perf_counter() - t0
        best = max(best, n / dt / 1e9 if dt > 0 else 0.0)
    return best


def run(cfg, rounds=5, warmup=0, timeout_s=600, log=None, variants=VARIANTS, cold=False):
    """Run the benchmark; returns the result dict (the JSON). The first
    round is reported alone, then ``warmup`` rounds (timed, checked, in
    rounds_s only), then ``rounds`` steady-state ones (the medians and
    maxima). ``log``: a callable taking progress lines (default: none);
    ``variants``: a subset to run (for profiling; a speedup is reported
    where its baseline and ferry_shard both ran); ``cold``: skip ferry's
    documented warm-up (ft.warm_publisher on the trainers, Subscriber.warm
    on the rollouts), which otherwise runs once before the first round."""
    log = log or (lambda s: None)
    if rounds < 1 or warmup < 0:
        raise ValueError("rounds must be at least 1 and warmup at least 0")
    L = Layout(cfg)
    model_bytes = 2 * L.params
    plan = p2p_plan(L)
    rollout_bytes = 2 * sum(_numel(L.dst[q][ti][1]) for q in range(ROLLOUTS) for ti in range(len(L.names)))
    load0 = os.getloadavg()
    touch = first_touch_gbps()          # before anything else runs here: the machine as the workers find it
    warm = warm_memcpy_gbps()
    log(f"first touch {touch:.3f} GB/s, warm memcpy {warm:.3f} GB/s (one thread, best of {PASSES})")
    tmp = tempfile.mkdtemp(prefix="ferry-bench-torch-")
    shm = tempfile.mkdtemp(prefix="ferry-bench-torch-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    cluster, job = None, None
    try:
        cluster = Cluster(tmp, 4 * model_bytes + (64 << 20))
        a = {"cfg": cfg, "addr": cluster.addr, "token_file": cluster.token_file, "shm_dir": shm,
             "pg_file": os.path.join(tmp, "pg"), "timeout_s": int(timeout_s)}
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["torch", "torch.distributed", "ferry", "ferry.torch", __name__])
        job = Job(ctx, a)
        trainers = [("trainer", r) for r in range(TRAINERS)]
        rollouts = [("rollout", r) for r in range(ROLLOUTS)]
        for r in range(TRAINERS):
            job.start(trainers[r], _trainer, r)
        for r in range(ROLLOUTS):
            job.start(rollouts[r], _rollout, r)
        sp = job.ask(trainers + rollouts, "plan")
        p2p_stats = {"messages": sum(v["messages"] for v in sp.values()) // 2,   # each counted by both ends
                     "bytes": sum(v["bytes"] for w, v in sp.items() if w[0] == "trainer"),
                     "staged_send_buffers": sum(v["staged"] for w, v in sp.items() if w[0] == "trainer"),
                     "staged_send_bytes": sum(v["staged_bytes"] for w, v in sp.items() if w[0] == "trainer"),
                     "staged_recv_buffers": sum(v["staged"] for w, v in sp.items() if w[0] == "rollout")}
        if p2p_stats["messages"] != len(plan):
            raise RuntimeError(f"p2p: the workers post {p2p_stats['messages']} pieces, the plan has {len(plan)}")
        got_bytes = sum(v["bytes"] for w, v in sp.items() if w[0] == "rollout")
        if got_bytes != rollout_bytes or p2p_stats["bytes"] != rollout_bytes:
            raise RuntimeError(f"p2p: the plan moves {p2p_stats['bytes']} bytes into {got_bytes}, "
                               f"not every rollout byte once ({rollout_bytes})")
        wu = {"warm_s": 0.0, "bytes": 0}
        if not cold and "ferry_shard" in variants:   # ferry's documented warm-up, before round 1
            got = job.ask(trainers + rollouts, "warm")
            wu = {"warm_s": max(v["warm_s"] for v in got.values()), "bytes": sum(v["bytes"] for v in got.values())}
            log(f"ferry warm-up: {wu['bytes']} bytes touched, the slowest process {wu['warm_s']:.3f} s")
        times = {v: [] for v in VARIANTS}       # every round's, the first at [0]
        phases = {v: [] for v in VARIANTS}
        faults = {v: [] for v in VARIANTS}
        checks = 0
        gen = 0
        steady0 = 1 + warmup                    # the index of the first steady-state round
        for rnd in range(1, steady0 + rounds + 1):
            got = job.ask(trainers, "round", rnd)
            want_shards, want = expected(L, rnd)
            for (_, r), v in got.items():
                if v["shards"] != want_shards[r]:
                    raise RuntimeError(f"round {rnd}: trainer {r}'s shards differ from the values computed here")
            k = rnd % len(VARIANTS)
            order = [v for v in VARIANTS[k:] + VARIANTS[:k] if v in variants]
            what = " (first)" if rnd == 1 else " (warm-up)" if rnd <= steady0 else ""
            for variant in order:
                gen += variant in FERRY
                ccpu, cflt = cluster.usage()
                got = job.ask(trainers + rollouts, "run", variant, rnd, gen)
                ccpu2, cflt2 = cluster.usage()
                checks += _check(L, variant, rnd, got, want)
                t = max(v["t1"] for w, v in got.items() if w[0] == "rollout") - min(v["t0"] for v in got.values())
                ph = {"cpu_s": sum(v["cpu_s"] for v in got.values()), "cluster_cpu_s": ccpu2 - ccpu}
                for _, v in got.items():
                    for key, x in v["phases"].items():
                        ph[key] = max(ph.get(key, 0.0), x)
                flt = {"trainers": sum(v["faults"] for w, v in got.items() if w[0] == "trainer"),
                       "rollouts": sum(v["faults"] for w, v in got.items() if w[0] == "rollout"),
                       "cluster": cflt2 - cflt}
                log(f"round {rnd}{what}: {variant} {t:.3f} s ({', '.join(f'{k} {x:.3f}' for k, x in ph.items())}; "
                    f"minor faults: trainers {flt['trainers']}, rollouts {flt['rollouts']}, "
                    f"cluster {flt['cluster']})")
                times[variant].append(t)
                phases[variant].append(ph)
                faults[variant].append(flt)
        res = {"params": L.params, "model_bytes": model_bytes, "tensors": len(L.names), "trainers": TRAINERS,
               "rollouts": ROLLOUTS, "src_layout": SRC_LAYOUT, "dst_layout": DST_LAYOUT, "rounds": rounds,
               "warmup": warmup, "config": cfg, "variants": list(variants), "timing_rule": TIMING_RULE,
               "first_touch_gbps": touch, "warm_memcpy_gbps": warm, "warm_up": not cold,
               "warm_up_s": wu["warm_s"], "warm_up_bytes": wu["bytes"]}
        for v in variants:
            steady = times[v][steady0:]
            res[v + "_first_s"] = times[v][0]
            res[v + "_s"] = _median(steady)
            res[v + "_max_s"] = max(steady)
        f = res.get("ferry_shard_s", 0.0)
        for base, key in (("torch_save", "speedup_vs_torch_save"), ("gloo_bcast", "speedup_vs_gloo"),
                          ("p2p", "speedup_vs_p2p")):
            if base in variants and "ferry_shard" in variants:
                res[key] = res[base + "_s"] / f if f else 0.0
        res["hashes_ok"] = True
        res["hash_checks"] = checks
        res["rounds_s"] = {v: times[v] for v in variants}
        res["phases_s"] = {v: {k: _median([p[k] for p in phases[v][steady0:]]) for k in phases[v][0]}
                           for v in variants}
        res["phases_first_s"] = {v: phases[v][0] for v in variants}
        res["faults"] = {v: {side: _median([x[side] for x in faults[v][steady0:]])
                             for side in ("trainers", "rollouts", "cluster")} for v in variants}
        res["faults_first"] = {v: faults[v][0] for v in variants}
        if "ferry_shard" in variants:
            res["faults_per_update"] = res["faults"]["ferry_shard"]["rollouts"]
        if "ferry_overlap" in variants:
            # rounds after the first: every one overlapped (1.0), or how many fell back to a plain update
            res["overlapped_rounds"] = sum(p.get("overlapped", 0.0) for p in phases["ferry_overlap"][1:])
            if "ferry_shard" in variants and f:
                res["overlap_s"] = res["ferry_overlap_s"]
                res["overlap_ratio"] = res["ferry_overlap_s"] / f   # against publish, then update
                # the best any schedule could do here: the overlapped round's CPU seconds (every
                # process, the master and node included) spread over this machine's CPUs
                ov = res["phases_s"]["ferry_overlap"]
                res["cpus"] = len(os.sched_getaffinity(0))
                res["overlap_cpu_floor_ratio"] = (ov["cpu_s"] + ov["cluster_cpu_s"]) / res["cpus"] / f
            if "p2p" in variants and res["ferry_overlap_s"]:
                res["overlap_speedup_vs_p2p"] = res["p2p_s"] / res["ferry_overlap_s"]
        res["rollout_bytes"] = rollout_bytes
        res["pages_written"] = rollout_bytes // 4096
        res["p2p_plan"] = p2p_stats
        res["loadavg_start"], res["loadavg_end"] = list(load0), list(os.getloadavg())
        return res
    finally:
        if job is not None:
            job.stop()
        if cluster is not None:
            cluster.stop()
        shutil.rmtree(shm, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)


def human(res):
    """The summary of a result (three lines)."""
    names = {"torch_save": "torch.save", "gloo_bcast": "gloo broadcast", "p2p": "gloo p2p",
             "ferry_shard": "ferry shard", "ferry_overlap": "ferry overlapped"}
    vs = [v for v in VARIANTS if v + "_s" in res]
    steady = ", ".join(f"{names[v]} {res[v + '_s']:.3f} s (max {res[v + '_max_s']:.3f})" for v in vs)
    first = ", ".join(f"{names[v]} {res[v + '_first_s']:.3f} s" for v in vs)
    speed = ", ".join(f"{res[k]:.2f}x vs {n}" for k, n in (("speedup_vs_torch_save", "torch.save"),
                                                          ("speedup_vs_gloo", "gloo"), ("speedup_vs_p2p", "p2p"),
                                                          ("overlap_speedup_vs_p2p", "p2p, overlapped"))
                      if k in res)
    if "overlap_ratio" in res:
        speed += (f"; overlapped / publish-then-update {res['overlap_ratio']:.2f} "
                  f"({res['overlapped_rounds']:.0f} of {res['rounds']} steady rounds overlapped; "
                  f"its CPU seconds over {res['cpus']} CPUs allow {res['overlap_cpu_floor_ratio']:.2f} at best)")
    flt = res["faults"].get("ferry_shard", {})
    return (f"torch bench: {res['params'] / 1e6:.1f}M params ({res['model_bytes'] / 1e6:.0f} MB bf16, "
            f"{res['tensors']} tensors), {res['trainers']} trainers {res['src_layout']} -> {res['rollouts']} "
            f"rollouts {res['dst_layout']}; first touch {res['first_touch_gbps']:.2f} GB/s, warm memcpy "
            f"{res['warm_memcpy_gbps']:.2f} GB/s\n"
            f"  steady state, median of {res['rounds']} rounds: {steady}; speedup {speed or 'n/a'}\n"
            f"  first round: {first}; ferry minor faults per update: rollouts {flt.get('rollouts', 0):.0f}, "
            f"trainers {flt.get('trainers', 0):.0f} ({res['pages_written']} pages written); "
            f"{res['hash_checks']} parameter hashes equal to the trainers' model")


def _whole(x, least):
    try:
        n = int(x)
    except ValueError:
        n = least - 1
    if n < least:
        raise argparse.ArgumentTypeError(f"wants a whole number of at least {least}, not {x!r}")
    return n


def _positive(x):
    return _whole(x, 1)


def _count(x):
    return _whole(x, 0)


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--delta" in argv:   # deltas from the trainers against the dense update (ferry.bench_delta)
        from . import bench_delta
        return bench_delta.main([x for x in argv if x != "--delta"])
    if "--fp8" in argv:     # FP8 rollouts against the bf16 update (ferry.bench_fp8)
        from . import bench_fp8
        return bench_fp8.main([x for x in argv if x != "--fp8"])
    ap = argparse.ArgumentParser(prog="python3 -m ferry.bench_torch",
                                 description="A torch weight update, 4 FSDP trainers -> 4 TP2xDP2 rollouts: "
                                             "torch.save through /dev/shm, a gloo broadcast, gloo point-to-point "
                                             "from the shards into the parameters and ferry's shard publish + "
                                             "parameter-direct update, on the same shards.",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--rounds", type=_positive, default=5,
                    help="steady-state rounds after the first one (their median and max)")
    ap.add_argument("--warmup", type=_count, default=0,
                    help="rounds between the first and the steady ones: timed and checked, in rounds_s only "
                         "(the first round is always reported alone, as <variant>_first_s)")
    ap.add_argument("--hidden", type=_positive, help="the model's width", default=1024)
    ap.add_argument("--layers", type=_positive, help="transformer blocks", default=8)
    ap.add_argument("--ffn", type=_positive, help="the MLP's inner width", default=4096)
    ap.add_argument("--vocab", type=_positive, help="vocabulary size", default=15000)
    ap.add_argument("--ctx", type=_positive, help="context length (position embeddings)", default=1024)
    ap.add_argument("--timeout", type=_positive, default=600, help="seconds any one step may take")
    ap.add_argument("--cold", action="store_true",
                    help="skip ferry's warm-up before the first round (the first round then pays ferry's first "
                         "touches)")
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    ap.add_argument("--quiet", action="store_true", help="no per-round lines on stderr")
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help="the variants to run, comma-separated (a subset: for profiling; a speedup only where "
                         "its baseline and ferry_shard both ran)")
    o = ap.parse_args(argv)
    cfg = {"hidden": o.hidden, "layers": o.layers, "ffn": o.ffn, "vocab": o.vocab, "ctx": o.ctx}
    for k in ("hidden", "ffn", "vocab", "ctx"):
        if cfg[k] % (TRAINERS * 2):
            ap.error(f"--{k} must be a multiple of {TRAINERS * 2} (FSDP4 and TP2 cut it evenly), not {cfg[k]}")
    variants = tuple(v for v in o.variants.split(",") if v)
    bad = [v for v in variants if v not in VARIANTS]
    if bad or not variants:
        ap.error(f"--variants: {', '.join(bad) or 'none'} not among {', '.join(VARIANTS)}")
    log = None if o.quiet else (lambda s: print("ferry.bench_torch: " + s, file=sys.stderr, flush=True))
    try:
        res = run(cfg, o.rounds, o.warmup, o.timeout, log, variants, o.cold)
    except (RuntimeError, TimeoutError, OSError, ferry.Error) as e:
        print(f"ferry.bench_torch: {e}", file=sys.stderr)
        return 1
    print(json.dumps(res) if o.json else human(res), flush=True)
    return 0


if __name__ == "__main__":
    # The workers' targets are ferry.bench_torch's (the forkserver preloads it), not __main__'s:
    # nothing of this __main__ is to be re-run in them (multiprocessing would, and warn).
    sys.modules["__main__"].__spec__ = None
    del sys.modules["__main__"].__file__
    from ferry import bench_torch as _self
    sys.exit(_self.main())
