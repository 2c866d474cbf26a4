"""ferry.sparse against a real cluster (one `ferry master`, one `ferry
node`, FERRY_BIN): put + read + apply equals the dense oracle (W_old +
delta, or the set values) exactly; the RFC's acceptance counters (a non-EP
weight read by EP2 x TP2 targets on one node: one source object, no full
get, two unique range gets); an EP expert reaches only its EP rank;
idempotent put and owner admission; the base fence raises and leaves the
array unchanged; bad input raises with a clear message."""

import numpy as np
import pytest

import ferry
from conftest import cluster_fixture
from ferry.sparse import COUNTERS, Target

cluster = cluster_fixture(1, "sparse")
_seq = iter(range(1, 1 << 30))


@pytest.fixture(scope="module")
def s1(cluster):
    s = cluster.store(lease_ms=1)
    yield s
    s.close()


def _tid(name):
    """A tensor id no other test of the module uses (objects are write-once)."""
    return f"{name}.{next(_seq)}"


def _delta(rng, shape, density, dtype=np.float32):
    """Distinct random coordinates and small-integer values (exact in every dtype)."""
    n = int(np.prod(shape))
    nnz = max(1, int(n * density))
    flat = rng.choice(n, size=nnz, replace=False)
    idx = np.stack(np.unravel_index(flat, shape), axis=1).astype(np.int64)
    val = rng.integers(-8, 9, size=nnz).astype(np.float32)
    val[val == 0] = 3
    return idx, val


def _bf16(a):
    """float32 -> bf16 words (exact for the small integers used here)."""
    return (np.asarray(a, np.float32).view(np.uint32) >> 16).astype(np.uint16)


def _from_bf16(w):
    return (np.asarray(w, np.uint16).astype(np.uint32) << 16).view(np.float32)


def _boxes(shape, ep, tp, axis=0):
    """EP x TP targets: TP splits `axis`, every EP replica holds the whole split."""
    out = []
    step = shape[axis] // tp
    for e in range(ep):
        for t in range(tp):
            off = [0] * len(shape)
            sh = list(shape)
            off[axis], sh[axis] = t * step, step
            out.append(Target("", 0, e, tuple(off), tuple(sh)))
    return out


def _named(targets, tid):
    return [Target(tid, t.node, t.axis_index, t.offset, t.shape) for t in targets]


def _local(w, t):
    return w[tuple(slice(o, o + s) for o, s in zip(t.offset, t.shape))]


# ---- put, read, apply against the dense oracle -------------------------------------------------

@pytest.mark.parametrize("vdt,idt", [("f32", np.int64), ("bf16", np.int32), ("f16", np.int64)])
def test_put_read_apply_equals_oracle(s1, vdt, idt):
    rng = np.random.default_rng(7)
    shape = (192, 320)
    tid = _tid("w")
    w_old = rng.integers(-50, 51, size=shape).astype(np.float32)
    idx, val = _delta(rng, shape, 0.03)
    vals = {"f32": val, "bf16": _bf16(val), "f16": val.astype(np.float16)}[vdt]
    key, desc = ferry.put_sparse_object(s1, tid, shape, idx.astype(idt), vals, generation=(4, 5),
                                        source_placement=("replicate", "ep"), tile_shape=(64, 64))
    assert key.startswith(f"ferry/sp/{tid}/") and key.endswith("/rep-ep")
    assert desc["nnz"] == len(val) and desc["tile"] == (64, 64) and desc["value_dtype"] == vdt
    assert desc["placement"] == {"kind": "replicate", "axis": "ep", "owner": 0}
    assert desc["index_dtype"] == ("i32" if idt == np.int32 else "i64") and desc["ntiles"] >= 1
    # TP2 splitting columns at 160 cuts the middle tile column: boundary filtering
    targets = _named(_boxes(shape, 2, 2, axis=1), tid)
    results, counters = ferry.read_sparse_objects(s1, [key], targets)
    assert len(results) == 4
    want = w_old.copy()
    np.add.at(want, tuple(idx.T), val)
    for r in results:
        t = targets[r.target]
        assert r.tensor_id == tid and r.shape == t.shape and r.apply == "scatter_add"
        assert (r.base_generation, r.delta_generation) == (4, 5)
        assert r.indices.dtype == np.int64 and r.indices.shape == (r.nnz, 2)
        local = np.ascontiguousarray(_local(w_old, t))
        assert ferry.sparse_apply(r, local, 4) == 5
        np.testing.assert_array_equal(local, _local(want, t))
    assert counters["entries_kept"] == 2 * len(val)      # every entry reaches both EP replicas
    assert counters["boundary_filtered"] > 0
    assert counters["full_indices_values_get_count"] == 0


def test_scatter_set_into_bf16_any_generation(s1):
    rng = np.random.default_rng(11)
    shape = (40, 24, 8)
    tid = _tid("set3d")
    idx, val = _delta(rng, shape, 0.1)
    key, desc = ferry.put_sparse_object(s1, tid, shape, idx.astype(np.int32), val.astype(np.float16),
                                        generation=(1, 2), source_placement=("owner", "ep", 0), apply="scatter_set")
    assert desc["apply"] == "scatter_set" and key.endswith("/own-ep-0")
    t = Target(tid, 0, 0, (8, 0, 0), (32, 24, 8))
    (r,), c = ferry.read_sparse_objects(s1, key, [t])
    dense = _bf16(np.full(t.shape, 100.0, np.float32))
    assert ferry.sparse_apply(r, dense, 99, dense_dtype="bf16") == 2   # scatter_set: no fence
    want = np.full(shape, 100.0, np.float32)
    want[tuple(idx.T)] = val
    np.testing.assert_array_equal(_from_bf16(dense), want[8:])
    assert c["non_ep_source_object_count"] == 0 and c["source_objects"] == 1


# ---- counters ---------------------------------------------------------------------------------

def test_acceptance_counters_non_ep_ep2_tp2(s1):
    """The RFC's acceptance case: 1, 0, 2 — and every counter is there."""
    rng = np.random.default_rng(3)
    shape = (1024, 2048)
    tid = _tid("shared.w")
    idx, val = _delta(rng, shape, 0.01)
    key, _ = ferry.put_sparse_object(s1, tid, shape, idx, _bf16(val), generation=(7, 8),
                                     source_placement=("replicate", "ep"))
    targets = [{"tensor_id": tid, "node": 0, "axis_index": t.axis_index, "offset": t.offset, "shape": t.shape}
               for t in _boxes(shape, 2, 2, axis=0)]
    results, c = ferry.read_sparse_objects(s1, [key], targets)
    assert set(c) == set(COUNTERS)
    assert c["non_ep_source_object_count"] == 1
    assert c["full_indices_values_get_count"] == 0
    assert c["unique_range_gets"] == 2
    assert c["dedup_hits"] == 2 and c["entries_read"] == len(val) and c["entries_kept"] == 2 * len(val)
    assert len(results) == 4 and sum(r.nnz for r in results) == 2 * len(val)
    # again: the index comes from the cache
    _, c2 = ferry.read_sparse_objects(s1, [key], targets)
    assert c2["index_cache_hits"] == 1 and c2["index_gets"] == 0 and c2["unique_range_gets"] == 2


def test_ep_expert_reaches_only_its_ep_rank(s1):
    rng = np.random.default_rng(5)
    shape = (256, 384)
    tid = _tid("experts.3.w1")
    idx, val = _delta(rng, shape, 0.02)
    key, _ = ferry.put_sparse_object(s1, tid, shape, idx, val, generation=(1, 2), source_placement=("owner", "ep", 1),
                                     tile_shape=(64, 128))
    targets = _named(_boxes(shape, 2, 2, axis=0), tid)
    results, c = ferry.read_sparse_objects(s1, [key], targets)
    assert sorted(targets[r.target].axis_index for r in results) == [1, 1]
    assert c["non_ep_source_object_count"] == 0 and c["full_indices_values_get_count"] == 0
    assert sum(r.nnz for r in results) == len(val)


def test_publish_prefix(s1):
    rng = np.random.default_rng(9)
    shape = (64, 64)
    tid = _tid("pub")
    idx, val = _delta(rng, shape, 0.05)
    key, _ = ferry.put_sparse_object(s1, tid, shape, idx, val, generation=(1, 2), source_placement=("replicate", ""))
    prefix = f"test/sparse/{tid}"
    (r,), _ = ferry.read_sparse_objects(s1, [key], [Target(tid, 0, 0, (0, 0), shape)], publish_prefix=prefix)
    np.testing.assert_array_equal(s1.read_member(f"{prefix}/0/{tid}", "indices"), r.indices)
    np.testing.assert_array_equal(s1.read_member(f"{prefix}/0/{tid}", "values"), r.values)


# ---- idempotence, admission -------------------------------------------------------------------

def test_put_is_idempotent_and_admission_picks_one(s1):
    tid = _tid("idem")
    idx = np.array([[0, 1], [2, 3]], np.int64)
    key, _ = ferry.put_sparse_object(s1, tid, (4, 4), idx, np.array([1, 2], np.float32), generation=(1, 2),
                                     source_placement=("replicate", "ep"))
    with pytest.raises(ferry.ExistsError, match="already exists"):
        ferry.put_sparse_object(s1, tid, (4, 4), idx, np.array([5, 6], np.float32), generation=(1, 2),
                                source_placement=("replicate", "ep"))
    (r,), _ = ferry.read_sparse_objects(s1, [key], [Target(tid, 0, 0, (0, 0), (4, 4))])
    np.testing.assert_array_equal(r.values, [1, 2])   # the first content stays
    args = (tid, (4, 4), (2, 3), ("replicate", "ep"))
    assert ferry.sparse_admit(s1, *args, rank=0) is True
    assert ferry.sparse_admit(s1, *args, rank=1) is False
    assert ferry.sparse_admit(s1, *args, rank=0) is True     # the winner may retry
    assert ferry.sparse_admit(s1, tid, (4, 4), (3, 4), ("replicate", "ep"), rank=1) is True


# ---- the fence, bad input ---------------------------------------------------------------------

def test_base_fence_raises_and_leaves_the_array(s1):
    tid = _tid("fence")
    idx = np.array([[1, 1], [2, 0]], np.int64)
    key, _ = ferry.put_sparse_object(s1, tid, (4, 4), idx, np.array([1, 2], np.float32), generation=(7, 8),
                                     source_placement=("replicate", "ep"))
    (r,), _ = ferry.read_sparse_objects(s1, [key], [Target(tid, 0, 0, (0, 0), (4, 4))])
    dense = np.arange(16, dtype=np.float32).reshape(4, 4)
    before = dense.copy()
    with pytest.raises(ferry.ConflictError, match=r"base generation 7 but the buffer holds generation 4") as e:
        ferry.sparse_apply(r, dense, 4)
    assert e.value.code < 0 and "nothing changed" in str(e.value)
    np.testing.assert_array_equal(dense, before)
    assert ferry.sparse_apply(r, dense, 7) == 8
    assert dense[1, 1] == before[1, 1] + 1 and dense[2, 0] == before[2, 0] + 2


def test_bad_input_raises_clearly_and_stores_nothing(s1):
    tid = _tid("bad")
    ok_idx = np.array([[0, 0]], np.int64)
    ok_val = np.array([1], np.float32)
    put = ferry.put_sparse_object
    rep = ("replicate", "ep")
    with pytest.raises(ferry.Error, match=r"indices\[1\] = \(-1, 2\) is outside the shape \(4, 4\)"):
        put(s1, tid, (4, 4), np.array([[0, 0], [-1, 2]], np.int64), np.array([1, 2], np.float32), (1, 2), rep)
    with pytest.raises(ferry.Error, match="outside the shape"):
        put(s1, tid, (4, 4), np.array([[4, 0]], np.int32), ok_val, (1, 2), rep)
    with pytest.raises(ValueError, match="values must be float32, float16 or bf16"):
        put(s1, tid, (4, 4), ok_idx, np.array([1], np.float64), (1, 2), rep)
    with pytest.raises(ValueError, match="indices must be int32 or int64"):
        put(s1, tid, (4, 4), ok_idx.astype(np.uint8), ok_val, (1, 2), rep)
    with pytest.raises(ValueError, match="nnz must match"):
        put(s1, tid, (4, 4), np.zeros((3, 2), np.int64), ok_val, (1, 2), rep)
    with pytest.raises(ValueError, match=r"indices must be \[nnz, 2\]"):
        put(s1, tid, (4, 4), np.zeros((1, 3), np.int64), ok_val, (1, 2), rep)
    with pytest.raises(ferry.Error, match="base < delta"):
        put(s1, tid, (4, 4), ok_idx, ok_val, (2, 2), rep)
    with pytest.raises(ferry.Error, match="nnz"):
        put(s1, tid, (4, 4), np.zeros((0, 2), np.int64), np.zeros(0, np.float32), (1, 2), rep)
    with pytest.raises(ferry.Error, match="duplicate|twice|coordinate"):
        put(s1, tid, (4, 4), np.array([[1, 1], [1, 1]], np.int64), np.array([1, 2], np.float32), (1, 2), rep,
            apply="scatter_set")
    with pytest.raises(ValueError, match="source_placement kind"):
        put(s1, tid, (4, 4), ok_idx, ok_val, (1, 2), ("sharded", "ep"))
    with pytest.raises(ValueError, match="apply must be"):
        put(s1, tid, (4, 4), ok_idx, ok_val, (1, 2), rep, apply="scatter_mul")
    assert s1.list_all(f"ferry/sp/{tid}/") == []
    # nothing was stored: the same logical key still puts
    key, _ = put(s1, tid, (4, 4), ok_idx, ok_val, (1, 2), rep)
    with pytest.raises(ferry.NotFoundError):
        ferry.read_sparse_objects(s1, [key + "-missing"], [Target(tid, 0, 0, (0, 0), (4, 4))])
    with pytest.raises(ferry.Error, match="outside"):
        ferry.read_sparse_objects(s1, [key], [Target(tid, 0, 0, (2, 0), (4, 4))])
    with pytest.raises(TypeError, match=r"targets\[0\]"):
        ferry.read_sparse_objects(s1, [key], [(tid, 0, 0, (0, 0), (4, 4))])
    (r,), _ = ferry.read_sparse_objects(s1, [key], [Target(tid, 0, 0, (0, 0), (4, 4))])
    with pytest.raises(ValueError, match=r"dense \(numpy.ndarray of float32, shape \[4, 5\]\) has shape"):
        ferry.sparse_apply(r, np.zeros((4, 5), np.float32), 1)
    with pytest.raises(ValueError, match="float32, float16 or bf16"):
        ferry.sparse_apply(r, np.zeros((4, 4), np.float64), 1)
    ro = np.zeros((4, 4), np.float32)
    ro.setflags(write=False)
    with pytest.raises(ValueError, match="writable"):
        ferry.sparse_apply(r, ro, 1)
    # a view whose strides put two elements on one address: refused by the library, nothing written
    base = np.zeros(32, np.float32)
    overlap = np.lib.stride_tricks.as_strided(base, shape=(4, 4), strides=(4, 4))
    with pytest.raises(ferry.Error, match="on one address"):
        ferry.sparse_apply(r, overlap, 1)
    assert not base.any()


# ---- apply into real parameter views ------------------------------------------------------------


def _read_whole(store, key, tid, shape, offset=None, box=None):
    offset = offset or (0,) * len(shape)
    (r,), _ = ferry.read_sparse_objects(store, [key], [Target(tid, 0, 0, offset, box or shape)])
    return r


def test_apply_into_torch_views(s1):
    """Non-contiguous torch views as destinations (their strides are passed
    on): a row slice of a larger parameter, a transposed view, the k third of
    a fused bf16 qkv; every element checked, every byte outside untouched."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(16)
    R, C = 32, 24
    tid = _tid("views.w")
    idx, val = _delta(rng, (R, C), 0.2)
    key, _ = ferry.put_sparse_object(s1, tid, (R, C), idx, val, (4, 5), ("replicate", "ep"))
    delta = np.zeros((R, C), np.float32)
    delta[idx[:, 0], idx[:, 1]] = val
    old = (np.arange(R * C, dtype=np.float32).reshape(R, C) % 17) - 8

    # rows [8, 24) of the tensor in rows [10, 26) of a larger [40, C + 8] buffer (padded rows too)
    big = torch.full((40, C + 8), -100.0)
    big[2:2 + R, :C] = torch.from_numpy(old)
    before = big.clone()
    view = big[10:26, :C]
    assert not view.is_contiguous()
    r = _read_whole(s1, key, tid, (R, C), (8, 0), (16, C))
    assert ferry.sparse_apply(r, view, 4) == 5
    want = before.clone()
    want[10:26, :C] += torch.from_numpy(delta[8:24])
    assert torch.equal(big, want)

    # a transposed view: the parameter is stored [C, R], the box is its .t()
    tr = torch.from_numpy(np.ascontiguousarray(old.T))
    r = _read_whole(s1, key, tid, (R, C))
    ferry.sparse_apply(r, tr.t(), 4)
    assert torch.equal(tr.t(), torch.from_numpy(old + delta))

    # k, one third of a fused qkv [3R, C] in bf16
    qkv = torch.from_numpy(np.concatenate([old, old + 1, old + 2])).to(torch.bfloat16)
    before = qkv.clone()
    ferry.sparse_apply(r, qkv[R:2 * R], 4)
    assert torch.equal(qkv[:R], before[:R]) and torch.equal(qkv[2 * R:], before[2 * R:])
    assert torch.equal(qkv[R:2 * R].float(), torch.from_numpy(old + 1 + delta))

    # numpy: a strided view too, and the fence leaves it unchanged
    a = np.zeros((R, 2 * C), np.float32)
    with pytest.raises(ferry.ConflictError, match="nothing changed"):
        ferry.sparse_apply(r, a[:, ::2], 3)
    assert not a.any()
    ferry.sparse_apply(r, a[:, ::2], 4)
    assert np.array_equal(a[:, ::2], delta) and not a[:, 1::2].any()


def test_read_counters_split_by_member(s1):
    rng = np.random.default_rng(17)
    tid = _tid("cnt.w")
    idx, val = _delta(rng, (64, 64), 0.05)
    key, desc = ferry.put_sparse_object(s1, tid, (64, 64), idx, val, (1, 2), ("replicate", "ep"),
                                        tile_shape=(16, 16))
    targets = [Target(tid, 0, 0, (0, 0), (32, 64)), Target(tid, 0, 0, (32, 0), (32, 64))]
    _, c = ferry.read_sparse_objects(s1, [key], targets)
    assert set(COUNTERS) <= set(c)
    assert c["index_checks"] == 1 and c["index_gets"] == 1 and c["index_bytes_read"] > 0
    assert c["index_range_gets"] == c["unique_range_gets"] == 2
    assert c["index_range_bytes"] == desc["nnz"] * 2 * 8 and c["value_range_bytes"] == desc["nnz"] * 4
    assert c["index_range_bytes"] + c["value_range_bytes"] == c["bytes_read"]
    _, c = ferry.read_sparse_objects(s1, [key], targets)
    assert c["index_gets"] == 0 and c["index_cache_hits"] == 1 and c["index_bytes_read"] == 0


# ---- sparse generations in the registry -----------------------------------------------------------


def test_sparse_generations_chain(s1):
    """Dense g1, sparse g2 (base 1) and g3 (base 2) announced; a worker at g1
    follows the chain, a fresh one (a transposed torch view among its shards)
    loads g1 then both deltas; a stale base is refused, nothing applied;
    ferry.torch's Subscriber follows the chain too."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(18)
    model = f"pysg{next(_seq)}"
    names = [f"{model}.a", f"{model}.b"]
    shapes = [(24, 16), (40,)]
    w = {1: [np.arange(np.prod(s), dtype=np.float32).reshape(s) % 13 for s in shapes]}
    assert ferry.sparse.active(s1, model) is None
    ferry.WeightPublisher(s1, model, 0, 1, out_dtype="f32").publish(1, list(zip(names, w[1])))
    assert ferry.sparse.active(s1, model) == (1, False)
    at1 = [np.zeros(s, np.float32) for s in shapes]
    st = ferry.sparse.update(s1, model, [(n, None, a) for n, a in zip(names, at1)])
    assert st["generation"] == 1 and st["dense_generation"] == 1
    keys = {}
    for g in (2, 3):
        w[g], keys[g] = [], []
        for n, s, prev in zip(names, shapes, w[g - 1]):
            idx, val = _delta(rng, s, 0.2)
            k, _ = ferry.put_sparse_object(s1, n, s, idx, val, (g - 1, g), ("replicate", "ep"))
            d = np.zeros(s, np.float32)
            d[tuple(idx.T)] = val
            w[g].append(prev + d)
            keys[g].append(k)
        if g == 3:   # on a base that is no longer active: refused, g2 stays active
            with pytest.raises(ferry.ConflictError, match="active generation is 2"):
                ferry.sparse.announce(s1, model, 1, 3, keys[g])
            assert ferry.weights.active(s1, model)[0] == 2
        a = ferry.sparse.announce(s1, model, g - 1, g, keys[g])
        assert a["objects"] == 2 and a["dense_generation"] == 1 and a["chain"] == g
    assert ferry.weights.active(s1, model)[0] == 3
    assert ferry.sparse.active(s1, model) == (3, True)
    ch = ferry.sparse.chain(s1, model, 0)
    assert ch["active"] == 3 and ch["dense"] == 1 and ch["load_dense"]
    assert [l["generation"] for l in ch["links"]] == [2, 3] and sorted(ch["links"][1]["keys"]) == sorted(keys[3])
    assert [l["generation"] for l in ferry.sparse.chain(s1, model, 2)["links"]] == [3]

    # a worker at g1: g2 then g3
    st = ferry.sparse.update(s1, model, [(n, None, a) for n, a in zip(names, at1)], generation=1)
    assert st["generation"] == 3 and st["deltas"] == 2 and st["dense_generation"] == 0
    assert st["read"]["source_objects"] == 4
    for got, want in zip(at1, w[3]):
        assert np.array_equal(got, want)

    # a fresh worker, `a` held transposed in a torch tensor
    ta = torch.zeros(shapes[0][::-1])
    tb = torch.zeros(shapes[1])
    st = ferry.sparse.update(s1, model, [(names[0], None, ta.t()), (names[1], (0,), tb)])
    assert st["dense_generation"] == 1 and st["deltas"] == 2 and st["dense_bytes"] == (24 * 16 + 40) * 4
    assert np.array_equal(ta.t().numpy(), w[3][0]) and np.array_equal(tb.numpy(), w[3][1])

    # a worker that is not on the chain, with no dense load allowed: refused, nothing written
    fresh = np.zeros(shapes[0], np.float32)
    with pytest.raises(ferry.ConflictError, match="not on the active chain"):
        ferry.sparse.update(s1, model, [(names[0], None, fresh)], no_dense=True)
    assert not fresh.any()
    # g3's delta applied by hand to a buffer at g1: the fence
    (r,), _ = ferry.read_sparse_objects(s1, [keys[3][0]], [Target(names[0], 0, 0, (0, 0), shapes[0])])
    held = w[1][0].copy()
    with pytest.raises(ferry.ConflictError, match="base generation 2 but the buffer holds generation 1"):
        ferry.sparse_apply(r, held, 1)
    assert np.array_equal(held, w[1][0])
    # a dense update cannot load a delta, and says what can
    with pytest.raises(ferry.ConflictError, match="ferry_sparse_update"):
        ferry.weights.update_direct(s1, model, [(names[1], None, np.zeros(40, np.float32))], 1)

    # ferry.torch: a Subscriber opened while g3 (sparse) is active follows the chain
    import ferry.torch as ft

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Parameter(torch.zeros(shapes[0]))
            self.b = torch.nn.Parameter(torch.zeros(shapes[1]))

    mod = M()
    sub = ft.Subscriber(s1, model, mod, "dp:1", 0, names={names[0]: "a", names[1]: "b"})
    st = sub.update()
    assert st["generation"] == 3 and sub.generation == 3 and st["dense_generation"] == 1
    assert np.array_equal(mod.a.detach().numpy(), w[3][0]) and np.array_equal(mod.b.detach().numpy(), w[3][1])
    assert sub.update()["bytes_read"] == 0
    sub.close()
