"""ferry.Store against a real cluster: one `ferry master` and two `ferry node`
processes started for this module (FERRY_BIN, default build/ferry)."""

import errno
import threading
import time

import numpy as np
import pytest

import ferry
from conftest import NODE_SIZE, START_S, cluster_fixture, require_ferry_bin, running_cluster

NODES = 2

FERRY_EAUTH = -(4096 + 1)

cluster = cluster_fixture(NODES, "store")


def test_put_get_roundtrip(store):
    assert store.put("rt/bytes", b"hello ferry") == 0   # Mooncake's convention
    placed = store.get_replica_desc("rt/bytes")
    assert placed["size"] == 11 and len(placed["replicas"]) == 1
    assert store.get("rt/bytes") == b"hello ferry"
    a = np.arange(10000, dtype=np.float32).reshape(100, 100)
    store.put("rt/np", a)
    back = np.frombuffer(store.get("rt/np"), dtype=np.float32).reshape(100, 100)
    assert np.array_equal(a, back)
    store.put("rt/empty-ish", bytearray(b"\x00\x01"))
    assert store.get("rt/empty-ish") == b"\x00\x01"
    with pytest.raises((BufferError, ValueError)):
        store.put("rt/strided", a[:, ::2])   # not C-contiguous: refused, not copied silently
    assert not store.is_exist("rt/strided")


def test_warm_keeps_objects(store):
    """Store.warm touches every page of this machine's segments (every one of
    the NODES nodes runs here) and leaves what they hold as it was."""
    a = np.random.default_rng(3).integers(0, 255, size=1 << 20, dtype=np.uint8)
    store.put("warm/a", a)
    segs = store.status()["segments"]
    total = sum(sg["size"] for sg in segs)
    assert len(segs) == NODES
    assert store.warm() == total                   # for reading
    assert store.warm(write=True) == total         # for writing: each page rewritten with its own value
    assert np.array_equal(np.frombuffer(store.get("warm/a"), dtype=np.uint8), a)


def test_put_from_get_into_registered(store):
    src = np.random.default_rng(1).integers(0, 1 << 30, size=(256, 1024), dtype=np.int64)
    dst = np.zeros_like(src)
    store.register_buffer(src)
    store.register_buffer(dst)
    try:
        with pytest.raises(ferry.ExistsError):
            store.register_buffer(src[10:])   # overlaps a registered buffer
        placed = store.put_placed("reg/a", src)
        assert placed["size"] == src.nbytes
        assert store.get_into("reg/a", dst) == src.nbytes
        assert np.array_equal(src, dst)
        small = np.zeros(16, dtype=np.int64)
        with pytest.raises(ferry.Error) as e:
            store.get_into("reg/a", small)
        assert e.value.code == -errno.EMSGSIZE and str(src.nbytes) in str(e.value)
        assert not small.any()
    finally:
        store.unregister_buffer(src)
        store.unregister_buffer(dst)
    with pytest.raises(ferry.NotFoundError):
        store.unregister_buffer(src)
    # unregistered memory works too (registered for the call)
    dst2 = np.empty_like(src)
    assert store.get_into("reg/a", memoryview(dst2)) == src.nbytes
    assert np.array_equal(src, dst2)


def test_get_into_ranges(store):
    data = {f"rng/{i}": bytes((i * 7 + j) % 251 for j in range(1000 + i)) for i in range(3)}
    for k, v in data.items():
        store.put(k, v)
    bufs = [bytearray(100), np.zeros(64, dtype=np.uint8), bytearray(50), bytearray(10), bytearray(8)]
    ranges = [("rng/0", 0, bufs[0]),
              ("rng/1", 500, bufs[1]),
              ("rng/2", 990, bufs[2]),              # 1002-byte object: 12 bytes left
              ("rng/missing", 0, bufs[3]),
              ("rng/0", 100, memoryview(bufs[4]), 4)]
    res = store.get_into_ranges(ranges)
    assert res[:3] == [100, 64, 12]
    assert res[3] == -errno.ENOENT
    assert res[4] == 4
    assert bytes(bufs[0]) == data["rng/0"][:100]
    assert bytes(bufs[1]) == data["rng/1"][500:564]
    assert bytes(bufs[2][:12]) == data["rng/2"][990:]
    assert bytes(bufs[4][:4]) == data["rng/0"][100:104] and bytes(bufs[4][4:]) == b"\0" * 4
    assert store.get_into_ranges([("rng/0", 5000, bytearray(4))]) == [-errno.ERANGE]
    assert store.get_into_ranges([]) == []
    with pytest.raises(ValueError, match="read-only"):
        store.get_into_ranges([("rng/0", 0, b"readonly")])   # destinations must be writable
    with pytest.raises(ValueError):
        store.get_into_ranges([("rng/0", 0, bytearray(4), 5)])


def test_batch_calls(store):
    keys = [f"batch/{i}" for i in range(5)]
    vals = [np.full(1000 + i, i, dtype=np.uint8) for i in range(5)]
    store.put(keys[2], b"already")
    res = store.batch_put_from(keys, vals)
    assert res == [0, 0, -errno.EEXIST, 0, 0]
    outs = [np.zeros(2000, dtype=np.uint8) for _ in range(5)]
    got = store.batch_get_into(keys + ["batch/none"], outs + [bytearray(4)])
    assert got == [1000, 1001, 7, 1003, 1004, -errno.ENOENT]
    for i in (0, 1, 3, 4):
        assert np.array_equal(outs[i][:1000 + i], vals[i]) and not outs[i][1000 + i:].any()
    assert bytes(outs[2][:7]) == b"already"
    with pytest.raises(ValueError):
        store.batch_get_into(keys, outs[:2])


def test_exist_remove_list(store):
    for k in ("ls/a/1", "ls/a/2", "ls/a/3", "ls/b/1"):
        store.put(k, k.encode())
    assert store.list("ls/a/") == ["ls/a/1", "ls/a/2", "ls/a/3"]
    assert store.list("ls/") == ["ls/a/1", "ls/a/2", "ls/a/3", "ls/b/1"]
    assert store.list("ls/a/", after="ls/a/1", limit=1) == ["ls/a/2"]
    assert store.list_page("ls/a/", None, 2) == (["ls/a/1", "ls/a/2"], True)
    assert store.list_page("ls/a/", "ls/a/2", 2) == (["ls/a/3"], False)
    assert store.list_all("ls/", page=1) == ["ls/a/1", "ls/a/2", "ls/a/3", "ls/b/1"]
    assert store.is_exist("ls/a/1") and not store.is_exist("ls/zzz")
    store.remove("ls/b/1")
    assert not store.is_exist("ls/b/1")
    with pytest.raises(ferry.NotFoundError):
        store.remove("ls/b/1")
    assert store.remove_prefix("ls/a/") == 3
    assert store.list("ls/") == []
    assert store.remove_prefix("ls/") == 0


def test_exists_and_not_found_errors(store):
    store.put("err/x", b"1")
    with pytest.raises(ferry.ExistsError) as e:
        store.put("err/x", b"2")
    assert isinstance(e.value, ferry.Error) and e.value.code == -errno.EEXIST and str(e.value)
    assert store.get("err/x") == b"1"
    with pytest.raises(ferry.NotFoundError) as e:
        store.get("err/nope")
    assert e.value.code == -errno.ENOENT and str(e.value)
    with pytest.raises(ferry.NotFoundError):
        store.get_replica_desc("err/nope")
    with pytest.raises(ferry.NotFoundError):
        store.get_into("err/nope", bytearray(8))
    with pytest.raises(ferry.NoSpaceError) as e:
        store.put("err/huge", np.zeros(NODE_SIZE * 2, dtype=np.uint8))
    assert e.value.code == -errno.ENOSPC
    assert not store.is_exist("err/huge")


def test_replicate_config(store):
    # the segment ids, as u64 (status() JSON carries them as signed ints)
    store.put("rep/probe", b"p", config=ferry.ReplicateConfig(replica_num=NODES))
    segs = sorted(r["segment"] for r in store.get_replica_desc("rep/probe")["replicas"])
    assert len(set(segs)) == NODES
    assert sorted(s["id"] % (1 << 64) for s in store.status()["segments"]) == segs
    for seg in segs:
        cfg = ferry.ReplicateConfig(preferred_segments=[seg])
        placed = store.put_placed(f"rep/pref-{seg}", b"x" * 4096, config=cfg)
        assert placed["replicas"][0]["segment"] == seg and placed["replicas"][0]["preferred"]
        d = store.get_replica_desc(f"rep/pref-{seg}")
        assert d["size"] == 4096 and len(d["replicas"]) == 1
        r = d["replicas"][0]
        # the put's placement says whether a preference was met; the master
        # does not keep it, so get_replica_desc reports where, not why
        assert r["segment"] == seg and r["node"] == placed["replicas"][0]["node"]
        assert r["offset"] == placed["replicas"][0]["offset"]
        assert set(r) == {"segment", "node", "offset", "preferred"}
    store.put("rep/two", b"y" * 100, config=ferry.ReplicateConfig(replica_num=2, hard_pin=True))
    d = store.get_replica_desc("rep/two")
    assert sorted(r["segment"] for r in d["replicas"]) == segs
    assert len({r["node"] for r in d["replicas"]}) == 2
    assert not any(r["preferred"] for r in store.put_placed("rep/three", b"w").get("replicas"))
    store.put("rep/dict", b"z", config={"replica_num": 2})
    assert len(store.get_replica_desc("rep/dict")["replicas"]) == 2
    with pytest.raises(ValueError):
        store.put("rep/bad", b"z", config=ferry.ReplicateConfig(replica_num=99))


def test_struct(store):
    rng = np.random.default_rng(7)
    w = rng.standard_normal((6, 3)).astype(np.float32)
    ids = np.arange(5, dtype=np.int64) * 1000
    mask = np.array([True, False, True])
    half = rng.standard_normal((4, 2)).astype(np.float16)
    bf = np.arange(8, dtype=np.uint16).reshape(2, 4) + 0x3f00
    scalar = np.float64(2.5)
    store.put_struct("st/obj", {"w": w, "ids": ids, "mask": mask, "half": half, "bf": (bf, "bf16"),
                                "scalar": scalar})
    ms = store.get_members("st/obj")
    assert [m["name"] for m in ms] == ["w", "ids", "mask", "half", "bf", "scalar"]
    by = {m["name"]: m for m in ms}
    assert by["w"]["dtype"] == "f32" and by["w"]["shape"] == (6, 3) and by["w"]["nbytes"] == w.nbytes
    assert by["ids"]["dtype"] == "i64" and by["mask"]["dtype"] == "bool" and by["half"]["dtype"] == "f16"
    assert by["bf"]["dtype"] == "bf16" and by["scalar"]["shape"] == ()
    assert all(m["offset"] % 64 == 0 for m in ms)
    rows = store.read_member("st/obj", "w", rows=(2, 5))
    assert rows.dtype == np.float32 and rows.shape == (3, 3) and np.array_equal(rows, w[2:5])
    assert np.array_equal(store.read_member("st/obj", "ids"), ids)
    assert np.array_equal(store.read_member("st/obj", "mask"), mask)
    assert np.array_equal(store.read_member("st/obj", "half", rows=(3, 4)), half[3:4])
    b = store.read_member("st/obj", "bf")
    assert b.dtype == np.uint16 and np.array_equal(b, bf)
    s = store.read_member("st/obj", "scalar")
    assert s.shape == () and s == 2.5
    assert store.read_member("st/obj", "w", rows=(6, 6)).shape == (0, 3)
    with pytest.raises(IndexError):
        store.read_member("st/obj", "w", rows=(4, 7))
    with pytest.raises(ferry.Error) as e:
        store.read_member_into("st/obj", "w", 4, 7, np.zeros((3, 3), np.float32))
    assert e.value.code == -errno.ERANGE
    with pytest.raises(ferry.NotFoundError):
        store.read_member("st/obj", "nope")
    with pytest.raises(ValueError):
        store.put_struct("st/bad", {"c": np.zeros(2, dtype=np.complex64)})
    with pytest.raises(ValueError):
        store.put_struct("st/bad", {"x": (np.zeros(2, dtype=np.float32), "bf16")})
    store.put("st/plain", b"not a struct")
    with pytest.raises(ferry.Error) as e:
        store.get_members("st/plain")
    assert e.value.code == -errno.EPROTO


def test_kv(store):
    assert store.kv_get("kv/a") is None
    r1 = store.kv_put("kv/a", b"one")
    assert r1 > 0 and store.kv_get("kv/a") == (b"one", r1)
    r2 = store.kv_cas("kv/a", r1, b"two")
    assert r2 > r1 and store.kv_get("kv/a") == (b"two", r2)
    with pytest.raises(ferry.ConflictError) as e:
        store.kv_cas("kv/a", r1, b"three")
    assert e.value.current_revision == r2 and e.value.code == -(4096 + 4)
    assert store.kv_get("kv/a") == (b"two", r2)
    with pytest.raises(ferry.ConflictError):
        store.kv_cas("kv/a", 0, b"must not exist")
    r0 = store.kv_cas("kv/new", 0, b"fresh")
    assert r0 > r2
    with pytest.raises(ferry.ConflictError):
        store.kv_delete("kv/a", expected_rev=r1)
    r3 = store.kv_delete("kv/a", expected_rev=r2)
    assert r3 > r0 and store.kv_get("kv/a") is None
    assert store.kv_delete("kv/new") > r3
    big = np.zeros(4096, dtype=np.uint8)
    store.kv_put("kv/np", big)
    assert store.kv_get("kv/np")[0] == big.tobytes()


def test_watch_sees_other_store(cluster, store):
    with cluster.store() as other:
        w = store.watch("wx/")
        assert w.next(timeout_ms=50) is None   # nothing yet
        got = []
        t = threading.Thread(target=lambda: got.append(w.next(timeout_ms=10000)))
        t.start()
        rev = other.kv_put("wx/a", b"1")
        t.join(15)
        assert not t.is_alive()
        assert got == [(rev, "wx/a", b"1")]
        other.kv_put("other/b", b"2")               # outside the prefix
        rev2 = other.kv_delete("wx/a")
        assert w.next(timeout_ms=10000) == (rev2, "wx/a", None)
        rev3 = other.kv_put("wx/c", b"3")
        assert next(iter(w)) == (rev3, "wx/c", b"3")
        # from_rev replays history
        with store.watch("wx/", from_rev=rev) as w2:
            assert [w2.next(10000) for _ in range(3)] == [(rev, "wx/a", b"1"), (rev2, "wx/a", None),
                                                          (rev3, "wx/c", b"3")]
        with pytest.raises(ValueError):
            w2.next(0)
        w.close()


def test_barrier_three_threads(cluster):
    stores = [cluster.store() for _ in range(3)]
    gens = [[None, None] for _ in range(3)]
    errs = []

    def member(i):
        try:
            for rnd in range(2):
                gens[i][rnd] = stores[i].barrier("bar/x", f"m{i}", 3, timeout_ms=20000)
        except Exception as e:   # reported below
            errs.append(e)

    ts = [threading.Thread(target=member, args=(i,)) for i in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    try:
        assert not errs and not any(t.is_alive() for t in ts)
        assert len({g[0] for g in gens}) == 1 and len({g[1] for g in gens}) == 1
        assert gens[0][1] == gens[0][0] + 1
        # one Store shared by three threads works the same
        shared = []
        ts = [threading.Thread(target=lambda i=i: shared.append(stores[0].barrier("bar/shared", f"s{i}", 3,
                                                                                  timeout_ms=20000)))
              for i in range(3)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(60)
        assert len(shared) == 3 and len(set(shared)) == 1
        with pytest.raises(ferry.TimeoutError) as e:
            stores[0].barrier("bar/alone", "m0", 2, timeout_ms=100)
        assert isinstance(e.value, TimeoutError) and e.value.code == -errno.ETIMEDOUT
    finally:
        for s in stores:
            s.close()


def test_queue(store):
    ids = [store.queue_push("q/jobs", f"job-{i}".encode()) for i in range(3)]
    assert ids == sorted(ids) and len(set(ids)) == 3
    recs = store.queue_pop("q/jobs", max=2, lease_ms=30000)
    assert [(r[0], r[2]) for r in recs] == [(ids[0], b"job-0"), (ids[1], b"job-1")]
    store.queue_ack(recs[0][0], recs[0][1])
    store.queue_nack(recs[1][0], recs[1][1])
    again = store.queue_pop("q/jobs", max=10)
    assert sorted((r[0], r[2]) for r in again) == [(ids[1], b"job-1"), (ids[2], b"job-2")]
    redelivered = next(r for r in again if r[0] == ids[1])
    assert redelivered[1] != recs[1][1]
    with pytest.raises(ferry.Error):
        store.queue_ack(recs[1][0], recs[1][1])   # the old delivery's token
    for r in again:
        store.queue_ack(r[0], r[1])
    assert store.queue_pop("q/jobs", max=10) == []
    with pytest.raises(ValueError):
        store.queue_pop("q/jobs", max=0)


def test_wrong_token(cluster):
    s = ferry.Store()
    with pytest.raises(ferry.AuthError) as e:
        s.setup(master=cluster.addr, token="0" * 64, timeout_ms=5000)
    assert e.value.code == FERRY_EAUTH and isinstance(e.value, ferry.Error)
    assert not s.is_open


def test_connection_refused():
    import socket
    with socket.socket() as sk:   # a port nobody listens on
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    with pytest.raises((ferry.ConnectionError, ferry.TimeoutError)) as e:
        ferry.Store(master=f"127.0.0.1:{port}", token="x" * 64, timeout_ms=1000)
    assert e.value.code in (-errno.ECONNREFUSED, -errno.ETIMEDOUT)


def test_setup_from_environment(cluster, monkeypatch):
    monkeypatch.setenv("FERRY_MASTER", cluster.addr)
    monkeypatch.setenv("FERRY_TOKEN_FILE", cluster.token_file)
    monkeypatch.delenv("FERRY_TOKEN", raising=False)
    with ferry.Store() as s:
        assert not s.is_open
        s.setup()
        assert s.is_open
        s.put("env/k", b"v")
        assert s.get("env/k") == b"v"
    assert not s.is_open
    with pytest.raises(ValueError):
        s.get("env/k")
    s.close()   # closing twice is fine
    monkeypatch.setenv("FERRY_TOKEN", cluster.token)
    monkeypatch.delenv("FERRY_TOKEN_FILE")
    with ferry.Store() as s:
        s.setup()
        assert s.get("env/k") == b"v"
        with pytest.raises(ValueError):
            s.setup()


def test_status(store):
    st = store.status()
    segs = st["segments"]
    assert len(segs) == NODES
    assert all(s["size"] == NODE_SIZE for s in segs)
    assert len({s["node"] for s in segs}) == NODES
    assert st["objects"] >= 0 and st["kv_revision"] >= 0


def test_gil_released_during_calls(cluster, store):
    """A watch blocked in next() in one thread leaves the interpreter free."""
    w = store.watch("gil/")
    done = threading.Event()
    out = []

    def waiter():
        out.append(w.next(timeout_ms=20000))
        done.set()

    t = threading.Thread(target=waiter)
    t.start()
    n = 0
    deadline = time.monotonic() + 0.3
    while time.monotonic() < deadline:   # the main thread keeps running Python
        n += 1
    assert n > 1000 and not done.is_set()
    rev = store.kv_put("gil/x", b"1")
    assert done.wait(15) and out == [(rev, "gil/x", b"1")]
    t.join()
    w.close()
    with pytest.raises(ValueError):
        w.next(0)


def test_lease_blocks_remove(cluster):
    with cluster.store(lease_ms=60000) as s:
        s.put("lease/a", b"held")
        s.put("lease/b", b"free")
        assert s.get("lease/a") == b"held"     # leased for a minute
        with pytest.raises(ferry.BusyError) as e:
            s.remove("lease/a")
        assert e.value.code == -errno.EBUSY and "lease" in str(e.value)
        assert s.remove_prefix("lease/") == 1   # only the unleased one
        assert s.list("lease/") == ["lease/a"]


def test_lost_object(tmp_path):
    """A node dies: its objects raise LostError (own cluster: it kills a node)."""
    require_ferry_bin()
    with running_cluster(tmp_path, 1, ["--heartbeat-timeout", "2000"]) as c:
        procs = c.procs
        with c.store() as s:
            s.put("lost/x", b"gone soon")
            assert s.is_exist("lost/x")
            procs[1].kill()
            procs[1].wait()
            deadline = time.monotonic() + START_S
            while True:
                try:
                    s.is_exist("lost/x")
                except ferry.LostError as e:
                    assert e.code == -(4096 + 5) and "lost" in str(e)
                    break
                assert time.monotonic() < deadline, "the master never declared the node dead"
                time.sleep(0.05)
            with pytest.raises(ferry.LostError):
                s.get("lost/x")
            with pytest.raises(ferry.LostError):
                s.get_into("lost/x", bytearray(16))


LEASE_MAX_MS = 3600000   # FERRY_STORE_LEASE_MAX_MS
POP_MAX = 4096           # FERRY_STORE_POP_MAX


def test_unsigned_arguments_refuse_negatives(store):
    """Revisions, ids, tokens, offsets, counts and leases are unsigned in C:
    a negative is a ValueError naming the argument, never a wrapped-around
    2**64-1 (kv_cas(expected_rev=-1) compared against that revision)."""
    r = store.kv_put("neg/a", b"x")
    with pytest.raises(ValueError, match=r"expected_rev .*not -1"):
        store.kv_cas("neg/a", -1, b"y")
    with pytest.raises(ValueError, match="expected_rev"):
        store.kv_cas("neg/a", 2**64, b"y")
    with pytest.raises(ValueError, match="expected_rev"):
        store.kv_delete("neg/a", expected_rev=-1)
    assert store.kv_get("neg/a") == (b"x", r)
    with pytest.raises(ValueError, match="from_rev"):
        store.watch("neg/", from_rev=-1)
    with pytest.raises(TypeError):
        store.kv_cas("neg/a", 1.5, b"y")
    assert store.kv_cas("neg/a", np.uint64(r), b"y") > r   # any integer type is fine
    with pytest.raises(ValueError, match="count"):
        store.barrier("neg/b", "m", -1, timeout_ms=100)
    with pytest.raises(ValueError, match="timeout_ms"):
        store.barrier("neg/b", "m", 1, timeout_ms=-1)
    qid = store.queue_push("neg/q", b"rec")
    with pytest.raises(ValueError, match="id"):
        store.queue_ack(-1, 0)
    with pytest.raises(ValueError, match="token"):
        store.queue_nack(qid, -1)
    with pytest.raises(ValueError, match="row_begin"):
        store.read_member_into("neg/s", "w", -1, 1, bytearray(8))
    store.put("neg/obj", b"0123456789")
    with pytest.raises(ValueError, match=r"ranges\[0\]: src_offset"):
        store.get_into_ranges([("neg/obj", -1, bytearray(4))])
    with pytest.raises(ValueError, match=r"ranges\[0\]: length"):
        store.get_into_ranges([("neg/obj", 0, bytearray(4), -1)])
    with pytest.raises(ValueError, match="replica_num"):
        store.put("neg/r", b"x", {"replica_num": -1})
    with pytest.raises(ValueError, match="preferred segment"):
        store.put("neg/r", b"x", ferry.ReplicateConfig(preferred_segments=[-1]))
    with pytest.raises(ValueError, match="shape"):
        store.put_struct_raw("neg/s", [("w", "f32", (-1,), bytearray(4))])
    assert not store.is_exist("neg/r") and not store.is_exist("neg/s")
    # the record was never touched: its first delivery is still to come
    (rec,) = store.queue_pop("neg/q", max=1)
    assert rec[0] == qid and rec[2] == b"rec"
    store.queue_ack(rec[0], rec[1])


def test_queue_pop_and_lease_bounds(cluster, store):
    """queue_pop's cap is the C library's (1 to 4096) and a lease is at most
    an hour; the errors name the range."""
    qid = store.queue_push("bound/q", b"r")
    for bad in (POP_MAX + 1, 0, -1, 65536):
        with pytest.raises(ValueError, match=f"max must be an integer from 1 to {POP_MAX}"):
            store.queue_pop("bound/q", max=bad)
    for bad in (0, -1, LEASE_MAX_MS + 1, 2**64 - 1):
        with pytest.raises(ValueError, match=f"lease_ms must be an integer from 1 to {LEASE_MAX_MS}"):
            store.queue_pop("bound/q", max=1, lease_ms=bad)
    (rec,) = store.queue_pop("bound/q", max=POP_MAX, lease_ms=LEASE_MAX_MS)
    assert rec[0] == qid and rec[1] == 1   # the refused pops leased nothing
    store.queue_ack(rec[0], rec[1])
    for bad in (-1, LEASE_MAX_MS + 1):
        with pytest.raises(ValueError, match="lease_ms"):
            cluster.store(lease_ms=bad)
    with cluster.store(lease_ms=LEASE_MAX_MS) as s:
        assert s.is_open
