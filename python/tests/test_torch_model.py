"""A real model through ferry (docs/python.md, "torch models"): a GPT-style
decoder (gpt_model.py) trained by 4 trainer processes and served by 4
rollout processes in TP2 x DP2, against a private master and node.

Trainers publish generations 1 and 2 (one Adam step between them) from
their FSDP4 shards (``ferry.torch.publish_module(..., layout="fsdp:4")``),
as f32 ("gpt") and as bf16 ("gpt16"). Every rollout updates
parameter-direct into the f32 torch parameters of a vLLM-style module
(fused qkv_proj / gate_up_proj, TP-sharded; ``ferry.torch.Subscriber``, a
single-pull group) and through compatibility mode into the bf16 one's
``load_weights`` (``ferry.adapters.WorkerExtension``, a CompatGroup). A
third model ("gpt8") is published with FP8 rules (every projection in
f8e4m3, 16 x 16 blocks; quantized once by the trainers, whose FSDP shards cut
blocks) into a third group of the same rollouts: FP8 weights (uint8
parameters on a torch without float8) and ``*_scale_inv`` parameters of
the fused vLLM-style module (``Subscriber(..., quant=...)``). Every FP8
byte and scale equals, bit for bit, a numpy quantizer of the documented
formula (fp8_ref.py) over the trainers' weights, and so do the weights
dequantized by ``ferry.torch.dequantize_fp8``, generation after
generation and after the restart. Each rollout then rebuilds the full weights from its TP pair (through the
store) and computes logits on a fixed input: equal to the trainers'
reference bit for bit in f32, and to the reference cast to bf16 in bf16.
A rollout killed with SIGKILL and restarted loads the active generation
alone, with no republish; a sparse delta (generation 3) applied to the
torch parameters equals the trainers' dense result.

Exact equality is asked of the rebuilt full weights, not of a TP forward:
a row-parallel layer's all-reduce sums in another order than the
trainers' matmul, so its f32 logits differ in the last bits whatever the
transfer did."""

import multiprocessing
import os
import signal
import time
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import ferry                              # noqa: E402
import ferry.adapters                     # noqa: E402
import ferry.torch as ft                  # noqa: E402
from ferry import weights                 # noqa: E402

import gpt_model as gm                    # noqa: E402
from conftest import cluster_fixture      # noqa: E402
from fp8_ref import dequant, ref_fp8_blocks   # noqa: E402
from jobs import Job                      # noqa: E402

cluster = cluster_fixture(1, "torch_model")
RUN_S = 240.0          # deadline for every reply of a worker (a generous bound, not a measure)
TIMEOUT_MS = 120000
TRAINERS, ROLLOUTS, LAYOUT = 4, 4, "tp:2,dp:2"
FP8_BLOCK = (16, 16)     # FSDP4 shards of 8 or 16 rows cut them; TP2 boxes hold whole ones
FP8_RULES = {"include": "*_proj.weight", "block": FP8_BLOCK}


def _ctx():
    """forkserver with torch, ferry and this module preloaded: each worker is
    a fork of a process that imported them once (an import of torch takes
    many seconds on a loaded machine)."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "ferry", "ferry.torch", "ferry.adapters", "gpt_model", __name__])
    return ctx


def _reply(out, who, fn):
    try:
        out.put((who, fn()))
    except BaseException as e:   # noqa: B902 - the parent reports it
        import traceback
        out.put((who, "ERROR " + "".join(traceback.format_exception(type(e), e, e.__traceback__))[-3000:]))


# ---- trainers -------------------------------------------------------------------------------

def _delta(model, seed=7, per_tensor=5):
    """A sparse delta of a few entries of every 2-dim tensor: {name: (indices, values)}."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, p in model.named_parameters():
        if p.dim() != 2:
            continue
        idx = torch.stack([torch.randint(0, p.shape[d], (per_tensor,), generator=g) for d in range(2)], 1)
        idx = torch.unique(idx, dim=0)
        out[name] = (idx, torch.randn(idx.shape[0], generator=g) * 0.01)
    return out


def _trainer(addr, token_file, rank, cmd, out):
    torch.set_num_threads(1)
    model = gm.GPT()
    with ferry.Store(master=addr, token_file=token_file) as s:
        pubs = [ferry.WeightPublisher(s, "gpt", rank, TRAINERS, timeout_ms=TIMEOUT_MS),
                ferry.WeightPublisher(s, "gpt16", rank, TRAINERS, out_dtype="bf16", timeout_ms=TIMEOUT_MS),
                ferry.WeightPublisher(s, "gpt8", rank, TRAINERS, out_dtype="bf16", timeout_ms=TIMEOUT_MS,
                                      quant=FP8_RULES)]

        def publish(gen):
            st = [ft.publish_module(p, gen, model, layout="fsdp:4") for p in pubs]
            with torch.no_grad():
                ref = gm.forward(dict(model.named_parameters()), gm.TOKENS)
                ref16 = gm.forward({n: p.bfloat16() for n, p in model.named_parameters()}, gm.TOKENS)
            sd = {n: p.detach().numpy().copy() for n, p in model.named_parameters()} if rank == 0 else None
            return {"stats": st, "ref": gm.bits(ref), "ref16": gm.bits(ref16), "sd": sd}

        def sparse():
            delta = _delta(model)
            keys = {}
            with torch.no_grad():
                for name, (idx, val) in delta.items():
                    p = dict(model.named_parameters())[name]
                    if ferry.sparse_admit(s, name, tuple(p.shape), (2, 3), ("replicate", "tp"), rank=rank):
                        keys[name], _ = ferry.put_sparse_object(s, name, tuple(p.shape), idx, val, generation=(2, 3),
                                                                source_placement=("replicate", "tp"))
                    p.index_put_(tuple(idx.t()), val, accumulate=True)     # the dense result
                ref = gm.forward(dict(model.named_parameters()), gm.TOKENS)
            return {"keys": keys, "ref": gm.bits(ref)}

        def first():
            # the documented warm-up (docs/weights.md, "Warm memory") before generation 1
            warmed = [ft.warm_publisher(p, model, layout="fsdp:4") for p in pubs]
            return dict(publish(1), warmed=warmed)

        _reply(out, ("trainer", rank), first)
        assert cmd.get(timeout=RUN_S) == "step"
        _reply(out, ("trainer", rank), lambda: (gm.train_step(model), publish(2))[1])
        assert cmd.get(timeout=RUN_S) == "sparse"
        _reply(out, ("trainer", rank), sparse)


# ---- rollouts -------------------------------------------------------------------------------

class _Worker(ferry.adapters.WorkerExtension):
    """What a vLLM worker gives its extension: model_runner.model and rank."""

    def __init__(self, model, rank):
        self.model_runner = types.SimpleNamespace(model=model)
        self.rank = rank


def _rollout(addr, token_file, rank, restarted, cmd, out):
    torch.set_num_threads(1)
    tp, dp = rank % 2, rank // 2
    m32 = gm.VLLMGPT(2, tp, torch.float32)
    m16 = gm.VLLMGPT(2, tp, torch.bfloat16)
    m8 = gm.VLLMGPT(2, tp, torch.bfloat16, fp8_block=FP8_BLOCK)
    ptrs = {n: p.data_ptr() for n, p in m32.named_parameters()}
    with ft.Store(master=addr, token_file=token_file) as s:
        sub = ft.Subscriber(s, "gpt", m32, LAYOUT, rank, group="direct", names=ft.NameMap(gm.hf_name, gm.STACKED),
                            timeout_ms=TIMEOUT_MS)
        sub8 = ft.Subscriber(s, "gpt8", m8, LAYOUT, rank, group="fp8", names=ft.NameMap(gm.hf_name, gm.STACKED),
                             timeout_ms=TIMEOUT_MS, quant=FP8_RULES)
        w = _Worker(m16, rank)
        w.init_ferry(store=s, model="gpt16", group="compat", world_size=ROLLOUTS, names=gm.hf_name,
                     staging_bytes=1 << 20, timeout_ms=TIMEOUT_MS)
        alone = restarted
        warmed = sub.warm()

        def update():
            nonlocal alone
            st = sub.update(alone=alone)
            g16 = w.update_weights_from_ferry(alone=alone)
            st8 = sub8.update(alone=alone)
            alone = False
            p8, p16 = dict(m8.named_parameters()), dict(m16.named_parameters())
            fp8 = {n: p.detach().numpy().copy() for n, p in p8.items() if n.endswith(("_proj.weight", "_scale_inv"))}
            deq = {n: ft.dequantize_fp8(p8[n], p8[n + "_scale_inv"], FP8_BLOCK).numpy() for n in p8
                   if n + "_scale_inv" in p8}
            return {"generation": sub.generation, "gen16": g16, "gen8": sub8.generation, "fp8": fp8, "deq": deq,
                    "bytes_read8": st8["bytes_read"], "group_bytes_read8": st8.get("group_bytes_read"),
                    "fp8_bf16_same": all(torch.equal(p, p16[n]) for n, p in p8.items() if n not in fp8),
                    "fp8_u8": all(p8[n].dtype == torch.uint8 for n in deq),
                    "bytes_read": st["bytes_read"],
                    "warmed": warmed, "faults": st["faults"],
                    "group_bytes_read": st.get("group_bytes_read"),
                    "same_storage": all(p.data_ptr() == ptrs[n] for n, p in m32.named_parameters())}

        def logits(tag):
            """Logits from the full weights rebuilt with the TP peer's shards."""
            peer = dp * 2 + (1 - tp)
            for kind, m in (("f32", m32), ("bf16", m16)):     # one object per module: few round trips
                s.put_tensor(f"x/{tag}/{kind}/{rank}", torch.cat([p.detach().reshape(-1).view(torch.uint8)
                                                                 for _, p in m.named_parameters()]))
            s.barrier(f"x/{tag}/{dp}", str(rank), 2, TIMEOUT_MS)
            res = {"generation": sub.generation}
            for kind, m in (("f32", m32), ("bf16", m16)):
                mine = {n: p.detach() for n, p in m.named_parameters()}
                flat, theirs, at = ft.get_tensor(s, f"x/{tag}/{kind}/{peer}"), {}, 0
                for n, p in mine.items():
                    nb = p.numel() * p.element_size()
                    theirs[n] = flat[at:at + nb].view(p.dtype).view(p.shape)
                    at += nb
                full = gm.vllm_to_trainer([mine, theirs] if tp == 0 else [theirs, mine], 2)
                with torch.no_grad():
                    res[kind] = gm.bits(gm.forward(full, gm.TOKENS))
            s.barrier(f"x/{tag}/{dp}/read", str(rank), 2, TIMEOUT_MS)   # the peer read mine
            return res

        def sparse(keys):
            gen, counters = sub.apply_sparse(keys)
            return {"generation": gen, "entries": counters["entries_kept"]}

        while True:
            c = cmd.get(timeout=RUN_S)
            if c[0] == "exit":
                break
            fn = {"update": update, "logits": lambda: logits(c[1]), "sparse": lambda: sparse(c[1]),
                  "rebind": lambda: _rebind(sub, m32)}[c[0]]
            _reply(out, ("rollout", rank), fn)
        sub.close()
        sub8.close()
        w.close_ferry()


def _rebind(sub, m):
    """p.data = other after open: the next update must refuse, naming it."""
    p = dict(m.named_parameters())["model.layers.1.self_attn.o_proj.weight"]
    old = p.data
    p.data = p.data.clone()
    try:
        sub.update(alone=True)
        return "no error"
    except ferry.StaleError as e:
        return str(e)
    finally:
        p.data = old


# ---- the test -------------------------------------------------------------------------------

def _check_fp8(got, sd, gen):
    """Every rollout's FP8 bytes and scales equal the numpy reference's of
    the trainers' weights, bit for bit, and their dequantized weights equal
    the reference's q * s; the other parameters equal the bf16 group's."""
    for (_, rank), v in got.items():
        assert v["gen8"] == gen and v["fp8_u8"] and v["fp8_bf16_same"], (rank, v["gen8"])
        want = gm.fp8_expected(sd, 2, rank % 2, lambda x: ref_fp8_blocks(x, FP8_BLOCK))
        assert sorted(v["fp8"]) == sorted(want)
        for n, w in want.items():
            assert v["fp8"][n].dtype == w.dtype and np.array_equal(v["fp8"][n].view(np.uint8), w.view(np.uint8)), \
                f"rollout {rank}: {n} differs from the reference at generation {gen}"
            if not n.endswith("_scale_inv"):
                assert np.array_equal(v["deq"][n], dequant(w, want[n + "_scale_inv"], FP8_BLOCK), equal_nan=True), \
                    f"rollout {rank}: {n} dequantized differs from the reference at generation {gen}"


def _check_logits(got, refs, gen):
    for who, v in got.items():
        assert v["generation"] == gen, (who, v["generation"])
        assert v["f32"] == refs["ref"], f"{who}: f32 logits differ from the trainers' at generation {gen}"
        assert v["bf16"] == refs["ref16"], f"{who}: bf16 logits differ from the reference cast to bf16"


def test_gpt_trainers_to_tp2_dp2_rollouts(cluster, store):
    t0 = time.monotonic()
    ctx = _ctx()
    job = Job(ctx, cluster, RUN_S)
    trainers = [("trainer", r) for r in range(TRAINERS)]
    rollouts = [("rollout", r) for r in range(ROLLOUTS)]
    try:
        for w in trainers:
            job.start(w, _trainer)
        pub1 = job.replies(trainers)
        ref1 = pub1[trainers[0]]
        assert all(v["ref"] == ref1["ref"] for v in pub1.values())        # the trainers agree
        st = pub1[trainers[0]]["stats"][0]
        assert st["total_tensors"] == len(gm._trainer_names())
        assert sum(v["stats"][0]["bytes"] for v in pub1.values()) == st["total_bytes"]
        assert all(v["stats"][0]["bytes"] > 0 for v in pub1.values())     # every FSDP rank stored its quarter
        # the warm-up touched the staging and this machine's segment (whole), publish counts its faults
        assert all(min(v["warmed"]) > 0 and v["stats"][0]["faults"] >= 0 for v in pub1.values()), pub1
        for w in rollouts:
            job.start(w, _rollout, False)
        job.send(rollouts, ("update",))
        up1 = job.replies(rollouts)
        assert all(v["generation"] == 1 and v["gen16"] == 1 and v["same_storage"] for v in up1.values()), up1
        _check_fp8(up1, ref1["sd"], 1)
        st8 = pub1[trainers[0]]["stats"][2]
        assert st8["total_bytes"] < pub1[trainers[0]]["stats"][1]["total_bytes"]   # FP8 below bf16
        assert all(v["group_bytes_read8"] == st8["total_bytes"] for v in up1.values())   # single-pull
        # single-pull: the group read each published byte once
        assert sum(v["bytes_read"] for v in up1.values()) == st["total_bytes"]
        assert all(v["group_bytes_read"] == st["total_bytes"] for v in up1.values())
        assert all(v["warmed"] > 0 and v["faults"] >= 0 for v in up1.values()), up1
        job.send(rollouts, ("logits", "g1"))
        _check_logits(job.replies(rollouts), ref1, 1)

        job.send(trainers, "step")
        pub2 = job.replies(trainers)
        ref2 = pub2[trainers[0]]
        assert ref2["ref"] != ref1["ref"]                                   # the step changed the model
        job.send(rollouts, ("update",))
        up2 = job.replies(rollouts)
        assert all(v["generation"] == 2 and v["gen16"] == 2 and v["same_storage"] for v in up2.values()), up2
        _check_fp8(up2, ref2["sd"], 2)
        job.send(rollouts, ("logits", "g2"))
        _check_logits(job.replies(rollouts), ref2, 2)

        # p.data re-bound after open: refused, naming the parameter, nothing written
        job.send([rollouts[0]], ("rebind",))
        msg = job.replies([rollouts[0]])[rollouts[0]]
        assert "model.layers.1.self_attn.o_proj.weight was re-bound" in msg, msg

        # a rollout killed and restarted: the active generation, no republish
        victim = rollouts[3]
        os.kill(job.procs[victim].pid, signal.SIGKILL)
        job.procs[victim].join(30)
        assert job.procs[victim].exitcode == -signal.SIGKILL
        active = weights.active(store, "gpt")
        job.start(victim, _rollout, True)
        job.send([victim], ("update",))
        up = job.replies([victim])[victim]
        assert up["generation"] == 2 and up["gen16"] == 2 and up["bytes_read"] > 0, up
        _check_fp8({victim: up}, ref2["sd"], 2)
        assert weights.active(store, "gpt") == active                       # nothing was republished
        job.send([rollouts[2], victim], ("logits", "restart"))
        _check_logits(job.replies([rollouts[2], victim]), ref2, 2)

        # a sparse delta 2 -> 3 applied to the torch parameters = the dense result
        job.send(trainers, "sparse")
        sp = job.replies(trainers)
        keys = sorted(k for v in sp.values() for k in v["keys"].values())
        assert len(keys) == sum(1 for n in gm._trainer_names() if n.endswith("weight")
                                and not any(x in n for x in ("ln", "norm")))   # each 2-dim tensor once
        ref3 = sp[trainers[0]]
        assert all(v["ref"] == ref3["ref"] for v in sp.values())
        job.send(rollouts, ("sparse", keys))
        applied = job.replies(rollouts)
        assert all(v["generation"] == 3 and v["entries"] > 0 for v in applied.values()), applied
        job.send(rollouts, ("logits", "g3"))
        got = job.replies(rollouts)
        for who, v in got.items():
            assert v["generation"] == 3 and v["f32"] == ref3["ref"], f"{who}: the sparse result differs"
    finally:
        job.stop()
    print(f"\nreal model: {len(gm._trainer_names())} tensors, {st['total_bytes']} bytes f32; "
          f"{TRAINERS} trainers (fsdp:4), {ROLLOUTS} rollouts ({LAYOUT}); generations 1, 2, restart, sparse 3: "
          f"logits exact in f32 and bf16, FP8 bytes, scales and dequantized weights equal the numpy reference's; {time.monotonic() - t0:.1f} s")
