"""The calls of ferry.samples over the cffi binding (include/ferry/samples.h):
the record encoders, the policy registry and PolicyWatch, SampleQueue and its
Sample, KVCacheGate. Thin: every rule (versions, leases, claims, the gate) is
the C library's. Records cross as dicts with the Mooncake field names,
metadata as JSON text (ferry.samples turns both into dataclasses). A
SampleQueue or PolicyWatch keeps its store busy (Store.close() refuses) until
it is closed; every call that waits releases the GIL (cffi's calls do)."""

from . import _call
from . import _ferry
from . import _tensors
from . import _weights
from ._binding import ffi, lib

_POP_MAX = lib.FERRY_STORE_POP_MAX   # the store's cap on one pop
_HISTORY_MAX = 1024                 # the registry keeps the last 1024 versions
_SLICE_MS = 200                     # blocking waits wake this often to take signals

# ---- records <-> dicts ----------------------------------------------------------------------

_ROLLOUT_STR = ("session_id", "episode_id", "request_id", "prompt_ref", "output_ref", "logprob_ref", "reward_ref",
                "kv_ref", "status")
_UPDATE_LISTS = (("trajectory_refs", "trajectory_refs", "ntrajectory"), ("reward_refs", "reward_refs", "nreward"),
                 ("logprob_refs", "logprob_refs", "nlogprob"))
# (dict key, C field) of a policy version's integers
_POLICY_U64 = (("version_id", "version"), ("parent_version_id", "parent"), ("created_at_step", "created_at_step"),
               ("weight_generation", "weight_generation"))


def _need_dict(d, what):
    if not isinstance(d, dict):
        raise TypeError(f"{what} must be a dict, not {type(d).__name__}")


def _put_str(rec, d, k, field=None):
    """d[k] (absent or None: "") into the char array field of rec."""
    v = d.get(k)
    if v is not None:
        _call.copy_str(rec, field or k, _call.key(v, k), k)


def _put_u64(rec, d, k, field):
    v = d.get(k)
    if v is None:
        return
    if not isinstance(v, int):
        raise TypeError(f"{k} must be an int, not {type(v).__name__}")
    if v < 0 or v > _call.U64_MAX:
        raise ValueError(f"{k} must be a non-negative 64-bit int")
    setattr(rec, field, v)


def _put_meta(rec, d, keep):
    """d["metadata"] (JSON text; None: none) into rec.metadata, its bytes held in keep."""
    v = d.get("metadata")
    if v is not None:
        keep.append(ffi.new("char[]", _call.key(v, "metadata (JSON text)")))
        rec.metadata = keep[-1]


def _meta(m):
    return None if m == ffi.NULL else _call.str_of(m)


def _rollout_of(d, rec, keep):
    _need_dict(d, "session")
    for k in _ROLLOUT_STR:
        _put_str(rec, d, k)
    _put_u64(rec, d, "policy_version", "policy_version")
    _put_meta(rec, d, keep)
    return rec


def _rollout_dict(r):
    d = {k: _call.str_of(getattr(r, k)) for k in _ROLLOUT_STR[:3]}
    d["policy_version"] = r.policy_version
    d.update((k, _call.str_of(getattr(r, k))) for k in _ROLLOUT_STR[3:])
    d["metadata"] = _meta(r.metadata)
    return d


def _update_of(d, rec, keep):
    _need_dict(d, "update session")
    _put_str(rec, d, "update_id")
    _put_str(rec, d, "status")
    _put_u64(rec, d, "input_policy_version", "input_version")
    _put_u64(rec, d, "output_policy_version", "output_version")
    for k, field, count in _UPDATE_LISTS:
        v = d.get(k)
        if v is None:
            continue
        items = [ffi.new("char[]", _call.key(s, k)) for s in _call.seq(v, k)]
        arr = ffi.new("char *[]", items or 1)
        keep += items + [arr]
        setattr(rec, field, arr)
        setattr(rec, count, len(items))
    _put_meta(rec, d, keep)
    return rec


def _update_dict(r):
    d = {"update_id": _call.str_of(r.update_id), "input_policy_version": r.input_version,
         "output_policy_version": r.output_version}
    for k, field, count in _UPDATE_LISTS:
        d[k] = [_call.str_of(getattr(r, field)[i]) for i in range(getattr(r, count))]
    d["status"] = _call.str_of(r.status)
    d["metadata"] = _meta(r.metadata)
    return d


def _policy_of(d, rec, keep):
    _need_dict(d, "policy version")
    for k, field in _POLICY_U64:
        _put_u64(rec, d, k, field)
    _put_str(rec, d, "model")
    _put_meta(rec, d, keep)
    return rec


def _policy_dict(r):
    d = {k: getattr(r, field) for k, field in _POLICY_U64}
    d["model"] = _call.str_of(r.model)
    d["metadata"] = _meta(r.metadata)
    return d


def _text(o):
    if isinstance(o, str):
        return o.encode()
    return bytes(memoryview(o))


def _record(ctype, of, to_dict, what):
    """(to_json, from_json) of a record type: a dict to the C encoder's
    canonical JSON text, and JSON text (str or bytes) to a dict."""
    enc, dec, clear = (getattr(lib, f"ferry_{ctype}_{x}") for x in ("to_json", "from_json", "clear"))

    def to_json(d, /):
        keep, out = [], ffi.new("char **")
        rc = enc(of(d, ffi.new(f"ferry_{ctype} *"), keep), out)   # the record's strings are Python's: no clear
        if rc < 0:
            raise _call.error(rc, msg=f"{what}: cannot be encoded (metadata must be a JSON object; ids, references "
                                      "and status hold no control character; versions fit in int64)")
        try:
            return ffi.string(out[0]).decode()
        finally:
            lib.free(out[0])

    def from_json(text, /):
        b, rec, fe = _text(text), ffi.new(f"ferry_{ctype} *"), _call.new_error()
        rc = dec(b, len(b), rec, fe)
        if rc < 0:
            raise _call.error(rc, fe)
        try:
            return to_dict(rec)
        finally:
            clear(rec)

    to_json.__name__, from_json.__name__ = f"{ctype}_to_json", f"{ctype}_from_json"
    to_json.__doc__ = f"{ctype}_to_json(dict) -> canonical JSON text"
    from_json.__doc__ = f"{ctype}_from_json(text) -> dict"
    return to_json, from_json


rollout_session_to_json, rollout_session_from_json = _record("rollout_session", _rollout_of, _rollout_dict,
                                                             "rollout session")
update_session_to_json, update_session_from_json = _record("update_session", _update_of, _update_dict,
                                                           "update session")
policy_version_to_json, policy_version_from_json = _record("policy_version", _policy_of, _policy_dict,
                                                           "policy version")


def policy_admit(sample_version, input_version, max_policy_lag, /):
    """policy_admit(sample_version, input_version, max_policy_lag) -> "admit", "stale" or "ahead\""""
    v = lib.ferry_policy_admit(_call.uint(sample_version, "sample_version"),
                               _call.uint(input_version, "input_version"),
                               _call.uint(max_policy_lag, "max_policy_lag", 0, 2**32 - 1))
    return {lib.FERRY_VERSION_ADMIT: "admit", lib.FERRY_VERSION_STALE: "stale"}.get(v, "ahead")


# ---- the store handle -----------------------------------------------------------------------

def _enter(store):
    """The store's C handle, its call counted in flight until store._leave()."""
    if not isinstance(store, _ferry.Store):
        raise TypeError(f"expected a ferry.Store, not {type(store).__name__}")
    return ffi.cast("ferry_store *", store._enter())


def _store_call(store, fn, *args):
    h = _enter(store)
    try:
        return fn(h, *args)
    finally:
        store._leave()


# ---- the policy registry ---------------------------------------------------------------------

def policy_publish(store, model, rank, world, rank_node, out_dtype, segment, keep, timeout_ms, record, tensors, /):
    """policy_publish(store, model, rank, world, rank_node, out_dtype, segment, keep, timeout_ms, record, tensors) -> stats"""
    if not isinstance(store, _ferry.Store):
        raise TypeError(f"expected a ferry.Store, not {type(store).__name__}")
    cfg = _weights.publisher_config("policy_publish", model, out_dtype, rank, world, segment, keep, timeout_ms)
    held = []
    pv = _policy_of(record, ffi.new("ferry_policy_version *"), held)
    nodes = _call.seq(rank_node, "rank_node")
    if len(nodes) != cfg.world:
        raise ValueError(f"rank_node has {len(nodes)} entries for a world of {cfg.world}")
    for i, x in enumerate(nodes):
        if not isinstance(x, int) or x < 0 or x > 2**32 - 1:
            raise ValueError(f"rank_node[{i}] must be an int in [0, {2**32 - 1}]")
    cnodes = ffi.new("uint32_t[]", list(nodes) or 1)
    cfg.rank_node = cnodes
    items = _call.seq(tensors, "tensors")
    t = ffi.new("ferry_weight_tensor[]", len(items) or 1)
    for i, it in enumerate(items):
        if not isinstance(it, tuple) or len(it) != 3:
            raise TypeError(f"tensors[{i}] must be (name, array, dtype)")
        v = _ferry._view(it[1], f"tensors[{i}] ({_call.key(it[0], 'tensor name').decode()[:40]})", False)
        one = _weights.tensor_of(t[i], it[0], v, it[2])
        if one is None:
            raise ValueError(f"tensor {it[0]}: dtype {it[2]} does not match the array's {v.itemsize}-byte elements, "
                             f"or it has more than {lib.FERRY_MAX_DIMS} dims")
        held += one
    st, fe = ffi.new("ferry_publish_stats *"), _call.new_error()
    rc = _store_call(store, lib.ferry_policy_publish, cfg, pv, t, len(items), st, fe)
    if rc < 0:
        raise _call.error(rc, fe)
    out = {"version": pv.version, "generation": pv.version}
    out.update((k, getattr(st, k)) for k in ("tensors", "bytes", "total_tensors", "total_bytes", "cross_node_bytes",
                                             "put_s", "commit_s", "removed_generations"))
    return out


def policy_current(store, model, /):
    """policy_current(store, model) -> version dict or None"""
    pv, fe = ffi.new("ferry_policy_version *"), _call.new_error()
    rc = _store_call(store, lib.ferry_policy_current, _call.text("policy_current", 2, model), pv, fe)
    if rc == lib.FERRY_ENOENT:
        return None
    return _policy_taken(rc, pv, fe)


def _policy_taken(rc, pv, fe):
    """The version a call filled (rc 0), cleared after; raises its error."""
    if rc < 0:
        raise _call.error(rc, fe)
    try:
        return _policy_dict(pv)
    finally:
        lib.ferry_policy_version_clear(pv)


def policy_history(store, model, /):
    """policy_history(store, model) -> [version dict], oldest first"""
    h, n, fe = ffi.new("ferry_policy_version[]", _HISTORY_MAX), ffi.new("size_t *"), _call.new_error()
    rc = _store_call(store, lib.ferry_policy_history, _call.text("policy_history", 2, model), h, _HISTORY_MAX, n, fe)
    try:
        if rc < 0:
            raise _call.error(rc, fe)
        return [_policy_dict(h[i]) for i in range(n[0])]
    finally:
        for i in range(n[0]):
            lib.ferry_policy_version_clear(ffi.addressof(h, i))


class _Holder:
    """An object over a C handle that keeps its store busy until close()
    (a context manager; close() refuses while a call is in flight)."""

    _what = _busy_close = ""

    def _check(self, busy=None):
        if self._h is None:
            raise ValueError(f"the {self._what} is closed")
        if busy and self._inflight:
            raise _call.error(lib.FERRY_EBUSY, msg=busy)
        return self._h

    def _open(self, store, handle):
        self._h, self._store, self._inflight = handle, store, 0

    def _call(self, fn, *args):
        self._inflight += 1
        self._store._enter()
        try:
            return fn(*args)
        finally:
            self._store._leave()
            self._inflight -= 1

    def _close_now(self):
        h, self._h = getattr(self, "_h", None), None
        if h is not None:
            self._closer(h)
            self._store._leave()   # the busy mark of the open

    def close(self):
        """close()"""
        if getattr(self, "_inflight", 0):
            raise _call.error(lib.FERRY_EBUSY, msg=self._busy_close)
        self._close_now()
        self._store = None

    @property
    def closed(self):
        """whether close() ran"""
        return getattr(self, "_h", None) is None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        self._close_now()


def _unopened(self, what):
    if getattr(self, "_store", None) is not None:
        raise ValueError(f"the {what} is already open")


class PolicyWatch(_Holder):
    """PolicyWatch(store, model): new policy versions of a model, by a watch on its announcing key"""

    _what, _busy_close = "watch", "close: another thread is waiting on this policy watch"
    _closer = staticmethod(lib.ferry_policy_watch_close)

    def __init__(self, store, model):
        _unopened(self, "watch")
        m = _call.text("PolicyWatch", 2, model)
        h, out = _enter(store), ffi.new("ferry_policy_watch **")
        try:
            rc = lib.ferry_policy_watch_open(h, m, out, ffi.NULL)
        except BaseException:
            store._leave()
            raise
        if rc < 0:
            store._leave()
            why = "the model name is empty, too long or holds '/'" if rc == lib.FERRY_EINVAL else _call.strerror(rc)
            raise _call.error(rc, msg=f"policy watch of {model}: {why}")
        self._open(store, out[0])   # the store stays busy until close

    def next(self, timeout_ms=-1):
        """next(timeout_ms=-1) -> the next version newer than any returned (a dict), or None after timeout_ms"""
        w = self._check("another thread is waiting on this policy watch")
        timeout = int(timeout_ms)
        pv, fe = ffi.new("ferry_policy_version *"), _call.new_error()
        while True:
            slice_ms = _SLICE_MS if timeout < 0 or timeout > _SLICE_MS else timeout
            rc = self._call(lib.ferry_policy_watch_next, w, slice_ms, pv, fe)
            if rc != lib.FERRY_ETIMEDOUT:
                break
            if timeout >= 0:
                timeout -= slice_ms
                if timeout <= 0:
                    return None
            # the interpreter takes signals between two slices (KeyboardInterrupt)
        return _policy_taken(rc, pv, fe)


# ---- Sample and SampleQueue ------------------------------------------------------------------

class Sample:
    """Sample: one popped sample (SampleQueue.pop); ack or release it"""

    __slots__ = ("_s",)

    def __init__(self, s):
        self._s = s   # a ferry_sample * that owns its session's metadata (cleared with the object)

    id = property(lambda self: self._s.id, doc="the queue record")
    token = property(lambda self: self._s.token, doc="the record's delivery (1: first)")
    uid = property(lambda self: self._s.uid, doc="the sample's identity across retried pushes")
    pushed_at_ms = property(lambda self: self._s.pushed_at_ms, doc="the producer's wall clock at push")
    popped_at_ms = property(lambda self: self._s.popped_at_ms, doc="the consumer's wall clock at pop")
    prompt_len = property(lambda self: self._s.prompt_len, doc="prompt token count")
    ntokens = property(lambda self: self._s.ntokens, doc="output token count (and logprobs)")
    nrewards = property(lambda self: self._s.nrewards, doc="reward count")
    payload = property(lambda self: _call.str_of(self._s.payload), doc="the payload object's key (\"\" for recompute)")
    session = property(lambda self: _rollout_dict(self._s.session), doc="the rollout session record (a dict)")

    def __repr__(self):
        s = self._s
        return (f"<ferry Sample {_call.str_of(s.session.session_id)} v{s.session.policy_version} id={s.id} "
                f"token={s.token} ntokens={s.ntokens}>")


def _samples_of(o):
    items = _call.seq(o, "samples")
    v = ffi.new("ferry_sample[]", len(items) or 1)
    for i, it in enumerate(items):
        if not isinstance(it, Sample):
            raise TypeError(f"samples[{i}] is a {type(it).__name__}, not a popped Sample")
        ffi.memmove(ffi.addressof(v, i), it._s, ffi.sizeof("ferry_sample"))   # shallow: the Sample owns it
    return items, v


_FMT = {"i32": ("i", "l"), "f32": ("f",)}


def _buf4(o, dtype, writable, what):
    """(pointer, elements) of a C-contiguous buffer of int32 ("i32") or float32 ("f32")."""
    v = _ferry._view(o, what, writable)
    if v.itemsize != 4 or v.format.lstrip("@=<") not in _FMT[dtype]:
        got = _ferry.memory(o, what).dtype or "untyped bytes"
        raise TypeError(f"{what} ({_tensors.describe(o)}) must hold {'int32' if dtype == 'i32' else 'float32'} "
                        f"elements ({dtype}), not {got}")
    p, n = _call.exported(v, "int32_t[]" if dtype == "i32" else "float[]", writable)
    return p, n // 4


class SampleQueue(_Holder):
    """SampleQueue(store, queue, bound=0, fail_when_full=False, push_timeout_ms=0, input_version=0, max_policy_lag=0, stale_policy="drop", lease_ms=0, consumer=""): a leased sample queue"""

    _what, _busy_close = "sample queue", "close: another thread is using this sample queue"
    _busy = "another thread is using this sample queue (open one per thread)"
    _closer = staticmethod(lib.ferry_sample_queue_close)

    def __init__(self, store, queue, bound=0, fail_when_full=False, push_timeout_ms=0, input_version=0,
                 max_policy_lag=0, stale_policy="drop", lease_ms=0, consumer=""):
        _unopened(self, "queue")
        cfg = ffi.new("ferry_sample_queue_config *")
        _call.copy_str(cfg, "queue", _call.text("SampleQueue", 2, queue), "queue")
        _call.copy_str(cfg, "consumer", _call.text("SampleQueue", 10, consumer), "consumer")
        if stale_policy == "drop":
            cfg.stale_policy = lib.FERRY_STALE_DROP
        elif stale_policy == "recompute":
            cfg.stale_policy = lib.FERRY_STALE_RECOMPUTE
        else:
            raise ValueError(f'stale_policy must be "drop" or "recompute", not {stale_policy}')
        cfg.bound, cfg.fail_when_full = _call.uint(bound, "bound"), bool(fail_when_full)
        cfg.push_timeout_ms, cfg.input_version = _call.uint(push_timeout_ms, "push_timeout_ms"), _call.uint(
            input_version, "input_version")
        cfg.max_policy_lag = _call.uint(max_policy_lag, "max_policy_lag", 0, 2**32 - 1)
        cfg.lease_ms = _call.uint(lease_ms, "lease_ms")
        out, fe = ffi.new("ferry_sample_queue **"), _call.new_error()
        h = _enter(store)
        try:
            rc = lib.ferry_sample_queue_open(h, cfg, out, fe)
        except BaseException:
            store._leave()
            raise
        if rc < 0:
            store._leave()
            raise _call.error(rc, fe)
        self._open(store, out[0])   # the store stays busy until close
        self._input_version = cfg.input_version

    @property
    def input_version(self):
        """the consumer's input version"""
        return self._input_version

    def push(self, session, tokens, logprobs, rewards, prompt=None):
        """push(session, tokens, logprobs, rewards, prompt=None) -> (record id, session dict with refs)"""
        q = self._check(self._busy)
        keep = []
        rs = _rollout_of(session, ffi.new("ferry_rollout_session *"), keep)
        d = ffi.new("ferry_sample_data *")
        d.tokens, d.ntokens = t = _buf4(tokens, "i32", False, "tokens")
        lp = _buf4(logprobs, "f32", False, "logprobs")
        rw = _buf4(rewards, "f32", False, "rewards")
        p = None if prompt is None else _buf4(prompt, "i32", False, "prompt")
        if lp[1] != t[1]:
            raise ValueError(f"push: {t[1]} tokens but {lp[1]} logprobs")
        d.logprobs = lp[0]
        d.rewards, d.nrewards = rw
        if p is not None:
            d.prompt, d.prompt_len = p
        rid, fe = ffi.new("uint64_t *"), _call.new_error()
        rc = self._call(lib.ferry_sample_push, q, rs, d, rid, fe)
        if rc < 0:
            raise _call.error(rc, fe)
        return rid[0], _rollout_dict(rs)

    def _pop(self, fn, max):
        max = _call.uint(max, "max", 0, 2**32 - 1)
        if max == 0 or max > _POP_MAX:
            raise ValueError(f"max must be 1 to {_POP_MAX}")
        q = self._check(self._busy)
        out, n, fe = ffi.new("ferry_sample[]", max), ffi.new("size_t *"), _call.new_error()
        rc = self._call(fn, q, max, out, n, fe)
        got = []
        for i in range(n[0]):   # each its own, cleared with its Sample
            s = ffi.new("ferry_sample *")
            ffi.memmove(s, ffi.addressof(out, i), ffi.sizeof("ferry_sample"))
            got.append(Sample(ffi.gc(s, lib.ferry_sample_clear)))
        if rc < 0:
            raise _call.error(rc, fe)
        return got

    def pop(self, max=1):
        """pop(max=1) -> [Sample] admitted by the version rule"""
        return self._pop(lib.ferry_sample_pop, max)

    def pop_recompute(self, max=1):
        """pop_recompute(max=1) -> [Sample] sent back for recompute (sessions only)"""
        return self._pop(lib.ferry_sample_pop_recompute, max)

    def read(self, sample, prompt, tokens, logprobs, rewards, /):
        """read(sample, prompt, tokens, logprobs, rewards): into buffers"""
        if not isinstance(sample, Sample):
            raise TypeError(f"read() argument 1 must be ferry._samples.Sample, not {type(sample).__name__}")
        q = self._check(self._busy)
        s = sample._s
        dst = []
        for name, o, dtype, count in (("prompt", prompt, "i32", s.prompt_len), ("tokens", tokens, "i32", s.ntokens),
                                      ("logprobs", logprobs, "f32", s.ntokens),
                                      ("rewards", rewards, "f32", s.nrewards)):
            if o is None:
                dst.append(ffi.NULL)
                continue
            p, n = _buf4(o, dtype, True, name)
            if n != count:
                raise ValueError(f"read: {name} holds {n} elements, the sample {count}")
            dst.append(p)
        fe = _call.new_error()
        rc = self._call(lib.ferry_sample_read, q, s, *dst, fe)
        if rc < 0:
            raise _call.error(rc, fe)

    def ack(self, samples, /):
        """ack(samples) -> [bool]: trained; False: delivered again, not acked"""
        q = self._check(self._busy)
        items, v = _samples_of(samples)
        ok, fe = ffi.new("bool[]", len(items) or 1), _call.new_error()
        rc = self._call(lib.ferry_sample_ack, q, v, len(items), ok, fe)
        if rc < 0 and rc != lib.FERRY_ESTALE:
            raise _call.error(rc, fe)
        return [bool(ok[i]) for i in range(len(items))]

    def release(self, samples, /):
        """release(samples): give them back now"""
        q = self._check(self._busy)
        items, v = _samples_of(samples)
        fe = _call.new_error()
        rc = self._call(lib.ferry_sample_release, q, v, len(items), fe)
        if rc < 0:
            raise _call.error(rc, fe)

    def set_version(self, v, /):
        """set_version(v): the consumer's input version"""
        v = _call.uint(v, "input_version")
        q = self._check(self._busy)
        self._call(lib.ferry_sample_queue_set_version, q, v)   # removes lapsed claims
        self._input_version = v

    def stats(self):
        """stats() -> dict of counters"""
        st = ffi.new("ferry_sample_stats *")
        lib.ferry_sample_queue_stats(self._check(), st)   # allowed while another thread is in a call
        return _call.counters(st)


# ---- KVCacheGate -----------------------------------------------------------------------------

class KVCacheGate:
    """KVCacheGate(store, ns): KV cache objects kept under the policy version that made them"""

    def __init__(self, store, ns):
        if not isinstance(store, _ferry.Store):
            raise TypeError(f"expected a ferry.Store, not {type(store).__name__}")
        b = _call.text("KVCacheGate", 2, ns)
        if not b or b"/" in b:
            raise ValueError("ns must be non-empty and hold no '/'")
        if len(b) >= 128:
            raise ValueError("ns is longer than 127 bytes")
        self._store, self._ns = store, b
        self._st = _call.counters(ffi.new("ferry_kvcache_stats *"))   # all 0

    @property
    def ns(self):
        """the gate's namespace"""
        return self._ns.decode("utf-8", "surrogateescape")

    def _kv(self, fn, *args):
        """fn(store, *args, &stats, &error) without the GIL; (rc, error)."""
        if getattr(self, "_store", None) is None:
            raise ValueError("the gate is not initialised")
        d, fe = ffi.new("ferry_kvcache_stats *"), _call.new_error()
        rc = _store_call(self._store, fn, *args, d, fe)
        for k, v in _call.counters(d).items():   # each call counts into its own, added here with the GIL
            self._st[k] += v
        return rc, fe

    def put(self, version, name, data, /):
        """put(version, name, data) -> reference"""
        version, n = _call.uint(version, "version"), _call.text("put", 2, name)
        p, size = _call.source(data, "KVCacheGate.put: data")
        ref = ffi.new("char[]", lib.FERRY_RECORD_REF_MAX + 1)
        rc, fe = self._kv(lib.ferry_kvcache_put, self._ns, version, n, p, size, ref, lib.FERRY_RECORD_REF_MAX + 1)
        if rc < 0:
            too_long = rc == lib.FERRY_EMSGSIZE
            raise _call.error(rc, None if too_long else fe,
                              "kvcache put: the key is longer than a reference allows" if too_long else None)
        return _call.str_of(ref)

    @staticmethod
    def _refused(ref, active):
        v = ffi.new("uint64_t *")
        if lib.ferry_kvcache_ref_version(ref, v) == 0:
            msg = (f"KV cache {ref.decode(errors='replace')} was made under policy version {v[0]}, the active one "
                   f"is {active}: recompute")
        else:
            msg = f"{ref.decode(errors='replace')} is not a KV cache reference"
        return _call.error(lib.FERRY_ESTALE, msg=msg)

    def get(self, ref, active_version, /):
        """get(ref, active_version) -> bytes; StaleError for another version"""
        r, active = _call.text("get", 1, ref), _call.uint(active_version, "active_version")
        n = ffi.new("size_t *")
        for _ in range(4):
            # the size first (cap 0 reads nothing), then the bytes
            rc, fe = self._kv(lib.ferry_kvcache_get, r, active, ffi.NULL, 0, n)
            if rc == lib.FERRY_ESTALE:
                raise self._refused(r, active)
            if rc < 0 and rc != lib.FERRY_EMSGSIZE:
                raise _call.error(rc, None if rc == lib.FERRY_EINVAL else fe,
                                  "kvcache get: not a KV cache reference" if rc == lib.FERRY_EINVAL else None)
            if rc == 0:
                return b""
            size, got = n[0], ffi.new("size_t *")
            buf = bytearray(size)
            rc, fe = self._kv(lib.ferry_kvcache_get, r, active, ffi.from_buffer(buf), size, got)
            if rc == 0 and got[0] == size:
                return bytes(buf)
            if rc < 0 and rc != lib.FERRY_EMSGSIZE:
                raise _call.error(rc, fe)
            # replaced by a larger object in between: again
        raise _call.error(lib.FERRY_EBUSY, msg="kvcache get: the object kept changing size while it was read; retry")

    def get_into(self, ref, active_version, buffer, /):
        """get_into(ref, active_version, buffer) -> bytes read"""
        r, active = _call.text("get_into", 1, ref), _call.uint(active_version, "active_version")
        p, size = _call.dest(buffer, "KVCacheGate.get_into: buffer")
        n = ffi.new("size_t *")
        rc, fe = self._kv(lib.ferry_kvcache_get, r, active, p, size, n)
        if rc == lib.FERRY_ESTALE:
            raise self._refused(r, active)
        if rc < 0:
            raise _call.error(rc, fe)
        return n[0]

    def retire(self, version, /):
        """retire(version) -> objects removed"""
        removed = ffi.new("uint64_t *")
        rc, fe = self._kv(lib.ferry_kvcache_retire, self._ns, _call.uint(version, "version"), removed)
        if rc < 0:
            raise _call.error(rc, fe)
        return removed[0]

    def stats(self):
        """stats() -> {stored, hits, refused, retired}"""
        return dict(self._st)


def kvcache_ref_version(ref, /):
    """kvcache_ref_version(ref) -> the version it was made under"""
    b, v = _call.key(ref, "ref"), ffi.new("uint64_t *")
    if lib.ferry_kvcache_ref_version(b, v) < 0:
        raise ValueError(f"{ref[:400]} is not a KV cache reference")
    return v[0]
