"""ferry.bench_torch: a torch weight update through ferry against what users
do today, on the same shards in one run (docs/weights.md, "Against
torch.save and gloo"; ``ferry bench weights --torch`` runs it).

``python3 -m ferry.bench_torch [--json] [--rounds 5] [--warmup 1]
[--hidden 1024] [--layers 8] [--ffn 4096] [--vocab 15000] [--ctx 1024]``

A GPT-style model (the tensors of python/tests/gpt_model.py's GPT, scaled
up: about 166 M parameters, 332 MB in bf16 by default) is held by 4 trainer
processes as FSDP dim-0 shards (``fsdp:4``: every tensor cut along dim 0;
each rank's shards are views into one flat buffer, as FSDP keeps them) and
is wanted by 4 rollout processes in TP2 x DP2 (``tp:2,dp:2``: torch
parameters of their TP boxes, the role rules of ferry.torch). Each round the
trainers fill their shards with new values, then three updates run back to
back, in an order that rotates from round to round:

- ``torch_save``: gather the shards to trainer 0 (gloo), which rebuilds the
  full tensors and ``torch.save``s them into /dev/shm; a gloo broadcast
  tells the rollouts, each ``torch.load``s the file and copies its TP
  slices into its parameters;
- ``gloo_bcast``: gather the shards to trainer 0, which broadcasts them
  (gloo, every rank's shards as one buffer) to the rollouts, each copying
  its slices out of them;
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
The reported figure per variant is the median over the rounds after the
warm-up ones.

Processes: the parent starts a ferry cluster with ``ferry up`` (FERRY_BIN,
else ``ferry`` next to build/python, else on PATH) in a temporary
directory, and the 8 workers through a forkserver (torch imported once);
gloo uses loopback only (GLOO_SOCKET_IFNAME=lo, a FileStore rendezvous).
Everything started is stopped on exit, also on failure.
"""

import argparse
import hashlib
import json
import multiprocessing
import os
import queue
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
VARIANTS = ("torch_save", "gloo_bcast", "ferry_shard")
POISON = -3.0
START_S = 120.0        # deadline for the cluster to come up (a bound, not a measure)


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
        process's CPU clock, all its threads, for cpu())."""
        dist.barrier()
        self.cpu0 = time.process_time()
        return time.monotonic()

    def cpu(self):
        return time.process_time() - self.cpu0

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
                os.rename(path + ".tmp", path)
                ph["save_s"] = time.monotonic() - t1
                dist.broadcast(torch.tensor([rnd]), 0, group=c.bcast_group)   # "the file is there"
        elif variant == "gloo_bcast":
            gather()
            ph["gather_s"] = time.monotonic() - t0
            if rank == 0:
                t1 = time.monotonic()
                for g in gathered:
                    dist.broadcast(_u8(g), 0, group=c.bcast_group)
                ph["bcast_s"] = time.monotonic() - t1
        else:
            st = ft.publish_module(pub, gen, module, layout=SRC_LAYOUT, shapes=L.shapes)
            ph["publish_s"] = time.monotonic() - t0
            ph.update({"publish." + k: v for k, v in st.items() if k.endswith("_s")})
        return {"t0": t0, "cpu_s": c.cpu(), "phases": ph}

    _serve(("trainer", rank), cmd, out, {"round": new_round, "run": run})
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
        ph = {}
        if variant == "torch_save":
            t0 = c.start()
            note = torch.zeros(1, dtype=torch.int64)
            dist.broadcast(note, 0, group=c.bcast_group)
            t1 = time.monotonic()
            ph["wait_s"] = t1 - t0
            sd = torch.load(os.path.join(a["shm_dir"], f"weights-{int(note[0])}.pt"))
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
        t_end, cpu = time.monotonic(), c.cpu()
        return {"t0": t0, "t1": t_end, "cpu_s": cpu, "phases": ph, "params": [digest(p) for p in params]}

    _serve(("rollout", rank), cmd, out, {"run": run})
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

    def cpu_s(self):
        """CPU seconds the master and the node (the children of ferry up) have used so far."""
        total = 0
        try:
            kids = set()
            for tid in os.listdir(f"/proc/{self.proc.pid}/task"):
                with open(f"/proc/{self.proc.pid}/task/{tid}/children") as f:
                    kids.update(f.read().split())
            for pid in kids:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                total += int(fields[11]) + int(fields[12])     # utime, stime (fields 14, 15)
        except OSError:
            return 0.0
        return total / os.sysconf("SC_CLK_TCK")

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


def run(cfg, rounds=5, warmup=1, timeout_s=600, log=None, variants=VARIANTS):
    """Run the benchmark; returns the result dict (the JSON). ``log``: a
    callable taking progress lines (default: none); ``variants``: a subset
    to run (for profiling one of them; the speedups need all three)."""
    log = log or (lambda s: None)
    if rounds < 1 or warmup < 0:
        raise ValueError("rounds must be at least 1 and warmup at least 0")
    L = Layout(cfg)
    model_bytes = 2 * L.params
    load0 = os.getloadavg()
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
        times = {v: [] for v in VARIANTS}
        phases = {v: [] for v in VARIANTS}
        checks = 0
        gen = 0
        for rnd in range(1, warmup + rounds + 1):
            got = job.ask(trainers, "round", rnd)
            want_shards, want = expected(L, rnd)
            for (_, r), v in got.items():
                if v["shards"] != want_shards[r]:
                    raise RuntimeError(f"round {rnd}: trainer {r}'s shards differ from the values computed here")
            order = [v for v in VARIANTS[rnd % 3:] + VARIANTS[:rnd % 3] if v in variants]
            for variant in order:
                gen += variant == "ferry_shard"
                ccpu = cluster.cpu_s()
                got = job.ask(trainers + rollouts, "run", variant, rnd, gen)
                ccpu = cluster.cpu_s() - ccpu
                checks += _check(L, variant, rnd, got, want)
                t = max(v["t1"] for w, v in got.items() if w[0] == "rollout") - min(v["t0"] for v in got.values())
                ph = {"cpu_s": sum(v["cpu_s"] for v in got.values()), "cluster_cpu_s": ccpu}
                for _, v in got.items():
                    for k, x in v["phases"].items():
                        ph[k] = max(ph.get(k, 0.0), x)
                log(f"round {rnd}{' (warm-up)' if rnd <= warmup else ''}: {variant} {t:.3f} s "
                    f"({', '.join(f'{k} {x:.3f}' for k, x in ph.items())})")
                if rnd > warmup:
                    times[variant].append(t)
                    phases[variant].append(ph)
        res = {"params": L.params, "model_bytes": model_bytes, "tensors": len(L.names), "trainers": TRAINERS,
               "rollouts": ROLLOUTS, "src_layout": SRC_LAYOUT, "dst_layout": DST_LAYOUT, "rounds": rounds,
               "warmup": warmup, "config": cfg}
        for v in variants:
            res[v + "_s"] = _median(times[v])
        if set(variants) == set(VARIANTS):
            res["speedup_vs_torch_save"] = res["torch_save_s"] / res["ferry_shard_s"] if res["ferry_shard_s"] else 0.0
            res["speedup_vs_gloo"] = res["gloo_bcast_s"] / res["ferry_shard_s"] if res["ferry_shard_s"] else 0.0
        res["hashes_ok"] = True
        res["hash_checks"] = checks
        res["rounds_s"] = {v: times[v] for v in variants}
        res["phases_s"] = {v: {k: _median([p[k] for p in phases[v]]) for k in (phases[v][0] if phases[v] else {})}
                           for v in variants}
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
    """The one-line summary of a result."""
    return (f"torch bench: {res['params'] / 1e6:.1f}M params ({res['model_bytes'] / 1e6:.0f} MB bf16, "
            f"{res['tensors']} tensors), {res['trainers']} trainers {res['src_layout']} -> {res['rollouts']} "
            f"rollouts {res['dst_layout']}, median of {res['rounds']} rounds: torch.save {res['torch_save_s']:.3f} s, "
            f"gloo broadcast {res['gloo_bcast_s']:.3f} s, ferry shard {res['ferry_shard_s']:.3f} s; "
            f"speedup {res['speedup_vs_torch_save']:.2f}x vs torch.save, {res['speedup_vs_gloo']:.2f}x vs gloo; "
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
    ap = argparse.ArgumentParser(prog="python3 -m ferry.bench_torch",
                                 description="A torch weight update, 4 FSDP trainers -> 4 TP2xDP2 rollouts: "
                                             "torch.save through /dev/shm, a gloo broadcast and ferry's shard "
                                             "publish + parameter-direct update, on the same shards.",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--rounds", type=_positive, default=5, help="timed rounds (the medians)")
    ap.add_argument("--warmup", type=_count, default=1, help="rounds before them, checked but not timed")
    ap.add_argument("--hidden", type=_positive, help="the model's width", default=1024)
    ap.add_argument("--layers", type=_positive, help="transformer blocks", default=8)
    ap.add_argument("--ffn", type=_positive, help="the MLP's inner width", default=4096)
    ap.add_argument("--vocab", type=_positive, help="vocabulary size", default=15000)
    ap.add_argument("--ctx", type=_positive, help="context length (position embeddings)", default=1024)
    ap.add_argument("--timeout", type=_positive, default=600, help="seconds any one step may take")
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    ap.add_argument("--quiet", action="store_true", help="no per-round lines on stderr")
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help="the variants to run, comma-separated (one alone: for profiling; no speedups then)")
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
        res = run(cfg, o.rounds, o.warmup, o.timeout, log, variants)
    except (RuntimeError, TimeoutError, OSError, ferry.Error) as e:
        print(f"ferry.bench_torch: {e}", file=sys.stderr)
        return 1
    print(json.dumps(res) if o.json or "speedup_vs_gloo" not in res else human(res), flush=True)
    return 0


if __name__ == "__main__":
    # The workers' targets are ferry.bench_torch's (the forkserver preloads it), not __main__'s:
    # nothing of this __main__ is to be re-run in them (multiprocessing would, and warn).
    sys.modules["__main__"].__spec__ = None
    del sys.modules["__main__"].__file__
    from ferry import bench_torch as _self
    sys.exit(_self.main())
