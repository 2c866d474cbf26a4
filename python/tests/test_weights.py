"""ferry.weights against a real cluster: one `ferry master` and one `ferry
node` started for this module (FERRY_BIN, default build/ferry). Trainer ranks
and rollout workers are threads, each with its own ferry.Store; the
compatibility group's workers are processes (multiprocessing, spawn)."""

import errno
import multiprocessing
import os
import queue
import subprocess
import threading
import time

import numpy as np
import pytest

import conftest
import ferry
from conftest import cluster_fixture
from ferry import weights
from fp8_ref import dequant, ref_fp8_blocks

RUN_S = 60.0            # deadline for a group of rank threads
TIMEOUT_MS = 20000      # barriers inside ferry

cluster = cluster_fixture(1, "weights")


def _run_ranks(world, fn):
    """fn(rank, barrier) on `world` threads at once; returns their results
    in rank order (or their exceptions, as objects)."""
    barrier = threading.Barrier(world, timeout=RUN_S)
    out = [None] * world

    def body(r):
        try:
            out[r] = fn(r, barrier)
        except BaseException as e:   # noqa: B902 - handed to the test
            out[r] = e

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(world)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + RUN_S
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
        assert not t.is_alive(), "a rank thread did not finish in time"
    return out


def _raise_any(results):
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results


# ---- the published model --------------------------------------------------------------------

def _source(gen):
    """The ordered tensors every rank passes: f32, f16 and bf16 (raw words)."""
    rng = np.random.default_rng(gen)
    # values with few mantissa bits, so that f16 and bf16 hold them exactly too
    w = (rng.integers(-64, 64, size=(7, 5)) / 8).astype(np.float32)
    b = (rng.integers(-64, 64, size=(11,)) / 4).astype(np.float32)
    h = (rng.integers(-64, 64, size=(4, 3)) / 16).astype(np.float16)
    e32 = (rng.integers(-512, 512, size=(6, 9)) / 2).astype(np.float32)
    e = weights.convert(e32, "f32", "bf16")    # uint16 words
    big = rng.standard_normal((33, 17)).astype(np.float32)   # not exact in bf16: rounding is checked
    return [("layers.0.w", w), ("layers.0.b", b), ("layers.1.h", h), ("layers.1.e", e, "bf16"), ("big", big)]


def _publish(cluster, model, gen, world=2, **kw):
    tensors = _source(gen)

    def rank(r, barrier):
        with cluster.store() as s:
            pub = ferry.WeightPublisher(s, model, r, world, timeout_ms=TIMEOUT_MS, **kw)
            barrier.wait()   # the ranks publish concurrently
            return pub.publish(gen, tensors)

    return tensors, _run_ranks(world, rank)


@pytest.fixture(scope="module")
def plain(cluster):
    """Model "plain" generation 1, each tensor in its own dtype."""
    tensors, res = _publish(cluster, "plain", 1)
    return tensors, _raise_any(res)


@pytest.fixture(scope="module")
def rollout(cluster):
    """Model "rollout" generation 1, every tensor stored as bf16."""
    tensors, res = _publish(cluster, "rollout", 1, out_dtype="bf16", rank_node=[0, 1])
    return tensors, _raise_any(res)


def _expected(t, out_dtype):
    """(ferry dtype, array) a tensor is published as."""
    dt = t[2] if len(t) == 3 else {"float32": "f32", "float16": "f16"}[t[1].dtype.name]
    if out_dtype is None or out_dtype == dt:
        return dt, t[1]
    return out_dtype, weights.convert(t[1], dt, out_dtype)


# ---- pure functions ----------------------------------------------------------------------------

def test_assign_deterministic_balanced():
    sizes = [100, 60, 50, 40, 10]
    a = weights.assign(sizes, [0, 0, 1, 1])
    assert a == weights.assign(sizes, [0, 0, 1, 1])
    # LPT: 100 -> node 0 (rank 0); 60 -> node 1 (rank 2); 50 -> node 1 (rank 3);
    # 40 -> node 0 (rank 1); 10 -> node 1 (rank 3, the lighter one)
    assert a == [0, 2, 3, 1, 3]
    node = [0, 0, 1, 1]
    load = [sum(s for s, r in zip(sizes, a) if node[r] == n) for n in (0, 1)]
    assert abs(load[0] - load[1]) <= max(sizes)
    many = [((i * 7919) % 97 + 1) * 1000 for i in range(400)]
    b = weights.assign(many, [0] * 4)
    per = [sum(s for s, r in zip(many, b) if r == k) for k in range(4)]
    assert max(per) - min(per) <= max(many) and set(b) == {0, 1, 2, 3}
    with pytest.raises(ferry.Error):
        weights.assign([1, 2], [])


def test_convert_roundtrip_exact():
    vals = np.array([0.0, 1.0, -2.0, 0.5, 3.75, -1024.0, 2.0 ** -10, 1.5 * 2 ** 20], dtype=np.float32)
    b = weights.convert(vals, "f32", "bf16")
    assert b.dtype == np.uint16 and b[1] == 0x3F80 and b[2] == 0xC000
    assert np.array_equal(weights.convert(b, "bf16", "f32"), vals)
    small = vals[:6]                      # within f16's range
    h = weights.convert(small.reshape(2, 3), "f32", "f16")
    assert h.dtype == np.float16 and h.shape == (2, 3)
    assert np.array_equal(h.reshape(-1), small.astype(np.float16))
    assert np.array_equal(weights.convert(h, "f16", "f32").reshape(-1), small)
    assert np.isinf(weights.convert(vals[-1:], "f32", "f16")[0])   # beyond f16's range
    # narrowing rounds to nearest, ties to even
    ties = np.array([1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8], dtype=np.float32)
    assert list(weights.convert(ties, "f32", "bf16")) == [0x3F80, 0x3F82]
    with pytest.raises(ValueError):
        weights.convert(vals, "f64", "f32")
    with pytest.raises(ValueError):
        weights.convert(vals, "f16", "f32")   # float32 elements are not f16


def test_key():
    assert weights.key("m", 3, "layers.0.w") == "ferry/w/m/00000000000000000003/layers.0.w"
    with pytest.raises(ferry.Error):
        weights.key("a/b", 1, "x")


# ---- publishing and reading back --------------------------------------------------------------

def test_publish_and_manifest(store, plain):
    tensors, stats = plain
    assert len(stats) == 2
    assert sum(s["tensors"] for s in stats) == len(tensors) == stats[0]["total_tensors"]
    total = sum(t[1].nbytes for t in tensors)
    assert sum(s["bytes"] for s in stats) == total == stats[0]["total_bytes"]
    for s in stats:   # phases and where the bytes landed
        assert s["put_s"] >= s["convert_s"] >= 0 and s["store_s"] >= 0 and s["barrier_s"] >= 0
        assert s["local_bytes"] + s["cross_node_bytes"] in (0, s["bytes"])
    gen, digest = weights.active(store, "plain")
    assert gen == 1 and isinstance(digest, bytes) and len(digest) == 16
    m = weights.manifest(store, "plain")
    assert m == weights.manifest(store, "plain", 1)
    assert [e["name"] for e in m] == [t[0] for t in tensors]
    assert [e["dtype"] for e in m] == ["f32", "f32", "f16", "bf16", "f32"]
    assert [e["shape"] for e in m] == [t[1].shape for t in tensors]
    assert [e["bytes"] for e in m] == [t[1].nbytes for t in tensors]
    assert [e["publisher"] for e in m] == weights.assign([t[1].nbytes for t in tensors], [0, 0])
    assert {e["publisher"] for e in m} == {0, 1}
    # a tensor's key is the object its (first) piece is packed in: its publisher's
    assert all(e["key"] == weights.key("plain", 1, "r%d.0" % e["publisher"]) for e in m)
    assert all(isinstance(e["checksum"], int) for e in m)
    assert weights.active(store, "no-such-model") is None
    with pytest.raises(ferry.NotFoundError):
        weights.manifest(store, "no-such-model")


def test_publish_stream_takes_tensors_as_they_come(cluster, store):
    """publish_stream from a generator on two ranks: each rank asks for the
    next tensor only once it is done with the last (never more than two
    alive, none kept), the stored bytes are balanced, every byte reads back
    as published (bf16, converted), and a tensor one rank cannot take fails
    the attempt on both with that rank's reason."""
    import weakref
    model, world = "streamed", 2
    shapes = [(64, 33), (128, 17), (5,), (300, 40), (7, 7), (96, 96)]

    def values(gen, i, shape):
        rng = np.random.default_rng(gen * 100 + i)
        return (rng.integers(-64, 64, size=shape) / 8).astype(np.float32)

    def generator(gen, alive, bad=False):
        refs = []
        for i, shp in enumerate(shapes):
            a = values(gen, i, shp) if not (bad and i == 3) else np.zeros(shp, dtype=np.int8)
            refs.append(weakref.ref(a))
            alive.append(sum(r() is not None for r in refs))
            yield (f"layers.{i}.w", a)
            del a

    def rank(r, barrier, gen, bad_rank=None):
        with cluster.store() as s:
            pub = ferry.WeightPublisher(s, model, r, world, out_dtype="bf16", timeout_ms=TIMEOUT_MS)
            alive, held = [], []
            barrier.wait()
            try:
                st = pub.publish_stream(gen, generator(gen, alive, bad=r == bad_rank), held=held)
            except ferry.Error as e:
                return e, alive
            return (st, held[0]), alive

    res = _run_ranks(world, lambda r, b: rank(r, b, 1))
    _raise_any(res)
    total = sum(int(np.prod(shp)) * 2 for shp in shapes)
    for (st, held), alive in res:
        assert max(alive) <= 2, alive                    # taken as they come, none kept
        assert held <= st["bytes"] + 64 * len(shapes)    # its one object (with its 64-byte alignment)
        assert st["total_tensors"] == len(shapes) and st["total_bytes"] == total
        assert st["bytes"] <= total / world + max(int(np.prod(x)) * 2 for x in shapes)   # balanced
    assert sum(st["bytes"] for (st, _), _ in res) == total
    assert weights.active(store, model)[0] == 1
    m = weights.manifest(store, model)
    assert [e["name"] for e in m] == [f"layers.{i}.w" for i in range(len(shapes))]
    got = dict(weights.update_compat(store, model))
    for i, shp in enumerate(shapes):
        want = weights.convert(values(1, i, shp), "f32", "bf16")
        assert np.array_equal(got[f"layers.{i}.w"].reshape(-1), want.reshape(-1)), i
    # rank 1 is handed an int8 tensor: both ranks fail with its reason, nothing announced
    res = _run_ranks(world, lambda r, b: rank(r, b, 2, bad_rank=1))
    for e, _ in res:
        assert isinstance(e, ferry.Error), e
        assert "rank 1" in str(e) and "layers.3.w" in str(e), str(e)
    assert weights.active(store, model)[0] == 1


def test_publish_older_generation_raises(cluster, store):
    _, res = _publish(cluster, "older", 2)
    _raise_any(res)
    _, res = _publish(cluster, "older", 1)
    assert all(isinstance(r, ferry.Error) for r in res), res
    assert "generation" in str(res[0])
    _, res = _publish(cluster, "older", 2)   # not newer either
    assert all(isinstance(r, ferry.Error) for r in res), res
    assert weights.active(store, "older")[0] == 2


def test_publish_bad_input(store):
    """A tensor this rank cannot publish fails the attempt (for every rank:
    test_publish_python_check_fails_every_rank) with ferry.Error, its own
    ValueError the cause; checked in Python or in the extension alike."""
    pub = ferry.WeightPublisher(store, "bad", 0, 1)
    for tensors, why in [([("x", np.zeros((4, 4), np.float32)[:, ::2])], "not C-contiguous"),
                         ([("x", np.zeros(4, np.int64))], "dtype int64"),          # no rollout dtype
                         ([("x", np.zeros(4, np.float32), "bf16")], "does not match")]:   # itemsize
        with pytest.raises(ferry.Error) as e:
            pub.publish(1, tensors)
        assert isinstance(e.value.__cause__, ValueError), e.value
        assert str(e.value).startswith("publish of bad generation 1 failed: rank 0: tensor x: ")
        assert why in str(e.value), str(e.value)
    with pytest.raises(ValueError):
        ferry.WeightPublisher(store, "bad", 0, 2, rank_node=[0])
    assert weights.active(store, "bad") is None


def test_publish_python_check_fails_every_rank(cluster, store):
    """One rank's own check fails (a non-C-contiguous array) before it
    reaches the C publish: every rank raises at once (their barrier waits
    twice as long as the deadline on the threads) the same class with one
    message naming the rank and why; nothing is announced; the generation
    then publishes."""
    model, world = "pycheck", 3
    tensors = _source(1)
    bad = [("layers.0.w", np.zeros((7, 10), np.float32)[:, ::2])] + tensors[1:]

    def rank(r, barrier):
        with cluster.store() as s:
            pub = ferry.WeightPublisher(s, model, r, world, timeout_ms=int(2 * RUN_S * 1000))
            barrier.wait()
            return pub.publish(1, bad if r == 1 else tensors)

    res = _run_ranks(world, rank)
    assert all(isinstance(r, ferry.Error) for r in res), res
    assert len({type(r) for r in res}) == 1 and len({str(r) for r in res}) == 1, res
    msg = str(res[0])
    assert msg.startswith("publish of pycheck generation 1 failed: rank 1: tensor layers.0.w: "), msg
    assert "not C-contiguous" in msg and "failed: failed" not in msg, msg
    assert isinstance(res[1].__cause__, ValueError)      # the rank's own error, chained
    assert weights.active(store, model) is None
    assert store.list(f"ferry/w/{model}/{1:020d}/") == []    # no object left behind
    _, res = _publish(cluster, model, 1, world=world)
    _raise_any(res)
    assert weights.active(store, model)[0] == 1


def _start_node(c, tmp_path):
    """One more `ferry node` for cluster c; returns the process once mounted."""
    env = {k: v for k, v in os.environ.items() if k not in ("FERRY_MASTER", "FERRY_TOKEN", "FERRY_TOKEN_FILE")}
    node = subprocess.Popen([conftest.FERRY_BIN, "node", "--master", c.addr, "--size",
                             f"{conftest.NODE_SIZE >> 20}M", "--token-file", c.token_file],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=None, env=env)
    c.procs.append(node)
    conftest._wait_line(node, "mounted", time.monotonic() + conftest.START_S)
    threading.Thread(target=conftest._drain, args=(node.stdout,), daemon=True).start()
    return node


def _lost(s, key):
    try:
        return not s.is_exist(key)
    except ferry.LostError:
        return True


def test_node_restart_reports_lost_generation(tmp_path):
    """The node restarts (stopped cleanly, a new one started): its memory
    and every object of the active generation are gone. weights.active and
    PolicyRegistry.current raise LostError saying so instead of presenting
    the generation as current; a newer generation publishes (the lost
    number is not reused)."""
    conftest.require_ferry_bin()
    with conftest.running_cluster(tmp_path, 1) as c:
        _, res = _publish(c, "restart", 1, world=1)
        _raise_any(res)
        with c.store() as s:
            assert weights.active(s, "restart")[0] == 1
            old = c.procs[1]
            old.terminate()
            old.wait(conftest.START_S)
            _start_node(c, tmp_path)
            key = weights.key("restart", 1, "layers.0.w")
            deadline = time.monotonic() + conftest.START_S
            while not _lost(s, key):
                assert time.monotonic() < deadline, "the restarted node's objects did not go"
                time.sleep(0.01)
            with pytest.raises(ferry.LostError) as e:
                weights.active(s, "restart")
            assert "generation 1 of restart is lost" in str(e.value), str(e.value)
            with pytest.raises(ferry.LostError) as e:
                ferry.PolicyRegistry(s, "restart").current()
            assert "generation 1 of restart is lost" in str(e.value), str(e.value)
            _, res = _publish(c, "restart", 1, world=1)
            assert isinstance(res[0], ferry.Error) and "not newer" in str(res[0]), res
            tensors, res = _publish(c, "restart", 2, world=1)
            _raise_any(res)
            assert weights.active(s, "restart")[0] == 2
            assert ferry.PolicyRegistry(s, "restart").current().version_id == 2
            got = list(weights.update_compat(s, "restart"))
            assert [n for n, _ in got] == [t[0] for t in tensors]
            assert all(np.array_equal(a, t[1]) for (_, a), t in zip(got, tensors))


# ---- compatibility updates -----------------------------------------------------------------------

@pytest.mark.parametrize("model,out_dtype", [("plain", None), ("rollout", "bf16")])
def test_update_compat(store, plain, rollout, model, out_dtype):
    tensors = (plain if model == "plain" else rollout)[0]
    it = weights.update_compat(store, model)
    assert it.generation == 1 and it.stats["tensors"] == len(tensors)
    got = list(it)
    assert [n for n, _ in got] == [t[0] for t in tensors]
    for (name, a), t in zip(got, tensors):
        dt, want = _expected(t, out_dtype)
        assert a.dtype == weights.numpy_dtype(dt), name
        assert a.shape == want.shape and np.array_equal(a, want), name
    if out_dtype == "bf16":
        # the rounded tensor widens back to within bf16's precision
        big = dict(got)["big"]
        src = tensors[-1][1]
        back = weights.convert(big, "bf16", "f32")
        assert not np.array_equal(back, src)
        assert np.allclose(back, src, rtol=2.0 ** -8, atol=0)
    # already current: nothing read
    again = weights.update_compat(store, model, generation=1)
    assert len(again) == 0 and again.stats["bytes_read"] == 0
    # callback form, stopped by an exception from the callback
    seen = []
    st = weights.update_compat(store, model, fn=lambda n, a: seen.append((n, a.copy())))
    assert st["generation"] == 1 and [n for n, _ in seen] == [t[0] for t in tensors]
    with pytest.raises(KeyError):
        weights.update_compat(store, model, fn=lambda n, a: {}[n])


# ---- parameter-direct updates (each worker reads its own demand) ---------------------------------

def test_update_direct_tp_halves_padded(store, plain):
    tensors = dict((t[0], t[1]) for t in plain[0])
    src = tensors["layers.0.w"]          # (7, 5) f32
    bsrc = tensors["big"]                # (33, 17) f32
    for half in (0, 1):
        r0 = 0 if half == 0 else 4
        rows = 4 if half == 0 else 3
        buf = np.zeros((rows, 5 + 3), np.float32)   # padded rows: a strided destination
        dst = buf[:, :5]
        bbuf = np.zeros((17, 17 + 2), np.float32)
        bdst = bbuf[:, :17]
        b0 = 0 if half == 0 else 17
        bdst = bdst[:33 - b0] if half else bdst[:17]
        shards = [("layers.0.w", (r0, 0), dst), ("big", (b0, 0), bdst)]
        st = weights.update_direct(store, "plain", shards)
        assert st["generation"] == 1
        assert st["bytes_read"] == dst.nbytes + bdst.nbytes    # exactly its demand
        assert np.array_equal(dst, src[r0:r0 + rows])
        assert np.array_equal(bdst, bsrc[b0:b0 + bdst.shape[0]])
        assert not buf[:, 5:].any() and not bbuf[:, 17:].any()   # padding untouched
        assert weights.update_direct(store, "plain", shards, generation=1)["bytes_read"] == 0
    # a box outside the tensor, a missing tensor, a wrong element size
    with pytest.raises(ferry.Error):
        weights.update_direct(store, "plain", [("layers.0.w", (5, 0), np.zeros((4, 5), np.float32))])
    with pytest.raises(ferry.NotFoundError):
        weights.update_direct(store, "plain", [("nope", (0,), np.zeros(4, np.float32))])
    wrong = np.zeros((7, 5), np.float16)
    with pytest.raises(ferry.Error) as e:
        weights.update_direct(store, "plain", [("layers.0.w", (0, 0), wrong)])
    assert "layers.0.w" in str(e.value) and "2-byte elements" in str(e.value) and not wrong.any()
    with pytest.raises(ValueError):
        weights.update_direct(store, "plain", [("layers.0.w", (0, 0), np.zeros((7, 5), np.float32)[::-1])])


# ---- single-pull subscriber (DP2: both workers hold the same shard) ------------------------------

def test_subscriber_dp2(cluster, store, rollout):
    tensors = rollout[0]
    m = weights.manifest(store, "rollout")
    published = sum(e["bytes"] for e in m)
    arrays = [[np.zeros(e["shape"], weights.numpy_dtype(e["dtype"])) for e in m] for _ in range(2)]
    # one destination padded (strided) on worker 1
    pad = np.zeros((7, 5 + 2), np.uint16)
    arrays[1][0] = pad[:, :5]

    def worker(r, barrier):
        with cluster.store() as s:
            shards = [(e["name"], (0,) * len(e["shape"]), a) for e, a in zip(m, arrays[r])]
            # one worker per node (ids 2 and 5), tiny batches: the pipeline runs
            with ferry.WeightSubscriber(s, "rollout", "dp", r, 2, shards, timeout_ms=TIMEOUT_MS,
                                        node=2 + 3 * r, batch_bytes=64) as sub:
                assert sub.generation == 0 and not sub.closed
                with pytest.raises(ferry.BusyError):
                    s.close()    # the subscriber uses the store until it is closed
                barrier.wait()
                st = sub.update()
                assert sub.generation == 1
            assert sub.closed
            return st

    stats = _raise_any(_run_ranks(2, worker))
    assert all(st["generation"] == 1 for st in stats)
    assert stats[0]["group_bytes_read"] == stats[1]["group_bytes_read"] == published
    assert sum(st["bytes_read"] for st in stats) == published          # each byte read once
    assert sum(st["bytes_pushed"] for st in stats) == published        # and pushed to the replica
    assert sum(st["bytes_received"] for st in stats) == published
    # the group's counters, the same on both workers: every byte crosses
    # from the reader's node to the other one once, nothing inside a node
    for k in ("group_pushed_cross", "group_pushed_intra", "nic_max_in", "nic_max_out",
              "nic_mean_in", "nic_mean_out", "nodes"):
        assert stats[0][k] == stats[1][k], k
    st = stats[0]
    assert st["group_pushed_cross"] == published and st["group_pushed_intra"] == 0
    nodes = st["nodes"]
    assert [n["node"] for n in nodes] == [2, 5] and all(n["workers"] == 1 for n in nodes)
    assert sum(n["store_read"] for n in nodes) == published            # the union of the demands
    assert [n["store_read"] for n in nodes] == [stats[0]["bytes_read"], stats[1]["bytes_read"]]
    assert sum(n["pushed_out"] for n in nodes) == sum(n["pushed_in"] for n in nodes) == published
    assert st["nic_max_in"] == max(n["nic_in"] for n in nodes)
    assert st["nic_mean_out"] == pytest.approx(published / 2)
    assert all(s["batches"] >= 1 for s in stats)
    for s in stats:
        for k in ("prepare_s", "exchange_s", "plan_s", "read_s", "push_s", "forward_s", "barrier_s",
                  "apply_s"):
            assert s[k] >= 0, k
        assert s["exchange_s"] <= s["prepare_s"]
    for r in range(2):
        for t, a in zip(tensors, arrays[r]):
            assert np.array_equal(a, _expected(t, "bf16")[1]), (r, t[0])
    assert not pad[:, 5:].any()


def test_subscriber_wrong_element_size_fails_the_group(cluster, store, rollout):
    """A member whose array has another element size than the published
    dtype is refused at prepare (the update checks it against the manifest
    it loads itself), and the other member hears of it at once instead of
    timing out; nothing is written on either."""
    m = weights.manifest(store, "rollout")
    arrays = [[np.zeros(e["shape"], weights.numpy_dtype(e["dtype"])) for e in m] for _ in range(2)]
    arrays[1][0] = np.zeros(m[0]["shape"], np.float32)          # bf16 published: 2-byte elements

    def worker(r, barrier):
        with cluster.store() as s:
            shards = [(e["name"], (0,) * len(e["shape"]), a) for e, a in zip(m, arrays[r])]
            with ferry.WeightSubscriber(s, "rollout", "esize", r, 2, shards, timeout_ms=TIMEOUT_MS) as sub:
                barrier.wait()
                with pytest.raises(ferry.Error) as e:
                    sub.update()
                return str(e.value), e.value.code, None, sub.generation

    got = _raise_any(_run_ranks(2, worker))
    assert got[1][1] == -errno.EINVAL
    assert f"tensor {m[0]['name']}: the shard's buffer holds 4-byte elements" in got[1][0]
    assert "worker 1" in got[0][0] and "nothing was written" in got[0][0], got[0][0]
    assert all(g[3] == 0 for g in got)   # worker 0's message above is the told one, not a timeout's
    assert not any(a.any() for arrs in arrays for a in arrs)


# ---- elastic subscriber group (world=0: the membership lives in the store) -----------------------

def test_subscriber_elastic(cluster, store):
    tensors, res = _publish(cluster, "elastic", 1, out_dtype="bf16")
    _raise_any(res)
    m = weights.manifest(store, "elastic")
    published = sum(e["bytes"] for e in m)
    stores, subs = [], []
    arrays = [[np.zeros(e["shape"], weights.numpy_dtype(e["dtype"])) for e in m] for _ in range(3)]

    def join(i):
        stores.append(cluster.store())
        shards = [(e["name"], (0,) * len(e["shape"]), a) for e, a in zip(m, arrays[i])]
        subs.append(ferry.WeightSubscriber(stores[i], "elastic", "pool", 0, 0, shards,
                                           timeout_ms=TIMEOUT_MS, member=f"py{i}"))

    def check(stats, n, tensors):
        assert [st["members"] for st in stats] == [n] * n
        assert sorted(st["position"] for st in stats) == list(range(n))
        assert len({st["epoch"] for st in stats}) == 1
        assert all(st["group_bytes_read"] == published for st in stats)
        assert sum(st["bytes_read"] for st in stats) == published       # each byte read once
        for r in range(n):
            for t, a in zip(tensors, arrays[r]):
                assert np.array_equal(a, _expected(t, "bf16")[1]), (r, t[0])

    try:
        join(0)
        join(1)
        stats = _raise_any(_run_ranks(2, lambda r, barrier: subs[r].update()))
        check(stats, 2, tensors)
        first_epoch = stats[0]["epoch"]
        join(2)    # a third member joins: the next update includes it
        tensors, res = _publish(cluster, "elastic", 2, out_dtype="bf16")
        _raise_any(res)
        stats = _raise_any(_run_ranks(3, lambda r, barrier: subs[r].update()))
        check(stats, 3, tensors)
        assert stats[0]["epoch"] != first_epoch     # the membership changed
        assert all(sub.generation == 2 for sub in subs)
    finally:
        for sub in subs:
            sub.close()
        for s in stores:
            s.close()


# ---- compatibility mode for a group (ferry.CompatGroup), worker processes ------------------------

def _compat_worker(addr, token_file, model, rank, world, node, segment, barrier, out):
    """One rollout process of a CompatGroup: generations 1 and 2 (published
    from _source, as bf16), each checked against what the process computes
    itself; the iterator form on odd ranks, the callback form on even ones.
    Between the two it meets the parent at `barrier` twice (done with 1;
    2 is published). Puts (rank, [per generation: stats, names, wrong
    tensors, tensors of an update when current, its bytes read]) or
    (rank, error text)."""
    try:
        res = []
        with ferry.Store(master=addr, token_file=token_file) as s:
            with ferry.CompatGroup(s, model, "cg", rank, world, node=node, staging_bytes=1152,
                                   timeout_ms=TIMEOUT_MS, local_segment=segment) as g:
                with pytest.raises(ferry.BusyError):
                    s.close()    # the staging is registered with the store's engine
                res.append(g.warm())     # the warm-up: its staging and its node-mate's view
                for gen in (1, 2):
                    if gen == 2:
                        barrier.wait()       # done with 1
                        barrier.wait()       # 2 is published
                    if rank % 2:
                        it = g.update()
                        got, st = list(it), it.stats
                    else:
                        got = []
                        st = g.update(lambda n, a: got.append((n, a.copy())))
                    assert g.generation == gen
                    want = [(t[0], _expected(t, "bf16")[1]) for t in _source(gen)]
                    wrong = [n for (n, a), (m, w) in zip(got, want)
                             if n != m or a.dtype != w.dtype or a.shape != w.shape or
                             not np.array_equal(a, w)]
                    again = g.update()       # current: nothing moves
                    res.append((st, [n for n, _ in got], wrong, len(again), again.stats["bytes_read"]))
            assert g.closed
        out.put((rank, res))
    except BaseException as e:   # noqa: B902 - reported to the parent
        out.put((rank, repr(e)))


def test_compat_group_processes(cluster, store):
    """Four rollout processes on two nodes (7, 7, 9, 9): every worker gets
    every tensor exactly, the group reads the published bytes once from the
    store; 1152 bytes of staging (the largest tensor is 1122): two batches.
    The workers of node 7 name the store's segment as their node's: they
    lead every tensor, node 9 reads nothing."""
    world, nodes, model = 4, [7, 7, 9, 9], "cgroup"
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(world + 1, timeout=RUN_S)
    out = ctx.Queue()
    tensors, res = _publish(cluster, model, 1, out_dtype="bf16")
    _raise_any(res)
    m = weights.manifest(store, model, 1)
    published = sum(e["bytes"] for e in m)
    segment = m[0]["segment"]
    assert segment and all(e["segment"] == segment for e in m)   # one store node
    procs = [ctx.Process(target=_compat_worker, daemon=True,
                         args=(cluster.addr, cluster.token_file, model, r, world, nodes[r],
                               segment if nodes[r] == 7 else 0, barrier, out))
             for r in range(world)]
    for p in procs:
        p.start()
    results = {}
    try:
        barrier.wait()                   # generation 1 done everywhere
        _raise_any(_publish(cluster, model, 2, out_dtype="bf16")[1])
        barrier.wait()
        deadline = time.monotonic() + RUN_S
        while len(results) < world:
            try:
                r, v = out.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail(f"compat workers did not report in time (got {sorted(results)})")
            results[r] = v
    except threading.BrokenBarrierError:
        while not out.empty():          # a worker failed before the barrier: say why
            r, v = out.get()
            results[r] = v
        pytest.fail(f"a compat worker did not reach the barrier: {results}")
    finally:
        for p in procs:
            p.join(RUN_S)
            if p.is_alive():
                p.kill()
    for r in range(world):
        assert not isinstance(results[r], str), (r, results[r])
    # each warm-up touched its own staging and its one node-mate's view
    assert [results[r].pop(0) for r in range(world)] == [2 * 1152] * world
    names = [t[0] for t in tensors]
    for gi, gen in enumerate((1, 2)):
        stats = [results[r][gi][0] for r in range(world)]
        for r in range(world):
            st, got, wrong, n_again, read_again = results[r][gi]
            assert got == names and wrong == [], (gen, r, wrong)      # every tensor, exactly
            assert st["generation"] == gen and st["tensors"] == len(names)
            assert st["bytes"] == published
            assert n_again == 0 and read_again == 0                   # current: nothing moved
            assert st["group_bytes_read"] == published and st["nodes"] == 2
            assert st["group_cross_bytes"] == published               # (2 nodes - 1) x published
            assert st["group_intra_bytes"] == 2 * published           # (4 workers - 2 nodes) x published
            assert st["batches"] > 1
            for k in ("prepare_s", "exchange_s", "plan_s", "read_s", "wait_s", "verify_s", "load_s",
                      "barrier_s", "apply_s", "total_s"):
                assert st[k] >= 0, k
        assert sum(st["bytes_read"] for st in stats) == published     # the store read once per byte
        assert stats[2]["bytes_read"] == stats[3]["bytes_read"] == 0   # led where the segment is
        assert sum(st["tensors_led"] for st in stats) == len(names)
        assert sum(st["bytes_sent_cross"] for st in stats) == published
        # inside a node (one machine: shm) nothing is written: the node-mates
        # take each tensor from the staging that has it, through a view
        assert sum(st["bytes_sent_intra"] for st in stats) == 0
        assert sum(st["bytes_viewed"] for st in stats) == 2 * published
        assert sum(st["bytes_received"] + st["bytes_viewed"] for st in stats) == 3 * published
        # the warm-up imported every member's staging: both updates reuse them
        assert all(st["imported"] == 0 for st in stats)


# ---- FP8 blocks quantized before the network (docs/weights.md, "Publishing FP8") -------------

def test_publish_fp8_fsdp_cut_blocks_numpy_reference(cluster, store):
    """Two trainer threads publish an f32 tensor FSDP-split at row 50 —
    inside block row 3 of 16 — with quant rules; TP 2 rollouts read the FP8
    rows and their scale rows, bit for bit a numpy quantizer of the
    documented formula; a rollout asking f32 of it by its element size is
    refused; a streamed publish with rules raises."""
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((100, 40)) * np.exp2(rng.integers(-8, 8, size=(100, 1)))).astype(np.float32)
    x[:16, :16] = 0                       # a block of zeros
    x[45, 3], x[55, 4] = np.nan, np.inf   # both sides of the cut
    x[52, 1] = 1e4                        # block (3, 0)'s maximum, in rank 1's rows
    quant = {"block": (16, 16)}

    def placement():
        m = ferry.reshard.Manifest(2)
        m.add_split(m.add_tensor("w.weight", "f32", (100, 40)), parts=(2, 1), rank_stride=(1, 0))
        n = m.add_tensor("norm.weight", "f32", (40,))
        m.add_fragment(n, 0, offset=(0,), shape=(40,))
        return m

    def rank(r, barrier):
        with cluster.store() as s:
            pub = ferry.WeightPublisher(s, "fp8", r, 2, timeout_ms=TIMEOUT_MS, out_dtype="bf16",
                                        quant=quant)
            mine = [(r, np.ascontiguousarray(x[50 * r:50 * r + 50]))]
            if r == 0:
                mine.append((2, np.ones(40, np.float32)))
            barrier.wait()
            return pub.publish_shards(1, placement(), mine)

    _raise_any(_run_ranks(2, rank))
    want_q, want_s = ref_fp8_blocks(x, (16, 16))
    assert want_s[3, 0] == np.float32(1e4) / np.float32(448)
    for half, (r0, rows) in enumerate(((0, 48), (48, 52))):   # whole blocks of 16 rows
        q = np.zeros((rows, 40), np.uint8)
        sc = np.zeros((-(-rows // 16), 3), np.float32)
        st = weights.update_direct(store, "fp8", [("w.weight", (r0, 0), q),
                                                  ("w.weight_scale_inv", (r0 // 16, 0), sc)])
        assert st["generation"] == 1 and st["bytes_read"] == q.nbytes + sc.nbytes
        assert np.array_equal(q, want_q[r0:r0 + rows]), half
        assert np.array_equal(sc.view(np.uint32), want_s[r0 // 16:r0 // 16 + sc.shape[0]].view(np.uint32))
    with pytest.raises(ferry.Error) as e:
        weights.update_direct(store, "fp8", [("w.weight", (0, 0), np.zeros((48, 40), np.float32))])
    assert "published as f8e4m3 in 16 x 16 blocks" in str(e.value)
    # explicit dequantization: rows 40-59 (cutting block rows 2 and 3) as f32
    deq = np.zeros((20, 40), np.float32)
    st = weights.update_direct(store, "fp8", [("w.weight", (40, 0), deq, "f32")])
    want = dequant(want_q[32:64], want_s[2:4], (16, 16))[8:28]
    assert np.array_equal(deq, want, equal_nan=True)
    assert st["bytes_read"] == 20 * 40 + 2 * 3 * 4
    with cluster.store() as s:
        pub = ferry.WeightPublisher(s, "fp8", 0, 1, quant={})
        with pytest.raises(ValueError):
            pub.publish_stream(2, [("w.weight", x)])
