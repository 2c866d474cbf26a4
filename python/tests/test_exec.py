"""ferry.reshard execution from Python: bindings of numpy arrays, JSON and
digests, and plans executed between two engines in one process (same host:
the shm transport) in sink and reader mode, with staleness, selector and
guard failures."""

import errno
import gc
import os
import secrets
import weakref

import numpy as np
import pytest

os.environ.setdefault("FERRY_TOKEN", secrets.token_hex(32))   # before any engine opens

import ferry  # noqa: E402
from ferry import reshard  # noqa: E402

W = np.arange(48, dtype=np.float32).reshape(8, 6) + 1     # tensor "w"
B = np.arange(6, dtype=np.float32) + 100                   # tensor "b"
DATA = {"w": W, "b": B}


def manifests():
    """w split by rows over 2 source ranks (fsdp), by columns over 2 target
    ranks (tp); b whole on source rank 1, split over the target ranks."""
    src, dst = reshard.Manifest(2), reshard.Manifest(2)
    for m in (src, dst):
        m.add_tensor("w", "f32", (8, 6))
        m.add_tensor("b", "f32", (6,))
    src.add_split(0, rank=0, parts=(2, 1), rank_stride=(1, 0))
    src.add_fragment(1, 1)
    dst.add_split(0, rank=0, parts=(1, 2), rank_stride=(0, 1))
    dst.add_split(1, rank=0, parts=(2,), rank_stride=(1,))
    return src, dst


def carve(man, pad):
    """One float32 buffer per rank (one region per worker), filled with -1,
    and a view per fragment inside it; with pad, 2-D views have a row
    stride one wider than their rows (non-contiguous storage)."""
    frags = [man.fragment(i) for i in range(man.fragment_count)]
    sizes = {}
    for f in frags:
        shape = f["shape"]
        n = shape[0] * (shape[1] + pad) if len(shape) == 2 else shape[0]
        sizes[f["rank"]] = sizes.get(f["rank"], 0) + n
    bufs = {r: np.full(n, -1, dtype=np.float32) for r, n in sizes.items()}
    used = dict.fromkeys(sizes, 0)
    views = {}
    for i, f in enumerate(frags):
        r, shape = f["rank"], f["shape"]
        if len(shape) == 2:
            rows, cols = shape
            v = bufs[r][used[r]:used[r] + rows * (cols + pad)].reshape(rows, cols + pad)[:, :cols]
            used[r] += rows * (cols + pad)
        else:
            v = bufs[r][used[r]:used[r] + shape[0]]
            used[r] += shape[0]
        views[i] = v
    return bufs, views


def box(man, i):
    f = man.fragment(i)
    name = man.tensor(f["tensor"])[0]
    return DATA[name][tuple(slice(o, o + s) for o, s in zip(f["offset"], f["shape"]))]


class Setup:
    """Both sides of one reshard: manifests, plan, buffers, and two engines;
    the passive side's buffers registered remote-accessible and their
    descriptors recorded in its binding entries."""

    def __init__(self, mode, generation=5):
        self.mode = mode
        self.src_man, self.dst_man = manifests()
        self.plan = reshard.Plan(self.src_man, self.dst_man)
        self.src_bufs, self.src_views = carve(self.src_man, pad=0)
        self.dst_bufs, self.dst_views = carve(self.dst_man, pad=1)
        for i, v in self.src_views.items():
            v[...] = box(self.src_man, i)
        self.src_eng, self.dst_eng = ferry.Engine(), ferry.Engine()
        passive_eng, passive_bufs = ((self.dst_eng, self.dst_bufs) if mode == "sink"
                                     else (self.src_eng, self.src_bufs))
        self.descs = {r: passive_eng.register(b, remote=True) for r, b in passive_bufs.items()}
        self.generation = generation
        self.src = self.binding(self.src_man, self.src_views, mode == "reader", lease=1)
        self.dst = self.binding(self.dst_man, self.dst_views, mode == "sink", lease=2)
        self.engine = self.src_eng if mode == "sink" else self.dst_eng

    def binding(self, man, views, passive, lease, generation=None):
        b = reshard.Binding(man, instance=0xABC, generation=self.generation if generation is None else generation,
                            lease=lease)
        for i, v in views.items():
            rank = man.fragment(i)["rank"]
            b.add(i, v, worker=rank, desc=self.descs[rank] if passive else b"")
        return b

    def execute(self, **kw):
        kw.setdefault("engine", self.engine)
        kw.setdefault("mode", self.mode)
        return reshard.execute(self.plan, self.src, self.dst, **kw)

    def targets_untouched(self):
        return all((b == -1).all() for b in self.dst_bufs.values())

    def check_targets(self):
        for i, v in self.dst_views.items():
            np.testing.assert_array_equal(v, box(self.dst_man, i), err_msg=f"target fragment {i}")
        # the padding column between rows is never written
        for b in self.dst_bufs.values():
            assert (b == -1).sum() == 8, "padding of the 8 padded rows per rank"

    def close(self):
        self.src_eng.close()
        self.dst_eng.close()


@pytest.fixture(params=["sink", "reader"])
def setup(request):
    s = Setup(request.param)
    yield s
    s.close()


def test_binding_of_arrays():
    src, _ = manifests()
    bufs, views = carve(src, pad=0)
    b = reshard.Binding(src, instance=7, generation=3, lease=9)
    assert (b.instance, b.generation, b.lease, len(b)) == (7, 3, 9, 0)
    padded = np.zeros((4, 8), dtype=np.float32)[:, 1:7]      # rows of 8, 6 used
    b.add(0, padded, worker=0, desc=b"\x01\x02")
    b.add(1, views[1], worker=1)
    assert len(b) == 2
    e = b.entry(0)
    assert e["shape"] == (4, 6) and e["strides"] == (8, 1) and e["itemsize"] == 4
    assert e["addr"] == padded.ctypes.data and e["nbytes"] == (3 * 8 + 6) * 4 and e["desc"] == b"\x01\x02"
    assert b.placement_digest() == src.digest()
    # JSON round trip: same digest and text; reading against another placement fails
    text = b.to_json()
    again = reshard.Binding.from_json(text, src)
    assert again.digest() == b.digest() and again.to_json() == text and len(again) == 2
    other, _ = manifests()
    other.add_tensor("x", "f32", (1,))
    with pytest.raises(ferry.Error):
        reshard.Binding.from_json(text, other)
    # every field counts in the digest
    c = reshard.Binding(src, instance=7, generation=3, lease=10)
    c.add(0, padded, worker=0, desc=b"\x01\x02")
    c.add(1, views[1], worker=1)
    assert c.digest() != b.digest()
    with pytest.raises(KeyError):
        b.entry(2)


def test_binding_refuses_bad_arrays():
    src, _ = manifests()
    b = reshard.Binding(src, generation=1)
    a = np.zeros((4, 6), dtype=np.float32)
    with pytest.raises(ValueError, match="not a multiple"):
        b.add(0, np.lib.stride_tricks.as_strided(np.zeros(64, np.float32), shape=(4, 6), strides=(26, 4)))
    with pytest.raises(ValueError, match="negative"):
        b.add(0, a[::-1])
    with pytest.raises(ferry.Error) as e:
        b.add(0, np.zeros((4, 5), dtype=np.float32))          # shape differs from the fragment's
    assert e.value.code == -22 and "fragment 0" in str(e.value)
    with pytest.raises(ferry.Error):
        b.add(0, np.zeros((4, 6), dtype=np.float64))          # itemsize differs
    with pytest.raises(ferry.NotFoundError):
        b.add(99, a)
    b.add(0, a)
    with pytest.raises(ferry.ExistsError):
        b.add(0, a)
    with pytest.raises(ferry.Error):
        b.add(2, np.zeros(6, np.float32), desc=b"x" * 257)
    assert len(b) == 1


def test_binding_keeps_arrays_alive():
    src, _ = manifests()
    b = reshard.Binding(src)
    a = np.zeros((4, 6), dtype=np.float32)
    ref = weakref.ref(a)
    b.add(0, a)
    del a
    gc.collect()
    assert ref() is not None
    del b
    gc.collect()
    assert ref() is None


def test_execute_moves_every_byte(setup):
    res = setup.execute(workers=[0, 1])
    assert res["state"] == "COMPLETED" and res["error"] == 0
    assert res["bytes"] == res["bytes_done"] == setup.plan.stats()["bytes"] == (48 + 6) * 4
    assert res["ops"] >= 1 and res["batches"] >= 1 and res["pending"] == [] and res["quarantined"] == []
    setup.check_targets()
    # same host: the shm transport
    assert setup.engine.peer_transport(next(iter(setup.descs.values()))) == "shm"
    # nothing left registered by the executor: only the passive side's regions
    assert setup.engine.region_count() == 0
    assert (setup.src_eng if setup.mode == "reader" else setup.dst_eng).region_count() == 2


def test_execute_one_worker_at_a_time(setup):
    # each initiating worker in its own run, one op per batch: together they move everything
    total = 0
    for w in (0, 1):
        res = setup.execute(workers=[w], max_ops=1, window=2)
        assert res["state"] == "COMPLETED" and res["batches"] == res["ops"]
        total += res["bytes"]
    assert total == setup.plan.stats()["bytes"]
    setup.check_targets()


def test_sink_notifies_targets():
    s = Setup("sink")
    try:
        attested = reshard.attest(s.plan, s.src, s.dst)
        assert attested.generation == 5
        assert attested.counterparts(s.src, s.dst, [0], of_target=True) == [0, 1]
        assert attested.counterparts(s.src, s.dst, [0, 1], of_target=False) == [0, 1]
        res = reshard.execute(attested, s.src, s.dst, mode="sink", engine=s.src_eng, notify_tag=77)
        assert res["state"] == "COMPLETED"
        s.check_targets()
        # every WRITE landed before the notification: the values are the generation
        # one per target peer: both target workers live behind one engine here
        values = s.dst_eng.wait_notify(77, 1, timeout_ms=10000)
        assert values == [5]
        with pytest.raises(ferry.TimeoutError):
            s.dst_eng.wait_notify(77, 1, timeout_ms=0)
    finally:
        s.close()


def test_generation_mismatch_raises_before_any_byte(setup):
    with pytest.raises(ferry.StaleError) as e:
        setup.execute(generation=6)
    assert e.value.code == -errno.ESTALE and "generation" in str(e.value)
    assert setup.targets_untouched()
    # a binding made at another generation is stale too
    other = setup.binding(setup.dst_man, setup.dst_views, setup.mode == "sink", lease=2, generation=4)
    with pytest.raises(ferry.StaleError):
        reshard.execute(setup.plan, setup.src, other, mode=setup.mode, engine=setup.engine)
    assert setup.targets_untouched()


def test_binding_changed_after_attestation(setup):
    attested = reshard.attest(setup.plan, setup.src, setup.dst)
    attested.check(setup.src, setup.dst)
    # same memory, another lease: another digest, so stale against the attestation
    changed = setup.binding(setup.dst_man, setup.dst_views, setup.mode == "sink", lease=3)
    with pytest.raises(ferry.StaleError):
        attested.check(dst=changed)
    with pytest.raises(ferry.StaleError) as e:
        reshard.execute(attested, setup.src, changed, mode=setup.mode, engine=setup.engine)
    assert e.value.result["state"] == "ABORTED" and e.value.result["bytes_done"] == 0
    assert setup.targets_untouched()
    # the attested plan still runs with the bindings it was made for
    assert reshard.execute(attested, setup.src, setup.dst, mode=setup.mode, engine=setup.engine)["state"] == \
        "COMPLETED"
    setup.check_targets()


def test_bad_selectors(setup):
    with pytest.raises(ferry.Error) as e:
        setup.execute(workers=[])
    assert e.value.code == -22   # FERRY_EINVAL
    with pytest.raises(ferry.NotFoundError):
        setup.execute(workers=[7])
    with pytest.raises(ValueError):
        setup.execute(mode="push")
    assert setup.targets_untouched()


def test_missing_peer_raises(setup):
    with pytest.raises(ferry.NotFoundError) as e:
        setup.execute(peers={})
    assert "worker" in str(e.value) or "peer" in str(e.value)
    assert setup.targets_untouched()


class Guard:
    def __init__(self, gid, log, fail=None):
        self.id, self.log, self.fail = gid, log, fail

    def acquire(self):
        self.log.append(("acquire", self.id))
        if self.fail == "raise":
            raise RuntimeError(f"guard {self.id}: allocation gone")
        return self.fail != "false"

    def release(self):
        self.log.append(("release", self.id))


def test_guards_wrap_the_run(setup):
    log = []
    res = setup.execute(guards=[Guard(1, log), Guard(2, log)])
    assert res["state"] == "COMPLETED" and res["quarantined"] == []
    assert sorted(log[:2]) == [("acquire", 1), ("acquire", 2)]
    assert sorted(log[2:]) == [("release", 1), ("release", 2)]
    setup.check_targets()


@pytest.mark.parametrize("how", ["raise", "false"])
def test_failing_guard_aborts_and_releases_earlier_ones(setup, how):
    log = []
    guards = [Guard(1, log), Guard(2, log), Guard(3, log, fail=how), Guard(4, log)]
    with pytest.raises(ferry.Error) as e:
        setup.execute(guards=guards)
    r = e.value.result
    assert r["state"] == "ABORTED" and r["bytes_done"] == 0 and r["quarantined"] == []
    acquired = [g for op, g in log if op == "acquire"]
    released = [g for op, g in log if op == "release"]
    assert acquired == [1, 2, 3]          # in order; 4 never tried
    assert sorted(released) == [1, 2]     # each earlier guard released exactly once, 3 never
    if how == "raise":
        assert isinstance(e.value.__cause__, RuntimeError) and "allocation gone" in str(e.value.__cause__)
    assert setup.targets_untouched()
    # the same engines run fine afterwards
    assert setup.execute()["state"] == "COMPLETED"
    setup.check_targets()


def test_duplicate_guard_ids_refused(setup):
    log = []
    with pytest.raises(ferry.ExistsError):
        setup.execute(guards=[Guard(1, log), Guard(1, log)])
    assert log == [] and setup.targets_untouched()


def test_engine_lifetimes():
    with ferry.Engine() as e:
        a = np.zeros(16, dtype=np.float32)
        ref = weakref.ref(a)
        d = e.register(a, remote="read")
        assert isinstance(d, bytes) and 0 < len(d) <= 256 and e.region_count() == 1
        assert e.address.startswith("tcp://") and len(e.export()) > 0
        with pytest.raises(ValueError):
            e.register(np.zeros(4, np.float32)[::-1])
        with pytest.raises(ValueError):
            e.register(np.zeros(4, np.float32), remote="sideways")
        del a
        gc.collect()
        assert ref() is not None       # registered memory stays alive
        x = reshard.Executor(e, "reader", [0])
    assert e.closed and ref() is None
    assert x.registered == 0 and x.cleanup() is True
    with pytest.raises(ferry.Error):
        e.register(np.zeros(4, np.float32))
    src, dst = manifests()
    sb, db = reshard.Binding(src, generation=1), reshard.Binding(dst, generation=1)
    attested = reshard.attest(reshard.Plan(src, dst), sb, db)
    with pytest.raises(ferry.Error) as err:
        x.run(attested, sb, db)
    assert "closed" in str(err.value)


def test_read_only_targets_refused(setup):
    views = {i: v.copy() for i, v in setup.dst_views.items()}
    for v in views.values():
        v.flags.writeable = False
    ro = reshard.Binding(setup.dst_man, instance=0xABC, generation=5, lease=2)
    for i, v in views.items():
        ro.add(i, v, worker=setup.dst_man.fragment(i)["rank"])
    with pytest.raises(ValueError, match="read-only"):
        reshard.execute(setup.plan, setup.src, ro, mode=setup.mode, engine=setup.engine, peers={})
    assert all((v == -1).all() for v in views.values())
