"""ferry.torch's model helpers (docs/python.md, "torch models"): role rules
and layouts, the name map, publishing a module whole and from layout
shards (full or sharded tensors per rank), the shard publish's refusals,
the subscriber's checks (shapes, dtypes, names, a re-bound parameter),
the streaming compatibility iterator and a sparse delta's fence. One
master and one node; ranks are threads with their own Store."""

import threading

import pytest

torch = pytest.importorskip("torch")

import ferry                              # noqa: E402
import ferry.torch as ft                  # noqa: E402
from ferry import weights                 # noqa: E402

import gpt_model as gm                    # noqa: E402
from conftest import cluster_fixture, run_threads   # noqa: E402

cluster = cluster_fixture(1, "torch_helpers")
RUN_S = 120.0


def _threads(fns):
    return run_threads(fns, RUN_S)


def _full(store, model):
    return {n: t for n, t in ft.update_compat(store, model)}


def test_roles_and_layout():
    assert ft.role_of("model.layers.0.self_attn.q_proj.weight", 2) == "column"
    assert ft.role_of("blocks.1.attn.o_proj.weight", 2) == "row"
    assert ft.role_of("blocks.1.attn.o_proj.bias", 1) == "replicated"    # added after the reduction
    assert ft.role_of("embed.weight", 2) == "vocab" and ft.role_of("lm_head.weight", 2) == "vocab"
    assert ft.role_of("blocks.0.ln1.weight", 1) == "replicated"
    assert ft.role_of("pos.weight", 2, roles={"pos.weight": "column"}) == "column"          # per tensor
    assert ft.role_of("w", 2, rules=[("w*", "row")]) == "row"
    with pytest.raises(ValueError, match="role 'diagonal' is not one of"):
        ft.role_of("w", 2, roles={"w": "diagonal"})
    pl = ft.build_layout("m", [("embed.weight", (8, 4), "f32"), ("blocks.0.attn.o_proj.weight", (4, 6), "f32"),
                               ("blocks.0.ln1.weight", (4,), "f32")], "tp:2,dp:2")
    assert pl.ranks == 4
    boxes = {(f["tensor"], f["rank"]): (f["offset"], f["shape"])
             for f in (pl.fragment(i) for i in range(pl.fragment_count))}
    assert boxes[(0, 1)] == ((4, 0), (4, 4)) and boxes[(0, 3)] == ((4, 0), (4, 4))   # vocab rows, DP replica
    assert boxes[(1, 1)] == ((0, 3), (4, 3))                                          # row: the input columns
    assert boxes[(2, 2)] == ((0,), (4,))                                              # replicated


def test_name_map():
    nm = ft.NameMap({"a": "x.q_proj.w", "drop": None}, stacked=gm.STACKED)
    assert nm.rename("a") == "x.q_proj.w" and nm.rename("b") == "b" and nm.rename("drop") is None
    assert nm.target("a") == ("x.qkv_proj.w", 0) and nm.target("drop") is None
    nm = ft.NameMap(gm.hf_name, gm.STACKED)
    assert nm.target("blocks.0.attn.v_proj.bias") == ("model.layers.0.self_attn.qkv_proj.bias", 2)
    assert nm.target("blocks.0.mlp.up_proj.weight") == ("model.layers.0.mlp.gate_up_proj.weight", 1)
    assert nm.target("blocks.0.attn.o_proj.weight") == ("model.layers.0.self_attn.o_proj.weight", None)
    with pytest.raises(TypeError):
        ft.NameMap(42)


def test_publish_module_whole_with_buffers(store):
    m = torch.nn.BatchNorm1d(3)
    with torch.no_grad():
        m.weight.copy_(torch.tensor([1.0, 2.0, 3.0]))
        m.running_mean.copy_(torch.tensor([0.5, -0.5, 0.25]))
    pub = ferry.WeightPublisher(store, "bn", 0, 1)
    ft.publish_module(pub, 1, m, buffers=True)
    got = _full(store, "bn")
    assert list(got) == ["weight", "bias", "running_mean", "running_var", "num_batches_tracked"]
    assert got["num_batches_tracked"].dtype == torch.int64      # an integer buffer, as it is
    assert torch.equal(got["weight"], m.weight.detach()) and torch.equal(got["running_mean"], m.running_mean)
    ft.publish_module(pub, 2, {"only": torch.arange(4.0)})     # a state dict
    assert list(_full(store, "bn")) == ["only"]


def test_publish_from_tp_shards(cluster, store):
    """tp:2: rank 0 passes the full tensors (its boxes cut out; the row
    parallel ones copied, not contiguous), rank 1 a TP-sharded module's
    boxes with the full shapes in ``shapes``; the generation reads back as
    the full tensors."""
    model = gm.GPT()
    full = {n: p.detach() for n, p in model.named_parameters()}
    placement = ft.build_layout("tpsh", [(n, tuple(t.shape), "f32") for n, t in full.items()], "tp:2")
    boxes = {}
    for i in range(placement.fragment_count):
        f = placement.fragment(i)
        if f["rank"] == 1:
            boxes[placement.tensor(f["tensor"])[0]] = (f["offset"], f["shape"])
    sharded = {}
    for n, t in full.items():
        off, shp = boxes[n]
        v = t
        for d, (o, k) in enumerate(zip(off, shp)):
            v = v.narrow(d, o, k)
        sharded[n] = v.clone()                                      # what a TP rank 1 holds
    shapes = {n: tuple(t.shape) for n, t in full.items()}
    stores = [cluster.store() for _ in range(2)]
    try:
        pubs = [ferry.WeightPublisher(stores[r], "tpsh", r, 2) for r in range(2)]
        res, err = _threads([lambda: ft.publish_module(pubs[0], 1, model, layout="tp:2"),
                             lambda: ft.publish_module(pubs[1], 1, sharded, layout="tp:2", shapes=shapes)])
        assert err == [None, None], err
        assert res[0]["bytes"] > 0 and res[1]["bytes"] > 0
        got = _full(store, "tpsh")
        assert list(got) == list(full)
        for n in full:
            assert torch.equal(got[n], full[n]), n
    finally:
        for s in stores:
            s.close()


def test_publish_module_plan_reused_and_renewed(cluster, store):
    """A rank's placement and views are made once and reused while its
    tensors stay the same (in-place optimizer steps are published, the
    row-parallel boxes copied afresh each time); a re-bound parameter makes
    a new plan, and its new values are what is published."""
    model = gm.GPT()
    full = lambda: {n: p.detach().clone() for n, p in model.named_parameters()}   # noqa: E731
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    placement = ft.build_layout("reuse", [(n, s, "f32") for n, s in shapes.items()], "tp:2")
    boxes = {}
    for i in range(placement.fragment_count):
        f = placement.fragment(i)
        if f["rank"] == 1:
            boxes[placement.tensor(f["tensor"])[0]] = (f["offset"], f["shape"])

    def cut(t, n):
        v = t
        for d, (o, k) in enumerate(zip(*boxes[n])):
            v = v.narrow(d, o, k)
        return v

    sharded = {n: cut(p.detach(), n).clone() for n, p in model.named_parameters()}
    stores = [cluster.store() for _ in range(2)]
    try:
        pubs = [ferry.WeightPublisher(stores[r], "reuse", r, 2) for r in range(2)]

        def publish(gen):
            _, err = _threads([lambda: ft.publish_module(pubs[0], gen, model, layout="tp:2"),
                               lambda: ft.publish_module(pubs[1], gen, sharded, layout="tp:2", shapes=shapes)])
            assert err == [None, None], err
            got, want = _full(store, "reuse"), full()
            for n in want:
                assert torch.equal(got[n], want[n]), (gen, n)

        publish(1)
        plans = [p._module_plan for p in pubs]
        with torch.no_grad():                       # an optimizer step, in place, on both ranks
            for n, p in model.named_parameters():
                p.add_(1.0)
                sharded[n].copy_(cut(p.detach(), n))
        publish(2)
        assert [p._module_plan for p in pubs] == plans and pubs[0]._module_plan is plans[0]   # reused
        name, param = next(iter(model.named_parameters()))
        param.data = param.data * 3.0 + 0.5         # re-bound: new storage
        sharded[name] = cut(param.detach(), name).clone()
        publish(3)
        assert pubs[0]._module_plan is not plans[0] and pubs[1]._module_plan is not plans[1]
    finally:
        for s in stores:
            s.close()


def test_publish_shards_refusals(cluster, store):
    """A buffer of the wrong size, another rank's fragment, a dtype that is
    not the tensor's: every rank raises the one message, nothing is
    announced, and the retry publishes."""
    placement = lambda: ft.build_layout("psr", [("w", (4, 4), "f32")], "fsdp:2")   # noqa: E731
    rows = torch.arange(16.0).view(4, 4)
    stores = [cluster.store() for _ in range(2)]
    try:
        pubs = [ferry.WeightPublisher(stores[r], "psr", r, 2, timeout_ms=60000) for r in range(2)]
        cases = [
            ([(0, rows[:2])], [(1, rows[2:3])], "rank 1: fragment 1 (w): the buffer holds 16 bytes; the fragment "
                                                "needs 32"),
            ([(0, rows[:2])], [(0, rows[:2])], "rank 1: mine[0]: fragment 0 (tensor w) is rank 0's, not this "
                                               "rank's (1)"),
            ([(0, rows[:2])], [(1, rows[2:].double())], "rank 1: fragment 1 (w): the buffer holds f64 elements; "
                                                         "the tensor is f32"),
        ]
        for mine0, mine1, msg in cases:
            _, err = _threads([lambda: pubs[0].publish_shards(1, placement(), mine0),
                               lambda: pubs[1].publish_shards(1, placement(), mine1)])
            assert all(isinstance(e, ferry.Error) for e in err), err
            assert [str(e) for e in err] == [f"publish of psr generation 1 failed: {msg}"] * 2
            assert isinstance(err[1].__cause__, ValueError)
            assert weights.active(store, "psr") is None
        res, err = _threads([lambda: pubs[0].publish_shards(1, placement(), [(0, rows[:2])]),
                             lambda: pubs[1].publish_shards(1, placement(), [(1, rows[2:])])])
        assert err == [None, None], err
        assert torch.equal(_full(store, "psr")["w"], rows)
    finally:
        for s in stores:
            s.close()


def _publish_gpt(store, name, gen, model):
    ft.publish_module(ferry.WeightPublisher(store, name, 0, 1), gen, model)


def test_subscriber_checks(store):
    model = gm.GPT()
    _publish_gpt(store, "subchk", 1, model)
    names = ft.NameMap(gm.hf_name, gm.STACKED)
    with pytest.raises(ValueError, match=r"parameter model.embed_tokens.weight has shape \[64, 32\]; layout "
                                         r"'tp:2,dp:2' gives rank 1 \[32, 32\] of embed.weight"):
        ft.Subscriber(store, "subchk", gm.VLLMGPT(1, 0), "tp:2,dp:2", 1, names=names)   # an unsharded module
    with pytest.raises(ValueError, match="parameter model.embed_tokens.weight is torch.bfloat16; tensor "
                                         "embed.weight is published as f32"):
        ft.Subscriber(store, "subchk", gm.VLLMGPT(2, 1, torch.bfloat16), "tp:2,dp:2", 1, names=names)
    with pytest.raises(ValueError, match="tensor embed.weight maps to embed.weight, which the module does not have"):
        ft.Subscriber(store, "subchk", gm.VLLMGPT(2, 1), "tp:2,dp:2", 1)          # no name map
    with pytest.raises(ValueError, match=r"rank 4 is not in layout 'tp:2,dp:2' \(4 ranks\)"):
        ft.Subscriber(store, "subchk", gm.VLLMGPT(2, 0), "tp:2,dp:2", 4, names=names)


def test_subscriber_rebound_parameter(store):
    """p.data = other after open: update raises StaleError naming it and
    writes neither storage; without the check the update would have gone
    into the old storage, which the parameter no longer uses."""
    model = gm.GPT()
    _publish_gpt(store, "rebind", 1, model)
    m = gm.VLLMGPT(2, 1)
    sub = ft.Subscriber(store, "rebind", m, "tp:2", 1, names=ft.NameMap(gm.hf_name, gm.STACKED))
    assert sub.update()["generation"] == 1
    gm.train_step(model)
    _publish_gpt(store, "rebind", 2, model)
    p = dict(m.named_parameters())["model.layers.0.self_attn.qkv_proj.weight"]
    old = p.data
    before = old.clone()
    p.data = torch.zeros_like(old)
    with pytest.raises(ferry.StaleError, match=r"parameter model.layers.0.self_attn.qkv_proj.weight was re-bound "
                                               r"after the subscriber opened \(p.data = ...\)") as e:
        sub.update()
    assert e.value.code < 0 and "nothing was written" in str(e.value)
    assert torch.equal(old, before) and not p.data.any() and sub.generation == 1
    weights.update_direct(store, "rebind", sub.shards, 1)              # what the check prevents:
    assert not torch.equal(old, before) and not p.data.any()           # the old storage written, p unchanged
    p.data = old
    assert sub.update()["generation"] == 2
    sub.close()


def test_subscriber_standby_overlapped(cluster, store):
    """Subscriber(standby=True) in a TP2 group of two: each update writes the
    copy the module does not hold and re-binds every parameter to it;
    update(next=G) started before G's publish takes it overlapped (after the
    group's first, plain, update), the module equal to the trainer's bits."""
    model = gm.GPT()
    names = ft.NameMap(gm.hf_name, gm.STACKED)
    mods = [gm.VLLMGPT(2, r) for r in range(2)]
    stores = [ferry.Store(master=cluster.addr, token_file=cluster.token_file, framework="torch") for _ in range(2)]
    _publish_gpt(store, "sbov", 1, model)
    subs = [ft.Subscriber(stores[r], "sbov", mods[r], "tp:2", r, group="sbov", names=names, standby=True)
            for r in range(2)]
    try:
        def want():
            return {n: gm.bits(p.detach()) for n, p in model.named_parameters()}

        def got():
            full = gm.vllm_to_trainer([dict(m.named_parameters()) for m in mods], 2)
            return {n: gm.bits(t) for n, t in full.items()}

        p0 = dict(mods[0].named_parameters())["model.embed_tokens.weight"]
        ptrs = [p0.data_ptr()]
        res, err = _threads([lambda s=s: s.update() for s in subs])
        assert err == [None, None], err
        assert got() == want() and [s.generation for s in subs] == [1, 1]
        ptrs.append(p0.data_ptr())
        for g in (2, 3):
            gm.train_step(model, seed=g)
            res, err = _threads([lambda s=s, g=g: s.update(next=g) for s in subs] +
                                [lambda g=g: _publish_gpt(store, "sbov", g, model)])
            assert err == [None] * 3, err
            assert [r["overlapped"] for r in res[:2]] == [True, True]
            assert got() == want() and [s.generation for s in subs] == [g, g]
            ptrs.append(p0.data_ptr())
            for s in subs:
                s.check()                       # a parameter on either of its copies is not re-bound
        assert ptrs[0] != ptrs[1] and ptrs[1] != ptrs[2] and ptrs[0] == ptrs[2] == ptrs[0] and ptrs[3] == ptrs[1]
        plain = ft.Subscriber(store, "sbov", gm.VLLMGPT(2, 0), "tp:2", 0, group="plain", names=names)
        with pytest.raises(ValueError, match=r"needs standby copies"):
            plain.update(next=4)
        plain.close()
        with pytest.raises(ValueError, match=r"standby copies need a group"):
            ft.Subscriber(store, "sbov", gm.VLLMGPT(2, 0), "tp:2", 0, names=names, standby=True)
    finally:
        for s in subs:
            s.close()
        for st in stores:
            st.close()


def test_weights_iterator_streams_and_stops(store):
    model = gm.GPT()
    _publish_gpt(store, "stream", 1, model)
    threads = threading.active_count()
    w = ft.weights(store, "stream", names={"embed.weight": "tok", "pos.weight": None})
    first = [next(w) for _ in range(3)]
    assert [n for n, _ in first] == ["tok", "blocks.0.ln1.weight", "blocks.0.ln1.bias"]   # pos dropped
    assert torch.equal(first[0][1], model.embed.weight.detach())
    w.close()                                   # the loader stopped: the update ends, its thread too
    assert threading.active_count() == threads
    w = ft.weights(store, "stream")
    assert len(list(w)) == len(gm._trainer_names()) and w.generation == 1 and w.stats["tensors"] == 41
    assert list(ft.weights(store, "stream", generation=1)) == []                          # current


def test_sparse_fence(store):
    """A delta whose base is not the parameters' generation changes nothing."""
    t = torch.arange(16.0).view(4, 4)
    ft.publish_module(ferry.WeightPublisher(store, "fence", 0, 1), 1, {"w": t})
    key, _ = ferry.put_sparse_object(store, "w", (4, 4), torch.tensor([[1, 2]]), torch.tensor([5.0]),
                                     generation=(7, 8), source_placement=("replicate", "tp"))
    dst = {"w": torch.zeros(4, 4)}
    sub = ft.Subscriber(store, "fence", dst, "tp:1", 0)
    sub.update()
    with pytest.raises(ferry.ConflictError, match="applies to generation 7; the parameters hold 1; nothing changed"):
        sub.apply_sparse([key])
    assert torch.equal(dst["w"], t) and sub.generation == 1
