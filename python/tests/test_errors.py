"""Errors a Python user can act on (docs/python.md, "Errors"): messages say
what failed, in words, and for how much longer — no protocol operation
names (PUT_START:, GET_REPLICAS:) and no absolute epoch milliseconds — and
one event raises one exception class, in every module and on every rank."""

import errno
import os
import re
import subprocess
import threading

import numpy as np
import pytest

import ferry
from conftest import FERRY_BIN, NODE_SIZE, cluster_fixture, running_cluster, require_ferry_bin
from ferry import reshard

cluster = cluster_fixture(1, "errors")

# the store protocol's message names: PUT_START, GET_REPLICAS, KV_CAS, Q_POP, ...
# and the one-word ones (REMOVE, EXIST, ...); "KV" alone is a word of the docs
OP_NAME = re.compile(r"\b[A-Z]+(?:_[A-Z]+)+\b|\b(?:REMOVE|EXIST|LIST|WATCH|UNWATCH|BARRIER|STATUS|SEGMENT|MOUNT|"
                     r"UNMOUNT|HEARTBEAT)\b")
EPOCH_MS = re.compile(r"\d{13}")


def failure(fn, cls):
    with pytest.raises(cls) as e:
        fn()
    return e.value


def check_message(e, *words):
    msg = str(e)
    assert not OP_NAME.search(msg), f"protocol operation name in {msg!r}"
    assert not EPOCH_MS.search(msg), f"absolute epoch milliseconds in {msg!r}"
    for w in words:
        assert w in msg, f"{w!r} not in {msg!r}"
    return msg


def test_common_store_failures_say_what_failed(cluster, store):
    msgs = []
    store.put("e/x", b"1")
    msgs.append(check_message(failure(lambda: store.put("e/x", b"2"), ferry.ExistsError), "put of 'e/x'", "exists"))
    msgs.append(check_message(failure(lambda: store.get("e/none"), ferry.NotFoundError), "'e/none'"))
    msgs.append(check_message(failure(lambda: store.remove("e/none"), ferry.NotFoundError), "removing 'e/none'"))
    msgs.append(check_message(failure(lambda: store.get_into("e/none", bytearray(4)), ferry.NotFoundError),
                              "'e/none'"))
    big = np.zeros(NODE_SIZE * 2, np.uint8)
    msgs.append(check_message(failure(lambda: store.put("e/big", big), ferry.NoSpaceError), "'e/big'"))
    msgs.append(check_message(failure(lambda: store.get_into("e/x", bytearray(0)), ferry.Error), "get_into('e/x')",
                              "nothing was read"))
    rev = store.kv_put("e/kv", b"a")
    e = failure(lambda: store.kv_cas("e/kv", rev + 7, b"b"), ferry.ConflictError)
    assert e.current_revision == rev
    msgs.append(check_message(e, "'e/kv'"))
    msgs.append(check_message(failure(lambda: store.barrier("e/bar", "a", 2, timeout_ms=50), ferry.TimeoutError),
                              "'e/bar'"))
    store.queue_push("e/q", b"r")
    (rid, tok, _), = store.queue_pop("e/q", lease_ms=60000)   # not 1: it lapsed before the nack under load
    store.queue_nack(rid, tok)
    (rid2, tok2, _), = store.queue_pop("e/q", lease_ms=60000)
    msgs.append(check_message(failure(lambda: store.queue_ack(rid, tok), ferry.StaleError), str(rid)))
    store.queue_ack(rid2, tok2)
    store.put_struct("e/st", {"w": np.zeros(4, np.float32)})
    msgs.append(check_message(failure(lambda: store.read_member("e/st", "nope"), ferry.NotFoundError), "nope"))
    with cluster.store(lease_ms=60000) as s:
        s.put("e/leased", b"x")
        s.get("e/leased")
        msg = check_message(failure(lambda: s.remove("e/leased"), ferry.BusyError), "removing 'e/leased'",
                            "ms more")
        left = int(re.search(r"for (\d+) ms more", msg).group(1))
        assert 0 < left <= 60000, msg                       # how much longer, not until when
        msgs.append(msg)
    print("\n".join(msgs))


def test_connection_and_auth_failures(cluster):
    e = failure(lambda: ferry.Store(master="127.0.0.1:1", token="t" * 32, timeout_ms=500), ferry.ConnectionError)
    check_message(e, "127.0.0.1:1")
    e = failure(lambda: ferry.Store(master=cluster.addr, token="wrong" * 8, timeout_ms=2000), ferry.AuthError)
    check_message(e)


def test_setup_mistakes_lead_with_the_cause(cluster, monkeypatch):
    """No token at all, and an address without a port: the message says
    which, first, not what failed because of it."""
    monkeypatch.delenv("FERRY_TOKEN", raising=False)
    monkeypatch.delenv("FERRY_TOKEN_FILE", raising=False)
    e = failure(lambda: ferry.Store(master=cluster.addr), ferry.AuthError)
    assert str(e).startswith("no cluster token: set FERRY_TOKEN or FERRY_TOKEN_FILE"), str(e)
    e = failure(lambda: ferry.Store(master="localhost", token_file=cluster.token_file), ferry.Error)
    check_message(e, "'localhost' has no port", "HOST:PORT")
    with ferry.Store(master=cluster.addr, token_file=cluster.token_file) as s:
        s.put("errors/plain", b"x" * 64)
        e = failure(lambda: s.read_member("errors/plain", "w"), ferry.Error)
        check_message(e, "plain object, not a structured one")
        # ids: integers in the dicts, 16 hex digits as the CLI, logs and metrics print them
        seg = s.get_replica_desc("errors/plain")["replicas"][0]["segment"]
        assert isinstance(seg, int) and len(ferry.hex_id(seg)) == 16 and int(ferry.hex_id(seg), 16) == seg
        env = dict(os.environ, FERRY_MASTER=cluster.addr, FERRY_TOKEN_FILE=cluster.token_file)
        shown = subprocess.run([FERRY_BIN, "status"], env=env, capture_output=True, text=True, timeout=60)
        assert ferry.hex_id(seg) in shown.stdout, shown.stdout      # the form `ferry status` prints


def test_lost_master_mid_session(tmp_path):
    require_ferry_bin()
    with running_cluster(tmp_path, 1) as c:
        with c.store(timeout_ms=1000) as s:
            s.put("m/a", b"1")
            c.procs[0].kill()
            c.procs[0].wait()
            e = failure(lambda: s.put("m/b", b"2"), ferry.ConnectionError)
            check_message(e, "'m/b'", "master")


def test_one_class_per_code_in_every_module(store):
    """EEXIST is ExistsError from the store and from a manifest alike;
    EAGAIN is QueueFullError from a store queue and a sample queue."""
    m = reshard.Manifest(1)
    m.add_tensor("w", "f32", (2,))
    e = failure(lambda: m.add_tensor("w", "f32", (2,)), ferry.ExistsError)
    assert e.code == -errno.EEXIST
    store.put("cls/x", b"1")
    assert failure(lambda: store.put("cls/x", b"1"), ferry.ExistsError).code == -errno.EEXIST
    with ferry.SampleQueue(store, "cls-q", bound=1, fail_when_full=True) as q:
        sess = ferry.RolloutSession(session_id="s", policy_version=1)
        q.push(sess, np.arange(2, dtype=np.int32), np.zeros(2, np.float32), np.zeros(1, np.float32))
        e = failure(lambda: q.push(ferry.RolloutSession(session_id="t", policy_version=1),
                                   np.arange(2, dtype=np.int32), np.zeros(2, np.float32),
                                   np.zeros(1, np.float32)), ferry.QueueFullError)
        assert e.code == -errno.EAGAIN and isinstance(e, ferry.Error)
        check_message(e)
    assert ferry.store.QueueFullError is ferry.QueueFullError


def test_same_event_same_class_on_every_rank(cluster):
    """A barrier that times out: every member raises TimeoutError."""
    out = {}

    def member(name):
        with cluster.store() as s:
            try:
                s.barrier("ranks/bar", name, 3, timeout_ms=300)
            except ferry.Error as e:
                out[name] = e

    ts = [threading.Thread(target=member, args=(f"r{i}",)) for i in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert sorted(out) == ["r0", "r1"]
    assert {type(e) for e in out.values()} == {ferry.TimeoutError}
    for e in out.values():
        check_message(e, "'ranks/bar'")


def test_compat_group_loader_failure_same_on_every_worker(cluster, store):
    """One worker's fn raises: every worker raises the same ferry.Error
    (FERRY_EREBUILD) with one message; the failing one chains its cause."""
    w = np.arange(64, dtype=np.float32)
    ferry.WeightPublisher(store, "errs", 0, 1).publish(1, [("a", w), ("b", w + 1)])
    out = {}
    ready = threading.Barrier(2)

    def worker(rank):
        with cluster.store() as s:
            with ferry.CompatGroup(s, "errs", "g", rank, 2, timeout_ms=20000) as g:
                ready.wait()

                def fn(name, arr):
                    if rank == 1 and name == "b":
                        raise ValueError("this loader refuses b")

                try:
                    g.update(fn)
                except Exception as e:   # noqa: B902 - what each worker raises is the point
                    out[rank] = e

    ts = [threading.Thread(target=worker, args=(r,)) for r in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    assert sorted(out) == [0, 1], out
    assert {type(e) for e in out.values()} == {ferry.Error}, out
    assert {e.code for e in out.values()} == {-(4096 + 6)}        # FERRY_EREBUILD
    assert len({str(e) for e in out.values()}) == 1, out
    assert str(out[0]).startswith("worker 1: ") and "tensor b" in str(out[0])
    assert isinstance(out[1].__cause__, ValueError)
    for e in out.values():
        check_message(e)
