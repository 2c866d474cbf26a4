"""ferry as a vLLM weight-transfer engine (ferry.vllm), driven the way vLLM
drives its engines: per worker the engine built with (config, vllm_config,
device, model), ``init_transfer_engine(parse_init_info(dict))`` once, then
per update ``start_weight_update()``, ``update_weights({"generation": G})``
and ``finish_weight_update()`` — vLLM's collective_rpc on every worker —
while the trainer's ``trainer_send_weights(pairs, trainer_args)`` runs at
the same time. vLLM is not installed here: its layerwise-reload module and
its post-load hook are stood in for by recorders (sys.modules), and
``register`` is given a factory of vLLM's shape.

Two rollout workers (TP2 halves of a vLLM-style GPT, one rollout group:
each byte read from the store once between them) and one trainer, 5
updates: every parameter bit-equal to the trainer's, the reload
bracketing every update; a generation held already, one never published
and a malformed update_info are refused with clear errors. The vLLM worker
extension's post-load processing and speculative drafter are checked
too."""

import sys
import threading
import types

import pytest

torch = pytest.importorskip("torch")

import ferry                              # noqa: E402
import ferry.adapters as fa               # noqa: E402
import ferry.vllm as fv                   # noqa: E402

import gpt_model as gm                    # noqa: E402
from conftest import cluster_fixture      # noqa: E402

cluster = cluster_fixture(1, "vllm_replay")
RUN_S = 120.0
UPDATES = 5


@pytest.fixture
def vllm_stand_ins(monkeypatch):
    """Recorders in place of vLLM's reload module and post-load hook."""
    events = []
    reload = types.ModuleType("vllm.model_executor.model_loader.reload")
    reload.initialize_layerwise_reload = lambda model: events.append(("init", model))
    reload.finalize_layerwise_reload = lambda model, cfg: events.append(("finalize", model, cfg))
    utils = types.ModuleType("vllm.model_executor.model_loader.utils")
    utils.process_weights_after_loading = lambda model, cfg, dev: events.append(("post", model, cfg, dev))
    for name in ("vllm", "vllm.model_executor", "vllm.model_executor.model_loader"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "vllm.model_executor.model_loader.reload", reload)
    monkeypatch.setitem(sys.modules, "vllm.model_executor.model_loader.utils", utils)
    return events


class _Recording(gm.VLLMGPT):
    """A vLLM-style model that also records when it loads."""

    def __init__(self, events, *a):
        super().__init__(*a)
        self._events = events

    def load_weights(self, weights):
        self._events.append(("load", self))
        return super().load_weights(weights)


def _trainer_pairs(model):
    """The trainer's weights as vLLM's checkpoint names and bf16 tensors."""
    for n, p in model.named_parameters():
        yield gm.hf_name(n), p.detach().to(torch.bfloat16)


def test_vllm_weight_transfer_engine_replayed(cluster, vllm_stand_ins):
    events = vllm_stand_ins
    trainer = gm.GPT()
    cfg = types.SimpleNamespace(backend="ferry")                  # WeightTransferConfig(backend="ferry")
    models, engines = [], []
    for rank in range(2):
        vcfg = types.SimpleNamespace(model_config=types.SimpleNamespace(name=f"mc{rank}"),
                                     parallel_config=types.SimpleNamespace(rank=rank))
        m = _Recording(events, 2, rank, torch.bfloat16)
        e = fv.FerryWeightTransferEngine(cfg, vcfg, torch.device("cpu"), m)
        e.init_transfer_engine(e.parse_init_info({"master": cluster.addr, "token_file": cluster.token_file,
                                                  "model": "vllm-tx", "group": "tx", "world_size": 2,
                                                  "timeout_ms": 60000}))
        models.append(m)
        engines.append(e)
    try:
        for step in range(1, UPDATES + 1):
            gm.train_step(trainer, seed=step)
            del events[:]
            errors = []

            def send(step=step):
                try:
                    fv.FerryWeightTransferEngine.trainer_send_weights(
                        _trainer_pairs(trainer), {"generation": step, "master": cluster.addr,
                                                  "token_file": cluster.token_file, "model": "vllm-tx"})
                except BaseException as e:   # noqa: B902 - reported below
                    errors.append(e)

            def worker(e):
                try:   # vLLM's three collective_rpc calls of one update
                    e.start_weight_update()
                    e.update_weights({"generation": step})
                    e.finish_weight_update()
                except BaseException as x:   # noqa: B902 - reported below
                    errors.append(x)

            ts = [threading.Thread(target=worker, args=(e,)) for e in engines] + [threading.Thread(target=send)]
            for t in ts:   # the receives start before (or with) the send, as vLLM and a trainer run them
                t.start()
            for t in ts:
                t.join(RUN_S)
            assert not any(t.is_alive() for t in ts), "an update did not finish in time"
            for x in errors:
                raise x
            assert [e.generation for e in engines] == [step, step]
            full = gm.vllm_to_trainer([dict(m.named_parameters()) for m in models], 2)
            assert {n: gm.bits(t) for n, t in full.items()} == \
                {n: gm.bits(p.detach().to(torch.bfloat16)) for n, p in trainer.named_parameters()}
            for m, e in zip(models, engines):   # vLLM's reload brackets the whole update
                mine = [x[0] for x in events if x[1] is m]
                assert mine[0] == "init" and mine[-1] == "finalize" and set(mine[1:-1]) == {"load"}, mine
                fin = [x for x in events if x[0] == "finalize" and x[1] is m]
                assert fin[0][2] is e.model_config
        # refusals, with the group still whole afterwards
        with pytest.raises(ferry.StaleError, match=f"generation {UPDATES} of vllm-tx was asked for; this worker "
                                                   f"holds generation {UPDATES} already"):
            engines[0].update_weights({"generation": UPDATES})
        with pytest.raises(ValueError, match="Invalid update_info"):
            engines[0].update_weights({"gen": UPDATES + 1})
        lone = fv.FerryWeightTransferEngine(cfg, types.SimpleNamespace(model_config=None), None, models[0])
        with pytest.raises(RuntimeError, match="init_weight_transfer_engine was not called"):
            lone.start_weight_update()
        lone.init_transfer_engine({"master": cluster.addr, "token_file": cluster.token_file, "model": "vllm-tx",
                                   "timeout_ms": 300})
        with pytest.raises(ferry.TimeoutError, match=f"generation {UPDATES + 7} of vllm-tx was not announced"):
            lone.update_weights({"generation": UPDATES + 7})
        lone.shutdown()
    finally:
        for e in engines:
            e.shutdown()


def test_vllm_register():
    class Factory:   # vLLM's WeightTransferEngineFactory: register_engine(name, module, class)
        _registry = {}

        @classmethod
        def register_engine(cls, name, module, class_name):
            if name in cls._registry:
                raise ValueError(f"Weight transfer engine '{name}' is already registered.")
            cls._registry[name] = (module, class_name)

    assert fv.register(Factory) is True
    assert Factory._registry["ferry"] == ("ferry.vllm", "FerryWeightTransferEngine")
    assert fv.register(Factory) is True                 # once is enough
    mod, cls = Factory._registry["ferry"]
    assert getattr(sys.modules[mod], cls) is fv.FerryWeightTransferEngine


class _Worker(fa.WorkerExtension):
    """A vLLM worker as its extension sees it, with speculative decoding."""

    def __init__(self, model, drafter=None):
        self.model_runner = types.SimpleNamespace(model=model, drafter=types.SimpleNamespace(model=drafter),
                                                  speculative_config=object() if drafter is not None else None)
        self.rank = 0
        self.model_config = types.SimpleNamespace(name="mc")
        self.device = torch.device("cpu")


def test_worker_extension_post_load_and_drafter(cluster, vllm_stand_ins):
    """After load_weights, vLLM's process_weights_after_loading runs on the
    model (and on the drafter, which takes the same tensors), with the
    worker's model_config and device."""
    events = vllm_stand_ins
    trainer = gm.GPT()
    with ferry.Store(master=cluster.addr, token_file=cluster.token_file) as s:
        pub = ferry.WeightPublisher(s, "vllm-ext", 0, 1, out_dtype="bf16")
        pub.publish(3, [(n, p.detach()) for n, p in trainer.named_parameters()])
    main, draft = _Recording(events, 1, 0, torch.bfloat16), _Recording(events, 1, 0, torch.bfloat16)
    w = _Worker(main, draft)
    w.init_ferry(master=cluster.addr, token_file=cluster.token_file, model="vllm-ext", names=gm.hf_name)
    try:
        assert w.update_weights_from_ferry() == 3
    finally:
        w.close_ferry()
    want = {n: gm.bits(p.detach().to(torch.bfloat16)) for n, p in trainer.named_parameters()}
    for m in (main, draft):
        got = gm.vllm_to_trainer([dict(m.named_parameters())], 1)
        assert {n: gm.bits(t) for n, t in got.items()} == want
    post = [x for x in events if x[0] == "post"]
    assert [x[1] for x in post] == [main, draft]
    assert all(x[2] is w.model_config and x[3] is w.device for x in post)
    assert events.index(post[0]) > max(i for i, x in enumerate(events) if x[0] == "load")   # after every load
