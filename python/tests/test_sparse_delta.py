"""The delta encoder from torch (docs/sparse.md, "Deltas from a trainer"):
ferry.torch.publish_delta with a ferry.sparse.DeltaEncoder per trainer rank.
Two FSDP ranks (threads, each with its own Store) train the GPT test model
with real Adam steps and publish every generation through their encoders
(f32 held, bf16 published); a rollout (ferry.torch.Subscriber over a bf16
copy of the module) follows the chain after every generation and holds
exactly the trainer's parameters cast to bf16, bit for bit. The first
generation is dense, a large step goes dense by the crossover, the chain is
cut after max_chain deltas; a rank whose layout changed fails the
generation on both ranks with nothing stored, and a reset encoder
publishes dense. One master and one node."""


import pytest

torch = pytest.importorskip("torch")

import ferry                              # noqa: E402
import ferry.torch as ft                  # noqa: E402

import gpt_model as gm                    # noqa: E402
from conftest import cluster_fixture, run_threads   # noqa: E402

cluster = cluster_fixture(1, "sparse_delta")
RUN_S = 120.0
WORLD = 2


def _ranks(fns):
    return run_threads(fns, RUN_S)


def _bits_equal(rollout, trainer):
    """Every rollout parameter is the trainer's cast to bf16, bit for bit."""
    want = {n: p.detach().to(torch.bfloat16) for n, p in trainer.named_parameters()}
    for n, p in rollout.named_parameters():
        assert gm.bits(p) == gm.bits(want[n]), n


class _Trainers:
    def __init__(self, c, name, layout="fsdp:2", **enc):
        self.stores = [c.store() for _ in range(WORLD)]
        self.pubs = [ferry.WeightPublisher(self.stores[r], name, r, WORLD, out_dtype="bf16", timeout_ms=20000)
                     for r in range(WORLD)]
        self.encs = [ferry.sparse.DeltaEncoder(p, **enc) for p in self.pubs]
        self.layout = layout

    def publish(self, gen, model, layouts=None):
        layouts = layouts or [self.layout] * WORLD
        return _ranks([lambda r=r: ft.publish_delta(self.encs[r], gen, model, layouts[r]) for r in range(WORLD)])

    def close(self):
        for e in self.encs:
            e.close()
        for s in self.stores:
            s.close()


def test_delta_chain_exact(cluster, store):
    model = gm.GPT()
    rollout = gm.GPT().to(torch.bfloat16)
    for p in rollout.parameters():
        p.data.zero_()
    tr = _Trainers(cluster, "gptd", crossover=0.2, max_chain=3)
    sub = None
    try:
        kinds, fractions = [], []
        for gen in range(1, 9):
            if gen > 1:   # a real Adam step; generation 4 a large one
                gm.train_step(model, lr=0.05 if gen == 4 else 1e-5, seed=gen)
            res, err = tr.publish(gen, model)
            assert err == [None, None], err
            assert res[0]["kind"] == res[1]["kind"]
            assert res[0]["total_changed"] == res[0]["changed"] + res[1]["changed"]
            kinds.append(res[0]["kind"])
            fractions.append(res[0]["total_changed"] / res[0]["total_elements"])
            if sub is None:   # opened once a generation is announced
                sub = ft.Subscriber(store, "gptd", rollout, "tp:1", 0)
            sub.update()
            assert sub.generation == gen
            _bits_equal(rollout, model)
            if gen == 7:   # a fresh rollout rebuilds from the chain: dense 4, deltas 5, 6, 7
                fresh = gm.GPT(seed=3).to(torch.bfloat16)
                sub2 = ft.Subscriber(store, "gptd", fresh, "tp:1", 0)
                st = sub2.update()
                assert st["dense_generation"] == 4 and st["deltas"] == 3, st
                _bits_equal(fresh, model)
                sub2.close()
        print("kinds", kinds, "changed fractions", [round(f, 4) for f in fractions])
        # lr 1e-5 moves about 5 % of the bf16 values of this small model;
        # lr 0.05 nearly all of them: above the crossover (0.2)
        assert kinds == ["dense_first", "sparse", "sparse", "dense_fraction", "sparse", "sparse", "sparse",
                         "dense_chain"]
        assert tr.encs[0].snapshot_bytes + tr.encs[1].snapshot_bytes == \
            sum(p.numel() for p in model.parameters()) * 2

        # bad input: rank 1 now places the tensors by tp:2 (its boxes
        # changed): both ranks refused, nothing stored, 8 stays active
        gm.train_step(model, lr=1e-5, seed=7)
        res, err = tr.publish(9, model, layouts=["fsdp:2", "tp:2"])
        assert all(isinstance(e, ferry.Error) for e in err), err
        for e in err:
            assert "rank 1: its piece" in str(e) and "nothing stored" in str(e), str(e)
        assert ferry.weights.active(store, "gptd")[0] == 8
        # reset: the next publish is dense and takes the layout given
        for e in tr.encs:
            e.reset()
            assert e.snapshot_bytes == 0
        res, err = tr.publish(9, model, layouts=["tp:2", "tp:2"])
        assert err == [None, None], err
        assert res[0]["kind"] == "dense_first"
        sub.update()
        _bits_equal(rollout, model)
    finally:
        if sub is not None:
            sub.close()
        tr.close()


def test_delta_encoder_refusals(store):
    pub = ferry.WeightPublisher(store, "gptr", 0, 1)
    with pytest.raises(ferry.Error, match="max_chain"):
        ferry.sparse.DeltaEncoder(pub, max_chain=1000)
    with pytest.raises(ferry.Error, match="crossover"):
        ferry.sparse.DeltaEncoder(pub, crossover=-1.0)
    enc = ferry.sparse.DeltaEncoder(pub)
    with pytest.raises(ValueError, match="layout"):
        ft.publish_delta(enc, 1, gm.GPT(), None)
    enc.close()
    with pytest.raises(ValueError, match="closed"):
        enc.reset()


def _tp_module(placement, rank, names):
    """A bf16 module whose parameters are rollout ``rank``'s boxes of the
    placement (dotted names as the trainer's)."""
    boxes = {}
    for i in range(placement.fragment_count):
        f = placement.fragment(i)
        if f["rank"] == rank:
            boxes[f["tensor"]] = (tuple(f["offset"]), tuple(f["shape"]))
    root = torch.nn.Module()
    for ti, name in enumerate(names):
        *path, leaf = name.split(".")
        m = root
        for part in path:
            if part not in m._modules:
                m.add_module(part, torch.nn.Module())
            m = m._modules[part]
        m.register_parameter(leaf, torch.nn.Parameter(torch.zeros(boxes[ti][1], dtype=torch.bfloat16),
                                                      requires_grad=False))
    return root, boxes


def test_delta_real_model_tp2_dp2(cluster, store):
    """Ten generations of real Adam steps published as deltas (a large step
    dense by the crossover, the chain cut by K = 4) into four rollouts in
    TP2 x DP2 (each a Subscriber of one group over its TP boxes), every
    parameter bit-equal to the trainer's cast to bf16 after every
    generation; rollout 3 restarted after generation 7 rebuilds from the
    chain (dense 5, deltas 6 and 7)."""
    model = gm.GPT()
    # sparse keys carry no model: this model's tensors get names of their own
    state = {"r4." + n: p for n, p in model.named_parameters()}
    names = list(state)
    specs = [(n, tuple(p.shape), "bf16") for n, p in state.items()]
    placement = ft.build_layout("gptr4", specs, "tp:2,dp:2")
    tr = _Trainers(cluster, "gptr4", crossover=0.2, max_chain=4)
    rstores = [cluster.store() for _ in range(4)]
    mods, boxes = zip(*[_tp_module(placement, r, names) for r in range(4)])
    mods, subs = list(mods), [None] * 4

    def check():
        full = {n: p.detach().to(torch.bfloat16) for n, p in state.items()}
        for r in range(4):
            for ti, (n, p) in enumerate(mods[r].named_parameters()):
                assert n == names[ti]
                want = full[n]
                for d, (o, k) in enumerate(zip(*boxes[r][ti])):
                    want = want.narrow(d, o, k)
                assert gm.bits(p) == gm.bits(want), (r, n)

    try:
        kinds = []
        for gen in range(1, 11):
            if gen > 1:
                gm.train_step(model, lr=0.05 if gen == 5 else 1e-5, seed=gen)
            res, err = tr.publish(gen, state)
            assert err == [None, None], err
            kinds.append(res[0]["kind"])
            if subs[0] is None:
                subs = [ft.Subscriber(rstores[r], "gptr4", mods[r], "tp:2,dp:2", r, group="g4", tensors=specs,
                                      timeout_ms=20000) for r in range(4)]
            if gen == 8:   # rollout 3 restarted after 7: a fresh module and subscriber
                subs[3].close()
                mods[3], _ = _tp_module(placement, 3, names)
                subs[3] = ft.Subscriber(rstores[3], "gptr4", mods[3], "tp:2,dp:2", 3, group="g4",
                                        tensors=specs, timeout_ms=20000)
                st = subs[3].update(alone=True)
                assert st["dense_generation"] == 5 and st["deltas"] == 3, st   # dense 5, deltas 6, 7, 8
            res, err = _ranks([lambda r=r: subs[r].update() for r in range(4)])
            assert err == [None] * 4, err
            assert all(s.generation == gen for s in subs)
            check()
        print("kinds", kinds)
        assert kinds == ["dense_first", "sparse", "sparse", "sparse", "dense_fraction", "sparse", "sparse",
                         "sparse", "sparse", "dense_chain"]
    finally:
        for s in subs:
            if s is not None:
                s.close()
        for s in rstores:
            s.close()
        tr.close()
