"""ferry.samples against a real cluster (one `ferry master`, one `ferry
node`, FERRY_BIN): records and their agreement with the C encoders, the
version rule (drop, recompute, max_policy_lag), backpressure, the policy
registry and its watch, the KV-reuse gate; and examples/grpo_loop.py run
end to end with a few steps."""

import errno
import json
import os
import select
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import ferry
from conftest import FERRY_BIN, REPO, cluster_fixture
from ferry import weights
from ferry.samples import admit

WAIT_S = 20.0           # deadline for any condition below

cluster = cluster_fixture(1, "samples")


@pytest.fixture(scope="module")
def s1(cluster):
    """A store whose reads lease objects for 1 ms, so removals are not held back."""
    s = cluster.store(lease_ms=1)
    yield s
    s.close()


def _until(cond, what, timeout_s=WAIT_S):
    """Wait for cond() to hold (polled, backing off to 20 ms) or fail the test."""
    deadline = time.monotonic() + timeout_s
    wait = 0.001
    while not cond():
        assert time.monotonic() < deadline, f"{what} did not happen in {timeout_s} s"
        time.sleep(wait)
        wait = min(wait * 2, 0.02)


def _push(q, sid, version, seed=0, ntokens=8):
    rs = ferry.RolloutSession(session_id=sid, episode_id=f"ep-{sid}", policy_version=version,
                              metadata={"seed": seed})
    tokens = np.arange(ntokens, dtype=np.int32) + 100 * seed
    lp = -np.arange(ntokens, dtype=np.float32) / 8
    q.push(rs, tokens, lp, [float(seed)])
    return rs


def _pop_n(q, n, timeout_s=WAIT_S):
    """Pop until n samples were admitted (or the deadline)."""
    got = []
    deadline = time.monotonic() + timeout_s
    while len(got) < n and time.monotonic() < deadline:
        got += q.pop(n - len(got), timeout_ms=int(max(1, (deadline - time.monotonic()) * 1000)))
    return got


# ---- records ------------------------------------------------------------------------------------

def _canonical(d):
    return json.dumps(d, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def test_records_roundtrip_and_c_agreement():
    r = ferry.RolloutSession(session_id="rollout-session-1", episode_id="episode-123", request_id="request-456",
                             policy_version=17, output_ref="store://outputs/episode-123#tokens",
                             kv_ref="store://ferry/kv/w/00000000000000000017/e123", status="ready_for_update",
                             metadata={"algorithm": "grpo", "created_at_step": 17, "tags": ["a", "ü"]})
    j = r.to_json()
    back = ferry.RolloutSession.from_json(j)
    assert back == r
    assert back.to_json() == j                      # canonical: the same bytes again
    assert ferry.RolloutSession.from_json(j.encode()) == r
    # the C encoder's canonical form is sorted keys, compact: what Python writes too
    assert j == _canonical(dict(vars(r)))
    u = ferry.UpdateSession(update_id="update-4", input_policy_version=4, output_policy_version=5,
                            trajectory_refs=["store://a#tokens", "store://b#tokens"], reward_refs=["store://a#rewards"],
                            status="done", metadata={"lr": 1})
    assert ferry.UpdateSession.from_json(u.to_json()) == u
    assert u.to_json() == _canonical(dict(vars(u)))
    p = ferry.PolicyVersion(version_id=9, parent_version_id=8, created_at_step=90, weight_generation=9, model="tiny")
    assert ferry.PolicyVersion.from_json(p.to_json()) == p
    assert json.loads(p.to_json())["metadata"] == {}
    # a record the C side wrote without metadata reads as {}
    text = ('{"created_at_step":1,"model":"m","parent_version_id":0,"version_id":1,"weight_generation":1}')
    assert ferry.PolicyVersion.from_json(text).metadata == {}


def test_records_malformed():
    for bad in ["", "[]", "{", '{"session_id":1}', json.dumps({**json.loads(ferry.RolloutSession().to_json()),
                                                                 "policy_version": -1})]:
        with pytest.raises(ferry.Error) as e:
            ferry.RolloutSession.from_json(bad)
        assert e.value.code == -errno.EPROTO and str(e.value)
    long_id = json.loads(ferry.RolloutSession().to_json())
    long_id["session_id"] = "x" * 300
    with pytest.raises(ferry.Error, match="session_id"):
        ferry.RolloutSession.from_json(json.dumps(long_id))
    with pytest.raises(ValueError):
        ferry.RolloutSession(session_id="x" * 300).to_json()     # refused, not truncated
    with pytest.raises(TypeError):
        ferry.RolloutSession(metadata=[1, 2]).to_json()
    with pytest.raises(ferry.Error):
        ferry.RolloutSession(session_id="a\nb").to_json()       # control characters


def test_version_rule():
    assert admit(5, 5, 0) == "admit" and admit(4, 5, 0) == "stale" and admit(6, 5, 0) == "ahead"
    assert admit(4, 5, 1) == "admit" and admit(3, 5, 1) == "stale"
    assert ferry.KVCacheGate.ref_version("store://ferry/kv/w/00000000000000000042/x") == 42
    with pytest.raises(ValueError):
        ferry.KVCacheGate.ref_version("store://ferry/kv/w/42/x")


# ---- queues -------------------------------------------------------------------------------------

def test_push_pop_read_ack_and_envelope_agreement(s1):
    with ferry.SampleQueue(s1, "pl", input_version=7) as q:
        rs = ferry.RolloutSession(session_id="p1", policy_version=7, metadata={"group": 3})
        prompt = np.array([7, 8, 9], np.int32)
        tokens = [1, 2, 3, 4, 5]                               # lists are converted
        lp = np.array([-0.5, -1.0, -1.5, -2.0, -2.5], np.float32)
        q.push(rs, tokens, lp, np.array([1.0, 0.25]), prompt=prompt)
        assert rs.status == "ready_for_update" and rs.output_ref.endswith("#tokens")
        # the record on the queue carries the session as the C encoder writes it: the same bytes
        raw = s1.queue_pop("pl", 1, 30000)
        assert len(raw) == 1
        rid, token, data = raw[0]
        assert rs.to_json().encode() in data
        s1.queue_nack(rid, token)
        (smp,) = _pop_n(q, 1)
        assert smp.session == rs
        assert (smp.id, smp.ntokens, smp.prompt_len, smp.nrewards) == (rid, 5, 3, 2)
        got = q.read(smp)
        assert got["prompt"].tolist() == [7, 8, 9] and got["tokens"].tolist() == tokens
        assert np.array_equal(got["logprobs"], lp) and got["rewards"].tolist() == [1.0, 0.25]
        assert q.ack([smp]) == [True]
        assert q.ack([smp]) == [False]                          # a second ack of that delivery is stale
        st = q.stats()
        assert (st["pushed"], st["admitted"], st["acked"], st["ack_stale"]) == (1, 1, 1, 1)
        _until(lambda: not q.pop(1) and not s1.is_exist(smp.payload), "payload removal on ack")
        with pytest.raises(TypeError):
            q.push(rs, np.zeros(3, np.float32), np.zeros(3, np.float32), [0.0])   # tokens must be ints
        with pytest.raises(ValueError):
            q.push(rs, [1, 2], [0.0], [0.0])                                      # a logprob per token
    assert q.closed
    with pytest.raises(ValueError):
        q.pop(1)


def test_open_objects_keep_the_store_busy(cluster):
    s = cluster.store()
    q = ferry.SampleQueue(s, "busy-store")
    w = ferry.PolicyRegistry(s, "busy-model").watch()
    with pytest.raises(ferry.BusyError):
        s.close()
    q.close()
    with pytest.raises(ferry.BusyError):
        s.close()
    w.close()
    s.close()
    assert not s.is_open


def test_stale_drop_vs_recompute(s1):
    with ferry.SampleQueue(s1, "st", input_version=3, max_policy_lag=0, stale_policy="drop") as q:
        for v in (1, 2, 3):
            _push(q, f"s{v}", v, v)
        got = _pop_n(q, 1)
        assert [s.session.session_id for s in got] == ["s3"]
        st = q.stats()
        assert (st["popped"], st["stale"], st["dropped"], st["recompute"], st["admitted"]) == (3, 2, 2, 0, 1)
        assert q.ack(got) == [True]
        _until(lambda: not q.pop(1) and not s1.list("ferry/rl/st/"), "removal of the dropped payloads")
    with ferry.SampleQueue(s1, "rc", input_version=3, max_policy_lag=1, stale_policy="recompute") as q:
        for v in (1, 2, 3):
            _push(q, f"r{v}", v, v)
        got = _pop_n(q, 2)
        assert sorted(s.session.session_id for s in got) == ["r2", "r3"]
        st = q.stats()
        assert (st["stale"], st["dropped"], st["recompute"], st["admitted"]) == (1, 0, 1, 2)
        assert q.ack(got) == [True, True]
        rc = []
        _until(lambda: rc.extend(q.pop_recompute(4)) or rc, "the recompute request")
        assert [(s.session.session_id, s.session.status, s.session.policy_version, s.payload)
                for s in rc] == [("r1", "recompute", 1, "")]
        assert rc[0].session.output_ref == ""
        assert q.stats()["recompute_popped"] == 1
        assert q.ack(rc) == [True]


def test_max_policy_lag_admission(s1):
    with ferry.SampleQueue(s1, "lag", input_version=5, max_policy_lag=2) as q:
        for v in (2, 3, 4, 5, 6):
            _push(q, f"l{v}", v, v)
        got = _pop_n(q, 3)
        assert sorted(s.session.policy_version for s in got) == [3, 4, 5]
        assert all(admit(s.session.policy_version, 5, 2) == "admit" for s in got)
        _until(lambda: q.stats()["popped"] >= 5 or q.pop(4), "every record looked at")
        st = q.stats()
        assert (st["stale"], st["dropped"], st["admitted"]) == (1, 1, 3)
        assert st["ahead"] >= 1                                  # v6 handed back, maybe more than once
        # a released sample is delivered again at once, to whoever pops next
        q.release(got[:1])
        (again,) = _pop_n(q, 1)
        assert again.session == got[0].session and again.token > got[0].token
        assert q.ack([again] + got[1:]) == [True, True, True]
        assert q.ack(got[:1]) == [False]                         # the released delivery is gone
        q.set_version(6)
        assert q.input_version == 6
        (s6,) = _pop_n(q, 1)
        assert s6.session.session_id == "l6"
        assert q.ack([s6]) == [True]


def test_backpressure(cluster, s1):
    with ferry.SampleQueue(s1, "bp", bound=2, fail_when_full=True, input_version=1) as q:
        _push(q, "b0", 1)
        _push(q, "b1", 1)
        with pytest.raises(ferry.QueueFullError) as e:
            _push(q, "b2", 1)
        assert isinstance(e.value, ferry.Error) and e.value.code == -errno.EAGAIN
        st = q.stats()
        assert (st["pushed"], st["push_full"]) == (2, 1)
        assert len(s1.list("ferry/rl/bp/")) == 2                 # nothing left behind by the refused push
    # a waiting producer (its own store and queue, in a thread) gets in once a consumer acks
    with cluster.store(lease_ms=1) as ps, \
            ferry.SampleQueue(ps, "bp", bound=2, push_timeout_ms=30000) as pq, \
            ferry.SampleQueue(s1, "bp", input_version=1) as cq:
        out = {}

        def produce():
            try:
                _push(pq, "late", 1, 9)
                out["ok"] = True
            except BaseException as ex:   # noqa: B902 - handed to the test
                out["err"] = ex

        t = threading.Thread(target=produce, daemon=True)
        t.start()
        _until(lambda: pq.stats()["push_waits"] >= 1, "the producer waiting for room")
        assert t.is_alive()
        (smp,) = _pop_n(cq, 1)
        assert t.is_alive()                                      # a leased record still counts against the bound
        assert cq.ack([smp]) == [True]
        t.join(WAIT_S)
        assert not t.is_alive() and out == {"ok": True}, out
        st = pq.stats()
        assert (st["pushed"], st["push_waits"], st["push_full"]) == (1, 1, 0)
        rest = _pop_n(cq, 2)
        assert sorted(s.session.session_id for s in rest) == ["b1", "late"]
        assert cq.ack(rest) == [True, True]


# ---- a consumer killed inside ack -----------------------------------------------------------------

_ACKER = r"""
import sys, ferry
s = ferry.Store(master=sys.argv[1], token_file=sys.argv[2])   # reads lease payloads for 5 s
q = ferry.SampleQueue(s, sys.argv[3], input_version=1, lease_ms=500)
print("READY", flush=True)
while True:
    batch = q.pop(4, timeout_ms=1000)
    for smp in batch:
        q.read(smp)
    if batch:
        print("ACK", len(batch), flush=True)
        q.ack(batch)
"""


def _wait_output(p, word, deadline):
    """Read p's (unbuffered) stdout until a line starts with word; False at the deadline or EOF."""
    buf = b""
    while time.monotonic() < deadline:
        r, _, _ = select.select([p.stdout], [], [], max(0.0, deadline - time.monotonic()))
        if not r:
            break
        chunk = os.read(p.stdout.fileno(), 4096)
        if not chunk:
            return False
        buf += chunk
        if any(line.startswith(word.encode()) for line in buf.split(b"\n")):
            return True
    return False


def _queue_empty(s1, name):
    """No record of queue `name` outstanding, ready or leased: with a bound of 1 a push is
    refused exactly then (a probe that got in is taken out again)."""
    with ferry.SampleQueue(s1, name, bound=1, fail_when_full=True, input_version=1) as p:
        try:
            _push(p, "probe", 1)
        except ferry.QueueFullError:
            return False
        (smp,) = _pop_n(p, 1)
        assert smp.session.session_id == "probe" and p.ack([smp]) == [True]
        return True


def test_consumer_killed_inside_ack_leaves_no_payload(cluster, s1):
    """Consumer processes SIGKILLed at varied points inside SampleQueue.ack(): afterwards every
    record left is delivered again with its payload, and once the queue is empty no payload
    object is left without a record."""
    name, kills = "pyak", 20
    with ferry.SampleQueue(s1, name, input_version=1) as q:
        for i in range(8 * kills):
            _push(q, f"k{i:03d}", 1, i)
    killed = 0
    for k in range(kills):
        p = subprocess.Popen([sys.executable, "-c", _ACKER, cluster.addr, cluster.token_file, name],
                             stdout=subprocess.PIPE, bufsize=0)
        try:
            acking = _wait_output(p, "ACK", time.monotonic() + 60)
            if acking:
                time.sleep((0, 0.0002, 0.0005, 0.001, 0.002, 0.004)[k % 6])   # a varied point in ack
                killed += 1
        finally:
            p.kill()
            p.wait()
            p.stdout.close()
        if not acking:
            break
    missing = drained = 0
    with ferry.SampleQueue(s1, name, input_version=1) as q:
        deadline = time.monotonic() + 60
        while True:
            batch = q.pop(64)
            for smp in batch:
                try:
                    q.read(smp)
                except ferry.Error:
                    missing += 1
            if batch:
                q.ack(batch)
                drained += len(batch)
                continue
            if _queue_empty(s1, name):
                break
            assert time.monotonic() < deadline, "the queue did not drain"
            time.sleep(0.01)
    left = s1.list(f"ferry/rl/{name}/")
    print(f"{killed} consumers killed inside ack; drained {drained}, {missing} without a payload; "
          f"payload objects left: {len(left)}")
    assert killed == kills
    assert missing == 0
    assert left == []


def test_queue_busy_from_two_threads(cluster, s1):
    with cluster.store() as ps, ferry.SampleQueue(ps, "busy", bound=1, push_timeout_ms=30000) as q:
        _push(q, "x0", 1)
        t = threading.Thread(target=lambda: _push(q, "x1", 1), daemon=True)   # waits for room
        t.start()
        _until(lambda: q.stats()["push_waits"] >= 1, "the push waiting")
        with pytest.raises(ferry.BusyError):
            q.pop(1)
        with ferry.SampleQueue(s1, "busy", input_version=1) as cq:
            (a,) = _pop_n(cq, 1)
            cq.ack([a])
            t.join(WAIT_S)
            assert not t.is_alive()
            (b,) = _pop_n(cq, 1)
            cq.ack([b])


# ---- the policy registry ------------------------------------------------------------------------

def _w(v):
    return np.arange(16, dtype=np.float32) + 100 * v


def test_policy_publish_watch_history(cluster, store):
    reg = ferry.PolicyRegistry(store, "pol")
    assert reg.current() is None and reg.history() == []
    with reg.watch() as w:
        assert w.next(50) is None
        st = reg.publish(1, [("w", _w(1))], created_at_step=10, metadata={"step": 10})
        assert st["version"] == 1 and st["tensors"] == 1
        v1 = w.next(10000)
        assert (v1.version_id, v1.weight_generation, v1.parent_version_id, v1.model) == (1, 1, 0, "pol")
        assert v1.metadata == {"step": 10}
        # a watcher in another thread learns of version 2 as it is announced
        seen = {}
        t = threading.Thread(target=lambda: seen.update(v=w.next(int(WAIT_S * 1000))), daemon=True)
        t.start()
        pv2 = ferry.PolicyVersion(version_id=2, parent_version_id=1, created_at_step=20, metadata={"loss": 3})
        reg.publish(pv2, [("w", _w(2))])
        t.join(WAIT_S)
        assert not t.is_alive() and seen["v"].version_id == 2 and seen["v"].metadata == {"loss": 3}
    cur = reg.current()
    assert cur == ferry.PolicyVersion(version_id=2, parent_version_id=1, created_at_step=20, weight_generation=2,
                                      model="pol", metadata={"loss": 3})
    # the version and its weights are current together
    assert weights.active(store, "pol")[0] == 2
    got = np.zeros(16, np.float32)
    assert weights.update_direct(store, "pol", [("w", None, got)])["generation"] == 2
    assert np.array_equal(got, _w(2))
    # the history the C library wrote, line by line, is what Python encodes
    hist = reg.history()
    assert [h.version_id for h in hist] == [1, 2]
    text, _ = store.kv_get("ferry/pv/pol/history")
    assert text.decode().splitlines() == [h.to_json() for h in hist]
    assert hist[1].to_json() == cur.to_json()
    # a parent that is not older is refused before anything is stored
    with pytest.raises(ferry.Error) as e:
        reg.publish(3, [("w", _w(3))], parent=3)
    assert e.value.code == -errno.EINVAL
    assert reg.current().version_id == 2
    # a new watcher gets the current version first
    with reg.watch() as w2:
        assert w2.next(5000).version_id == 2
        assert w2.next(20) is None


def test_policy_publish_two_ranks(cluster):
    """Every trainer rank publishes; the version is announced once, for both."""
    barrier, out = threading.Barrier(2, timeout=WAIT_S), [None, None]
    tensors = [("a", _w(1)), ("b", np.ones((4, 3), np.float16))]

    def rank(r):
        try:
            with cluster.store() as s:
                barrier.wait()
                out[r] = ferry.PolicyRegistry(s, "pol2").publish(1, tensors, metadata={"ranks": 2}, rank=r, world=2,
                                                                 timeout_ms=int(WAIT_S * 1000))
        except BaseException as e:   # noqa: B902 - handed to the test
            out[r] = e

    threads = [threading.Thread(target=rank, args=(r,), daemon=True) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S * 2)
    assert all(isinstance(o, dict) for o in out), out
    assert sum(o["tensors"] for o in out) == 2 and all(o["total_tensors"] == 2 for o in out)
    with cluster.store() as s:
        reg = ferry.PolicyRegistry(s, "pol2")
        assert reg.current().metadata == {"ranks": 2}
        assert [h.version_id for h in reg.history()] == [1]   # rank 0 appends it, once
        assert [e["name"] for e in weights.manifest(s, "pol2")] == ["a", "b"]


# ---- the KV-reuse gate ----------------------------------------------------------------------

def test_kv_gate(s1):
    gate = ferry.KVCacheGate(s1, "llm")
    kv = np.random.default_rng(5).integers(0, 255, 4096, dtype=np.uint8)
    ref1 = gate.put(1, "ep1", kv)
    ref1b = gate.put(1, "ep2", kv[:100].tobytes())
    ref2 = gate.put(2, "ep1", kv[:200])
    s1.put("user/obj", b"0123456789")
    assert ref1 == "store://ferry/kv/llm/00000000000000000001/ep1"
    assert gate.ref_version(ref2) == 2
    assert gate.get(ref1, 1) == kv.tobytes()
    with pytest.raises(ferry.StaleError, match="version 1"):
        gate.get(ref1, 2)                                     # made under another version: refused
    buf = bytearray(4096)
    with pytest.raises(ferry.StaleError):
        gate.get_into(ref1, 2, buf)
    assert buf == bytearray(4096)                             # nothing read
    assert gate.stats() == {"stored": 3, "hits": 1, "refused": 2, "retired": 0}
    removed = []
    _until(lambda: removed.append(gate.retire(1)) or not s1.is_exist(ref1[8:]), "retiring version 1")
    assert sum(removed) == 2 and gate.stats()["retired"] == 2
    assert not s1.is_exist(ref1b[8:])
    assert s1.is_exist(ref2[8:]) and s1.is_exist("user/obj")   # other versions and keys stay
    assert gate.get_into(ref2, 2, buf) == 200 and bytes(buf[:200]) == kv[:200].tobytes()
    with pytest.raises(ValueError):
        ferry.KVCacheGate(s1, "a/b")


# ---- the example ------------------------------------------------------------------------------

def test_grpo_example_runs():
    if not os.access(FERRY_BIN, os.X_OK):
        pytest.skip(f"no ferry binary at {FERRY_BIN} (set FERRY_BIN)")
    env = dict(os.environ, FERRY_BIN=FERRY_BIN)
    for k in ("FERRY_MASTER", "FERRY_TOKEN", "FERRY_TOKEN_FILE"):
        env.pop(k, None)                                        # the example starts its own cluster
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), os.path.dirname(ferry.__path__[0])) if p)
    p = subprocess.run([sys.executable, os.path.join(REPO, "examples", "grpo_loop.py"), "--steps", "4"],
                       env=env, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stdout + p.stderr
    lines = p.stdout.splitlines()
    assert sum(line.startswith("step ") for line in lines) == 4, p.stdout
    summary = [line for line in lines if line.startswith("summary:")]
    assert len(summary) == 1, p.stdout
    fields = dict(kv.split("=") for kv in summary[0].split()[1:])
    assert int(fields["trained"]) > 0 and int(fields["versions"]) == 5, summary
