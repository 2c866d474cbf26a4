"""ferry.adapters against torch models implementing the frameworks'
contracts (docs/adapters.md): verl's checkpoint-engine lifecycle
(prepare, build_topology, init_process_group, send_weights on trainer
ranks, receive_weights on rollout ranks, finalize; async and sync), and a
vLLM-style worker whose extension's update_weights_from_ferry feeds
model.load_weights(weights=...). Ranks are threads with their own Store."""

import asyncio
import threading
import types

import pytest

torch = pytest.importorskip("torch")

import ferry                              # noqa: E402
import ferry.adapters as fa               # noqa: E402
import ferry.torch as ft                  # noqa: E402

import gpt_model as gm                    # noqa: E402
from conftest import cluster_fixture      # noqa: E402
from jobs import Registry                 # noqa: E402

cluster = cluster_fixture(1, "adapters")
RUN_S = 120.0
TIMEOUT_MS = 60000


def _threads(fns):
    """Run each fn in its own thread; their results, or raise the first error."""
    res, err = [None] * len(fns), [None] * len(fns)

    def run(i):
        try:
            res[i] = fns[i]()
        except BaseException as e:   # noqa: B902 - re-raised below
            err[i] = e
    ts = [threading.Thread(target=run, args=(i,)) for i in range(len(fns))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(RUN_S)
    assert not any(t.is_alive() for t in ts), "a rank did not finish in time"
    for e in err:
        if e is not None:
            raise e
    return res


def _state_bits(sd):
    return {n: gm.bits(t) for n, t in sd.items()}


def test_verl_checkpoint_engine(cluster):
    """Two trainer ranks send, two rollout ranks (TP2, one group) receive,
    twice (a step between): each rollout's load_weights gets every tensor,
    the rebuilt weights equal the trainer's bit for bit, async on step 1 and
    sync on step 2."""
    model = gm.GPT()
    trainer_engines = [fa.CheckpointEngine(master=cluster.addr, token_file=cluster.token_file, model="verl")
                       for _ in range(2)]
    rollout_engines = [fa.CheckpointEngine(1 << 20, master=cluster.addr, token_file=cluster.token_file,
                                           model="verl", group="verl-rollout", names=gm.hf_name) for _ in range(2)]
    rollouts = [gm.VLLMGPT(2, r) for r in range(2)]
    try:
        for step, mode in ((1, "async"), (2, "sync")):
            if step == 2:
                gm.train_step(model)
            meta = [e.prepare() for e in trainer_engines + rollout_engines]
            tk, rk = fa.CheckpointEngine.build_topology(2, 2, meta)
            for i, e in enumerate(trainer_engines):
                e.init_process_group(**{k: v[i] for k, v in tk.items()})
            for i, e in enumerate(rollout_engines):
                e.init_process_group(**{k: v[i] for k, v in rk.items()})

            def send(e):
                def per_tensor():     # verl's get_per_tensor_param: a generator of full tensors
                    for n, p in model.named_parameters():
                        yield n, p.detach()
                if mode == "async":
                    return asyncio.run(e.send_weights(per_tensor()))
                return e.send_weights_sync(per_tensor())

            def receive(e, m):
                if mode == "async":
                    async def go():
                        got = []
                        async for name, t in e.receive_weights():
                            got.append(name)
                            m.load_weights([(name, t)])
                        return got
                    return asyncio.run(go())
                names = []

                def seen(ws):
                    for n, t in ws:
                        names.append(n)
                        yield n, t
                it = e.receive_weights_sync()
                m.load_weights(seen(it))
                assert it.generation == step and it.stats["tensors"] == len(names)
                return names

            sent = _threads([lambda e=e: send(e) for e in trainer_engines])
            assert all(k.startswith("ferry/") for st in sent for k in st)           # verl merges them into metrics
            assert sum(st["ferry/tensors"] for st in sent) == len(gm._trainer_names())   # each stored once
            got = _threads([lambda e=e, m=m: receive(e, m) for e, m in zip(rollout_engines, rollouts)])
            want = [gm.hf_name(n) for n, _ in model.named_parameters()]
            assert got == [want, want]
            for e in trainer_engines + rollout_engines:
                assert e.generation == step
                e.finalize()
            full = gm.vllm_to_trainer([dict(m.named_parameters()) for m in rollouts], 2)
            assert _state_bits(full) == _state_bits(dict(model.named_parameters()))
    finally:
        for e in trainer_engines + rollout_engines:
            e.close()


def test_verl_receive_waits_and_never_repeats(cluster):
    """A receive named by verl's step waits for that step's generation
    (step + 1): started before the send, it gets the new weights, never the
    ones before; asked again for a step it had, StaleError; for a step
    nobody sends, TimeoutError naming the generation, after timeout_ms."""
    kw = dict(master=cluster.addr, token_file=cluster.token_file, model="verl-wait")
    tr = fa.CheckpointEngine(is_master=True, **kw)
    ro = fa.CheckpointEngine(2 << 30, timeout_ms=TIMEOUT_MS, **kw)
    assert ro.staging_bytes == 256 << 20 and fa.CheckpointEngine.staging_of(0) == 256 << 20
    assert fa.CheckpointEngine.staging_of(2 << 30, 1 << 20) == 1 << 20
    assert fa.CheckpointEngine.generation_of(0) == 1
    with pytest.raises(ValueError):
        fa.CheckpointEngine.generation_of(-1)
    try:
        tr.init_process_group(rank=0, world_size=1, role="trainer")
        ro.init_process_group(rank=0, world_size=1, role="rollout")
        for step in range(3):
            value = float(step + 1)
            started = threading.Event()

            def receive(value=value, step=step):
                async def go():
                    out = {}
                    agen = ro.receive_weights(global_steps=step)
                    started.set()
                    async for name, t in agen:
                        out[name] = t.clone()
                    return out
                return asyncio.run(go())

            def send(step=step, value=value):
                assert started.wait(RUN_S)          # the receive is under way before the send starts
                w = {"a": torch.full((64, 32), value), "b": torch.full((7,), -value)}
                return asyncio.run(tr.send_weights(iter(w.items()), global_steps=step))

            got, st = _threads([receive, send])
            assert tr.generation == ro.generation == step + 1 and st["ferry/total_tensors"] == 2
            assert torch.equal(got["a"], torch.full((64, 32), value)) and torch.equal(got["b"], torch.full((7,), -value))
            ro.finalize()                           # verl's finalize after every step: the generation stays
            ro.init_process_group(rank=0, world_size=1, role="rollout")
        with pytest.raises(ferry.StaleError, match="already received generation 3"):
            ro.receive_weights_sync(global_steps=1)
        quick = fa.CheckpointEngine(timeout_ms=300, **kw)
        quick.init_process_group(rank=0, world_size=1, role="rollout")
        quick.generation = 3
        with pytest.raises(ferry.TimeoutError, match="generation 9 of verl-wait was not announced within 300 ms"):
            quick.receive_weights_sync(global_steps=8)
        quick.close()
    finally:
        tr.close()
        ro.close()


def test_verl_registers_as_backend():
    """ferry.verl registers "ferry" in a registry shaped like verl's
    CheckpointEngineRegistry, as a subclass of its abstract base too; an
    instance made the way verl makes one is ferry's engine."""
    import abc
    import ferry.verl as fv

    class Base(abc.ABC):                     # verl's abstract CheckpointEngine: its abstract methods
        for _m in ("prepare", "init_process_group", "finalize", "send_weights", "receive_weights"):
            locals()[_m] = abc.abstractmethod(lambda self, *a, **k: None)

    cls = fv.register(Registry, Base)
    assert Registry._registry[fv.BACKEND] is cls and fv.BACKEND == "ferry"
    eng = Registry.new("ferry", is_master=True, bucket_size=2048 << 20, model="m", group="g")
    assert isinstance(eng, Base) and isinstance(eng, fa.CheckpointEngine)
    assert eng.staging_bytes == 256 << 20 and eng.is_master
    with pytest.raises(TypeError):
        Registry.new("ferry", bucket_size=0, no_such_kwarg=1)     # a misspelt engine_kwargs key is named


class _Worker(fa.WorkerExtension):
    """A vLLM worker as its extension sees it: model_runner.model, rank."""

    def __init__(self, model, rank=0):
        self.model_runner = types.SimpleNamespace(model=model)
        self.rank = rank


def test_vllm_worker_extension(cluster, store):
    """update_weights_from_ferry loads the active generation through
    load_weights(weights=...), reports it, loads nothing when current, and
    refuses another generation than the one asked for."""
    model = gm.GPT()
    pub = ferry.WeightPublisher(store, "vllm", 0, 1, out_dtype="bf16")
    ft.publish_module(pub, 5, model)
    calls = []

    class Recording(gm.VLLMGPT):
        def load_weights(self, weights):
            calls.append(type(weights).__name__)
            return super().load_weights(weights)

    w = _Worker(Recording(1, 0, torch.bfloat16))
    w.init_ferry(master=cluster.addr, token_file=cluster.token_file, model="vllm", names=gm.hf_name)
    try:
        assert w.ferry_generation() == 0
        assert w.update_weights_from_ferry() == 5
        assert calls == ["Weights"]                      # one call, a streaming iterator
        full = gm.vllm_to_trainer([dict(w.model_runner.model.named_parameters())], 1)
        assert _state_bits(full) == _state_bits({n: p.bfloat16() for n, p in model.named_parameters()})
        assert w.update_weights_from_ferry() == 5 and calls == ["Weights"]   # current: nothing loaded
        with pytest.raises(ferry.StaleError, match="generation 4 of vllm was asked for; the active one is 5"):
            w.update_weights_from_ferry(generation=4)
        gm.train_step(model)
        ft.publish_module(pub, 6, model)

        class Stops(gm.VLLMGPT):
            def load_weights(self, weights):
                next(iter(weights))                     # takes one tensor and returns
        w2 = _Worker(Stops(1, 0, torch.bfloat16))
        w2.init_ferry(store=store, model="vllm", names=gm.hf_name)
        with pytest.raises(RuntimeError, match="load_weights returned before taking every tensor"):
            w2.update_weights_from_ferry()
        assert w2.ferry_generation() == 0
        assert w.update_weights_from_ferry(generation=6) == 6
        full = gm.vllm_to_trainer([dict(w.model_runner.model.named_parameters())], 1)
        assert _state_bits(full) == _state_bits({n: p.bfloat16() for n, p in model.named_parameters()})
    finally:
        w.close_ferry()
