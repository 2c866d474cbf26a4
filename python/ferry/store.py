"""ferry.Store: the client of the ferry store (objects in node memory placed
by a master, KV with revisions, watch, barriers, leased queues).

The C extension (``ferry._ferry.Store``) holds the connection, the
registered buffers and the watches; the store's calls are written here over
the cffi binding (``ferry._binding``). Every call runs with the GIL
released. This module also adds the tensor-facing
helpers (structured objects, ``put_tensor``/``get_tensor``), the
Mooncake-style calls built on them (``upsert``, ``batch_is_exist``,
``get_size``) and :class:`ReplicateConfig`.
Memory arguments are numpy arrays, buffers, torch tensors or DLPack objects;
results are numpy arrays, or torch tensors with ``framework="torch"`` (or
through :mod:`ferry.torch`). See docs/store.md ("Python") and docs/python.md.
"""

import ctypes
import json
import operator
import time

from . import _call
from . import _ferry
from . import _tensors
from ._binding import ffi, lib
from ._ferry import (Error, NotFoundError, ExistsError, NoSpaceError, LostError, BusyError, ConflictError,
                     TimeoutError, AuthError, ConnectionError, StaleError, UnreachableError, QueueFullError, Watch)

__all__ = ["Store", "Watch", "ReplicateConfig", "Error", "NotFoundError", "ExistsError", "NoSpaceError",
           "LostError", "BusyError", "ConflictError", "TimeoutError", "AuthError", "ConnectionError",
           "StaleError", "UnreachableError", "QueueFullError", "dtype_name", "TENSOR_MEMBER"]

# the member of an object stored by put_tensor
TENSOR_MEMBER = "tensor"


class ReplicateConfig:
    """Where a put may land (Mooncake's ``ReplicateConfig`` names).

    ``replica_num`` copies on distinct segments (0 means 1, at most 8);
    ``preferred_segments`` (segment ids) tried first in order, after
    ``preferred_segment`` when set — a preference, not a requirement (see
    ``preferred`` in :meth:`Store.put_placed`); ``with_hard_pin``: never
    evicted (``hard_pin`` is the same attribute). ``with_soft_pin`` and
    ``prefer_alloc_in_same_node`` are accepted for Mooncake code and have no
    effect: ferry evicts unpinned objects least recently used first and
    places by preference and free space. ``ReplicateConfig()`` then setting
    attributes works as in Mooncake; a dict with the same names works too."""

    __slots__ = ("replica_num", "preferred_segments", "with_hard_pin", "with_soft_pin", "preferred_segment",
                 "prefer_alloc_in_same_node")

    def __init__(self, replica_num=1, preferred_segments=(), with_hard_pin=False, *, hard_pin=None,
                 with_soft_pin=False, preferred_segment=None, prefer_alloc_in_same_node=False):
        self.replica_num = replica_num
        self.preferred_segments = list(preferred_segments)
        self.with_hard_pin = bool(with_hard_pin if hard_pin is None else hard_pin)
        self.with_soft_pin = with_soft_pin
        self.preferred_segment = preferred_segment
        self.prefer_alloc_in_same_node = prefer_alloc_in_same_node

    @property
    def hard_pin(self):
        """The same as ``with_hard_pin``."""
        return self.with_hard_pin

    @hard_pin.setter
    def hard_pin(self, value):
        self.with_hard_pin = bool(value)

    def __repr__(self):
        return (f"ReplicateConfig(replica_num={self.replica_num!r}, "
                f"preferred_segments={self.preferred_segments!r}, with_hard_pin={self.with_hard_pin!r})")


def dtype_name(dtype):
    """The ferry dtype name ("f32", "i64", "bool", ...) of a numpy dtype or
    a torch dtype (``torch.bfloat16`` -> "bf16")."""
    s = str(dtype)
    if s.startswith("torch."):
        for k, v in _tensors.TORCH.items():
            if s == "torch." + v:
                return k
        raise ValueError(f"dtype {s} has no ferry name")
    import numpy as np
    dt = np.dtype(dtype)
    if dt.byteorder == ">" or (dt.byteorder == "=" and np.little_endian is False):
        raise ValueError(f"dtype {dt}: only little-endian data is stored")
    try:
        return _tensors.FROM_NUMPY[dt.name]
    except KeyError:
        raise ValueError(f"dtype {dt} has no ferry name (known: {sorted(_tensors.FROM_NUMPY)})") from None


def _member_of(name, value):
    """(name, ferry dtype, shape, contiguous buffer) of one put_struct value."""
    override = None
    if isinstance(value, tuple):
        if len(value) != 2 or not isinstance(value[1], str):
            raise TypeError(f"member {name}: a value is an array or tensor, or (array, dtype name)")
        value, override = value
    if _tensors.is_torch(value):
        if value.requires_grad:
            value = value.detach()
        if not value.is_contiguous():
            value = value.contiguous()   # put_struct copies into the object anyway
        dt = _tensors.dtype_of(value)
        if dt is None:
            raise ValueError(f"member {name}: dtype {value.dtype} has no ferry name")
        shape, itemsize = tuple(value.shape), value.element_size()
    else:
        import numpy as np
        dl_dt = None
        if not isinstance(value, np.ndarray) and not hasattr(value, "__array_interface__") and \
                hasattr(value, "__dlpack__"):
            value, dl_dt = _tensors.as_numpy(value, f"member {name}")
        a = np.asarray(value)
        if not a.flags.c_contiguous:
            a = np.ascontiguousarray(a)   # keeps 0-d arrays 0-d
        value, shape, itemsize = a, a.shape, a.dtype.itemsize
        dt = None if override is not None else dl_dt or dtype_name(a.dtype)
    if override is not None:
        if _tensors.SIZES.get(override, 0) != itemsize:
            raise ValueError(f"member {name}: dtype {override} does not match the {itemsize}-byte elements of "
                             f"{_tensors.describe(value)}")
        dt = override
    return (name, dt, shape, value)


def _check_dest(out, dtype, nbytes, what):
    """Refuse a destination whose dtype or size does not fit ``nbytes`` of
    ferry ``dtype``, before anything is read. Untyped bytes (u8, bytearray)
    of at least nbytes fit any dtype."""
    got = _tensors.dtype_of(out)
    m = _ferry.memory(out, what, True)
    if got in (None, "u8") and dtype != "u8":
        if m.nbytes < nbytes:
            raise ValueError(f"{what} ({_tensors.describe(out)}) holds {m.nbytes} bytes; {nbytes} are needed")
        return
    if got != dtype and not (dtype == "bf16" and got == "u16") and not (dtype.startswith("fp8") and got == "u8"):
        raise ValueError(f"{what} ({_tensors.describe(out)}) has dtype {got}; the stored data is {dtype}")
    if m.nbytes != nbytes:
        raise ValueError(f"{what} ({_tensors.describe(out)}) holds {m.nbytes} bytes; the stored data is {nbytes}")


def _config_like(o):
    """A config given in the place of Mooncake's size (ferry's older
    put_from(key, buffer, config)): a dict or anything with replica_num."""
    return o is not None and not isinstance(o, int) and (isinstance(o, dict) or hasattr(o, "replica_num"))


def _replicate(config):
    """(ferry_replicate_config * or NULL, what holds its segment ids) of a
    ReplicateConfig, a dict with its names, or None."""
    r = _ferry._replicate(config)
    if r is None:
        return ffi.NULL, None
    c = ffi.new("ferry_replicate_config *")
    c.replica_num, c.hard_pin = r[0], r[1]
    ids = ffi.new("uint64_t[]", r[2]) if r[2] else ffi.NULL
    c.preferred_segments, c.npreferred = ids, len(r[2])
    return c, ids


def _desc(d):
    """A ferry_object_desc as {'size', 'replicas': [...]}."""
    n = min(d.nreplicas, lib.FERRY_STORE_REPLICAS_MAX)
    return {"size": d.size, "replicas": [{"segment": r.segment, "node": r.node, "offset": r.offset,
                                          "preferred": bool(r.preferred)} for r in d.replicas[0:n]]}


class Store(_ferry.Store):
    """A client of the ferry store, with Mooncake's names and signatures.

    ``store = ferry.Store(); store.setup(master="10.0.0.1:7700",
    token_file="/etc/ferry/token")``; unset arguments come from FERRY_MASTER,
    FERRY_TOKEN, FERRY_TOKEN_FILE and FERRY_TRANSPORT. ``Store(**kw)``
    calls ``setup(**kw)`` at once when given arguments. A context manager:
    ``with Store(master=...) as s: ...`` closes at the end.

    ``framework`` ("numpy" or "torch") is what tensor results are made of
    when a call is not told otherwise (``ferry.torch.Store`` defaults to
    torch). Errors are :class:`ferry.Error` subclasses with ``.code`` (the
    negative FERRY_E* code) and a message saying what failed.
    """

    framework = "numpy"

    def __init__(self, framework=None, **kw):
        if framework is not None:
            self.framework = _tensors.check_framework(framework)
        if kw:
            self.setup(**kw)

    def _fw(self, framework):
        return self.framework if framework is None else _tensors.check_framework(framework)

    # ---- calls over the cffi binding ------------------------------------------------------
    # The C handle is the ferry._ferry.Store's: _enter() hands its address
    # over (an int; ValueError when the store is not open) and counts the
    # call in flight until _leave(), so that close() refuses meanwhile, as
    # for the calls the extension still makes itself. cffi releases the GIL
    # for each lib call.

    def _call(self, fn, *args):
        h = self._enter()
        try:
            return fn(ffi.cast("ferry_store *", h), *args)
        finally:
            self._leave()

    def _checked(self, fn, *args):
        """fn(store, *args, &error): its result, or its error raised."""
        fe = _call.new_error()
        rc = self._call(fn, *args, fe)
        if rc < 0:
            raise _call.error(rc, fe)
        return rc

    def get(self, key, /):
        """A whole object as bytes (a copy)."""
        buf, n = ffi.new("void **"), ffi.new("size_t *")
        self._checked(lib.ferry_store_get, _call.text("get", 1, key), buf, n)
        try:
            return ffi.unpack(ffi.cast("char *", buf[0]), n[0])
        finally:
            lib.ferry_store_free(buf[0])

    def is_exist(self, key, /):
        """1 when the object exists (complete), else 0."""
        rc = self._checked(lib.ferry_store_exist, _call.text("is_exist", 1, key))
        return int(rc > 0)

    def remove(self, key, /):
        """Remove an object (NotFoundError when there is none, BusyError
        while a read holds its lease). Returns 0."""
        self._checked(lib.ferry_store_remove, _call.text("remove", 1, key))
        return 0

    def remove_prefix(self, prefix, /):
        """Remove every unleased object whose key starts with prefix; the count removed."""
        n = ffi.new("uint64_t *")
        self._checked(lib.ferry_store_remove_prefix, _call.text("remove_prefix", 1, prefix), n)
        return n[0]

    def kv_get(self, key, /):
        """(value, revision) of a KV key, or None."""
        fe, kv = _call.new_error(), ffi.new("ferry_kv_value *")
        rc = self._call(lib.ferry_kv_get, _call.text("kv_get", 1, key), kv, fe)
        if rc == lib.FERRY_ENOENT:
            return None
        if rc < 0:
            raise _call.error(rc, fe)
        try:
            return ffi.unpack(ffi.cast("char *", kv.val), kv.len), kv.mod_rev
        finally:
            lib.ferry_store_free(kv.val)

    def _name_value(self, fn, name, what, c_fn, value):
        """c_fn(store, name, the bytes of value, &n): n (a revision, an id)."""
        k = _call.text(fn, 1, name)
        p, nbytes = _call.source(value, f"{fn}('{name}'): {what}")
        out = ffi.new("uint64_t *")
        self._checked(c_fn, k, p, nbytes, out)
        return out[0]

    def kv_put(self, key, value, /):
        """Set a KV key (any buffer, at most 16 MiB); the new revision."""
        return self._name_value("kv_put", key, "value", lib.ferry_kv_put, value)

    def _kv_rev(self, c_fn, *args):
        fe, rev = _call.new_error(), ffi.new("uint64_t *")
        rc = self._call(c_fn, *args, rev, fe)
        if rc < 0:
            e = _call.error(rc, fe)
            if rc == lib.FERRY_ESTATE:
                e.current_revision = rev[0]
            raise e
        return rev[0]

    def kv_cas(self, key, expected_rev, value, /):
        """Set key only if its revision is expected_rev (0: only if absent);
        the new revision, else ConflictError with .current_revision."""
        k = _call.text("kv_cas", 1, key)
        expected = _call.uint(expected_rev, "expected_rev")
        p, nbytes = _call.source(value, f"kv_cas('{key}'): value")
        return self._kv_rev(lib.ferry_kv_cas, k, expected, p, nbytes)

    def kv_delete(self, key, expected_rev=0):
        """Delete key (with expected_rev: only at that revision); the
        deleting revision, else ConflictError with .current_revision."""
        k = _call.text("kv_delete", 1, key)
        expected = 0 if expected_rev is None else _call.uint(expected_rev, "expected_rev")
        return self._kv_rev(lib.ferry_kv_delete, k, expected)

    def barrier(self, name, member, count, timeout_ms=0):
        """Wait until count distinct members reached barrier name (this one
        as member); the barrier's generation. TimeoutError after timeout_ms
        (0: the store's call timeout). The GIL is released while waiting."""
        n, m = _call.text("barrier", 1, name), _call.text("barrier", 2, member)
        c = _call.uint(count, "count", 0, 2**32 - 1)
        t = 0 if timeout_ms is None else _call.uint(timeout_ms, "timeout_ms")
        gen = ffi.new("uint64_t *")
        self._checked(lib.ferry_barrier, n, m, c, t, gen)
        return gen[0]

    def queue_push(self, queue, data, /):
        """Append a record (any buffer) to a leased queue; its id."""
        return self._name_value("queue_push", queue, "value", lib.ferry_queue_push, data)

    def _queue_settle(self, c_fn, id, token):
        i, t = _call.uint(id, "id"), _call.uint(token, "token", 0, 2**32 - 1)
        self._checked(c_fn, i, t)

    def queue_ack(self, id, token, /):
        """The record (id, token of its delivery) is done: removed."""
        self._queue_settle(lib.ferry_queue_ack, id, token)

    def queue_nack(self, id, token, /):
        """The record goes back to the queue at once, for another pop."""
        self._queue_settle(lib.ferry_queue_nack, id, token)

    def list_page(self, prefix="", after=None, limit=1000):
        """(keys, more): at most limit keys with the prefix after ``after``
        (None: from the start), ascending; more: there are further keys."""
        p = _call.text("list", 1, prefix)
        a = ffi.NULL if after is None else _call.text("list", 2, after)
        if operator.index(limit) < 0:
            raise ValueError("limit must not be negative")
        keys, n, more = ffi.new("char ***"), ffi.new("size_t *"), ffi.new("bool *")
        self._checked(lib.ferry_store_list, p, a, operator.index(limit), keys, n, more)
        try:
            return [_call.str_of(keys[0][i]) for i in range(n[0])], bool(more[0])
        finally:
            lib.ferry_store_free(keys[0])

    def list(self, prefix="", after=None, limit=1000):
        """Keys with the prefix after ``after``, ascending (list_page without ``more``)."""
        return self.list_page(prefix, after, limit)[0]

    def queue_pop(self, queue, max=1, lease_ms=30000):
        """Lease up to max ready records of a queue for lease_ms:
        [(id, token, data), ...], possibly empty."""
        q = _call.text("queue_pop", 1, queue)
        n = _call.uint(max, "max", 1, lib.FERRY_STORE_POP_MAX)
        lease = _call.uint(lease_ms, "lease_ms", 1, lib.FERRY_STORE_LEASE_MAX_MS)
        recs, got = ffi.new("ferry_qrecord[]", n), ffi.new("size_t *")
        self._checked(lib.ferry_queue_pop, q, n, lease, recs, got)
        k = min(got[0], n)
        try:
            return [(r.id, r.token, ffi.unpack(ffi.cast("char *", r.data), r.len) if r.data else b"")
                    for r in recs[0:k]]
        finally:
            lib.ferry_qrecords_free(recs, k)

    def status(self):
        """The master's state (a dict: segments, objects, kv_revision, ...)."""
        text = ffi.new("char **")
        self._checked(lib.ferry_store_status_json, text)
        try:
            return json.loads(ffi.string(text[0]) if text[0] else "null")
        finally:
            lib.ferry_store_free(text[0])

    def warm(self, write=False):
        """Touch every page of this machine's segments once through this
        client's mappings (a set-up step: later puts and gets pay no first
        touch); the bytes touched."""
        n = ffi.new("uint64_t *")
        self._checked(lib.ferry_store_warm, bool(write), n)
        return n[0]

    def engine_address(self):
        """The client engine's address."""
        a = self._call(lambda s: lib.ferry_engine_address(lib.ferry_store_engine(s)))
        return ffi.string(a).decode() if a else ""

    def _put(self, fn, c_fn, key, value, size, config, what):
        """A put of value (size: its first bytes) under the config: the placement."""
        if _config_like(size) and config is None:   # put_from(key, buffer, config)
            config, size = size, None
        k = _call.text(fn, 1, key)
        cfg, keep = _replicate(config)
        addr, n, hold = self._memory(value, size, False, f"{fn}('{key}'): {what}")
        placed = ffi.new("ferry_object_desc *")
        self._checked(c_fn, k, ffi.cast("void *", addr), n, cfg, placed)
        del hold, keep
        return placed

    def put(self, key, value, config=None):
        """Store a copy of value (bytes, an array, a tensor or any contiguous
        buffer) under key. Returns 0."""
        self._put("put", lib.ferry_store_put, key, value, None, config, "value")
        return 0

    def put_from(self, key, buffer, size=None, config=None):
        """Store buffer (an array, tensor or buffer, or an address inside a
        registered buffer with its size) under key without a copy; fastest
        on registered buffers. Returns 0."""
        self._put("put_from", lib.ferry_store_put_from, key, buffer, size, config, "buffer")
        return 0

    def put_placed(self, key, value, config=None):
        """put_from, returning where each replica landed:
        {'size', 'replicas': [{'segment', 'node', 'offset', 'preferred'}]}."""
        return _desc(self._put("put_placed", lib.ferry_store_put_from, key, value, None, config, "value"))

    def get_into(self, key, buffer, size=None):
        """Read an object into buffer (an array, tensor or writable buffer,
        or an address inside a registered buffer with its size), in place;
        the bytes read."""
        k = _call.text("get_into", 1, key)
        addr, cap, hold = self._memory(buffer, size, True, f"get_into('{key}'): buffer")
        fe, n = _call.new_error(), ffi.new("size_t *")
        rc = self._call(lib.ferry_store_get_into, k, ffi.cast("void *", addr), cap, n, fe)
        del hold
        if rc == lib.FERRY_EMSGSIZE:
            raise _call.error(rc, msg=f"get_into('{key}'): the object is {n[0]} bytes, the buffer holds {cap}; "
                              "nothing was read")
        if rc < 0:
            raise _call.error(rc, fe)
        return n[0]

    def get_replica_desc(self, key, /):
        """{'size', 'replicas': [{'segment', 'node', 'offset', 'preferred'}]} of an object."""
        d = ffi.new("ferry_object_desc *")
        self._checked(lib.ferry_store_get_replica_desc, _call.text("get_replica_desc", 1, key), d)
        return _desc(d)

    def get_members(self, key, /):
        """The members of a structured object: [{'name', 'dtype', 'shape', 'offset', 'nbytes'}]."""
        k = _call.text("get_members", 1, key)
        n, cap = ffi.new("size_t *"), 64
        while True:
            m = ffi.new("ferry_member[]", cap)
            self._checked(lib.ferry_store_get_members, k, m, cap, n)
            if n[0] <= cap:
                break
            cap = n[0]
        return [{"name": _call.str_of(x.name), "dtype": _call.str_of(x.dtype),
                 "shape": tuple(x.shape[0:min(x.ndim, lib.FERRY_MEMBER_NDIM_MAX)]), "offset": x.offset,
                 "nbytes": x.nbytes} for x in m[0:n[0]]]

    def read_member_into(self, key, member, row_begin, row_end, buffer, size=None):
        """Rows [row_begin, row_end) of a member, raw bytes, into buffer (an
        array, tensor or writable buffer, or an address inside a registered
        buffer with its size); the bytes read."""
        k, mb = _call.text("read_member_into", 1, key), _call.text("read_member_into", 2, member)
        a, b = _call.uint(row_begin, "row_begin"), _call.uint(row_end, "row_end")
        addr, cap, hold = self._memory(buffer, size, True, f"read_member_into('{key}', '{member[:40]}'): buffer")
        n = ffi.new("size_t *")
        self._checked(lib.ferry_store_read_member, k, mb, a, b, ffi.cast("void *", addr), cap, n)
        del hold
        return n[0]

    def _batch(self, fn, keys, buffers, sizes, writable):
        """(keys as C strings, buffer addresses, lengths, holders) of a batch call."""
        kt, bt = _call.seq(keys, "keys"), _call.seq(buffers, "buffers")
        if len(bt) != len(kt):
            raise ValueError(f"{fn}: {len(kt)} keys but {len(bt)} buffers")
        st = None if sizes is None else _call.seq(sizes, "sizes")
        if st is not None and len(st) != len(kt):
            raise ValueError(f"{fn}: {len(kt)} keys but {len(st)} sizes")
        cks, mems = [], []
        for i, b in enumerate(bt):
            cks.append(ffi.new("char[]", _call.key(kt[i], "key")))
            mems.append(self._memory(b, None if st is None else st[i], writable,
                                     f"{fn}: buffers[{i}] (for '{kt[i]}')"))
        return (cks, ffi.new("const char *[]", cks), ffi.new("void *[]", [ffi.cast("void *", m[0]) for m in mems]),
                ffi.new("size_t[]", [m[1] for m in mems]), mems)

    def batch_put_from(self, keys, buffers, sizes=None, config=None):
        """put_from of each (key, buffer[, size]) in one call: a list with
        0 or the negative code of each key (Mooncake's integer results)."""
        if _config_like(sizes) and config is None:   # batch_put_from(keys, buffers, config)
            config, sizes = sizes, None
        cfg, keep = _replicate(config)
        held, ks, bufs, lens, mems = self._batch("batch_put_from", keys, buffers, sizes, False)
        res, fe = _call.results(len(mems), "int"), _call.new_error()
        rc = self._call(lib.ferry_store_batch_put_from, ks, bufs, lens, len(mems), cfg, res, fe) if mems else 0
        del held, mems, keep
        return _call.results_list(rc, res, fe, "int")

    def batch_get_into(self, keys, buffers, sizes=None):
        """get_into of each (key, buffer[, size]) in one call: a list with
        the bytes read or the negative code of each key."""
        held, ks, bufs, lens, mems = self._batch("batch_get_into", keys, buffers, sizes, True)
        res, fe = _call.results(len(mems), "int64_t"), _call.new_error()
        rc = self._call(lib.ferry_store_batch_get_into, ks, bufs, lens, len(mems), res, fe) if mems else 0
        del held, mems
        return _call.results_list(rc, res, fe, "int64_t")

    def get_into_ranges(self, ranges, /):
        """Read byte ranges of objects, each (key, src_offset, buffer[,
        length]), straight into writable buffers in one call: a list with
        the bytes read or the negative code of each range."""
        rt = _call.seq(ranges, "ranges")
        r, held = ffi.new("ferry_range[]", len(rt)), []
        for i, item in enumerate(rt):
            try:
                it = tuple(item)
            except TypeError:
                it = ()
            if len(it) not in (3, 4):
                raise TypeError(f"ranges[{i}] must be (key, src_offset, buffer[, length])")
            k = ffi.new("char[]", _call.key(it[0], "key"))
            off = _call.uint(it[1], f"ranges[{i}]: src_offset")
            p, n = _call.dest(it[2], f"ranges[{i}]: buffer")
            if len(it) == 4 and it[3] is not None:
                length = _call.uint(it[3], f"ranges[{i}]: length")
                if length > n:
                    raise ValueError(f"ranges[{i}]: length {length} exceeds the buffer ({n} bytes)")
                n = length
            held += [k, p]
            r[i].key, r[i].src_offset, r[i].dst, r[i].len = k, off, p, n
        res, fe = _call.results(len(rt), "int64_t"), _call.new_error()
        rc = self._call(lib.ferry_store_get_into_ranges, r, len(rt), res, fe) if rt else 0
        del held
        return _call.results_list(rc, res, fe, "int64_t")

    def put_struct_raw(self, key, members, config=None):
        """Store members, each (name, dtype, shape, buffer) with a ferry
        dtype name, as one structured object (put_struct is the
        dict-of-arrays form)."""
        k = _call.text("put_struct_raw", 1, key)
        cfg, keep = _replicate(config)
        mt = _call.seq(members, "members")
        m, data, held = ffi.new("ferry_member[]", len(mt)), ffi.new("void *[]", len(mt)), []
        for i, it in enumerate(mt):
            if not (isinstance(it, tuple) and len(it) == 4 and isinstance(it[0], str) and isinstance(it[1], str)):
                raise TypeError(f"members[{i}] must be a tuple (name, dtype, shape, buffer)")
            name, dtype, shape, buf = it
            _call.copy_str(m[i], "name", _call.text("put_struct_raw", 2, name), "member name")
            _call.copy_str(m[i], "dtype", _call.text("put_struct_raw", 2, dtype), "dtype")
            dims = _call.seq(shape, "shape")
            if len(dims) > lib.FERRY_MEMBER_NDIM_MAX:
                raise ValueError(f"member {name}: at most {lib.FERRY_MEMBER_NDIM_MAX} dimensions")
            count = 1
            for d, x in enumerate(dims):
                m[i].shape[d] = _call.uint(x, "a shape dimension")
                count *= m[i].shape[d]
            m[i].ndim = len(dims)
            p, nbytes = _call.source(buf, f"put_struct('{key}'): member {name}")
            held.append(p)
            data[i] = p
            es = lib.ferry_dtype_size(dtype.encode())
            if not es:
                raise ValueError(f"member {name}: unknown dtype {dtype}")
            if count * es != nbytes:
                raise ValueError(f"member {name}: shape and dtype make {count * es} bytes, the buffer has {nbytes}")
        self._checked(lib.ferry_store_put_struct, k, m, data, len(mt), cfg)
        del held, keep

    # ---- structured objects -------------------------------------------------------

    def put_struct(self, key, members, config=None):
        """Store a dict ``{name: array or tensor}`` as one structured object.

        A value is a numpy array (any array_like; copied only when not
        C-contiguous), a torch tensor of any dtype ferry knows (bf16
        included; ``nn.Parameter`` and tensors that require grad as they
        are), or ``(array, dtype_name)`` to store it under another ferry
        dtype of the same element size (bfloat16 words in numpy:
        ``(uint16_array, "bf16")``). Members keep the dict's order. Returns 0."""
        items = members.items() if hasattr(members, "items") else members
        raw = [_member_of(str(name), value) for name, value in items]
        self.put_struct_raw(key, raw, config)
        return 0

    def _member(self, key, member):
        for m in self.get_members(key):
            if m["name"] == member:
                return m
        raise NotFoundError(f"reading member {member!r} of '{key}': it has no such member")

    def read_member(self, key, member, rows=None, out=None, framework=None):
        """Rows ``[a, b)`` (``rows=(a, b)``, along dimension 0; None: all) of
        a member, shape ``(b - a,) + shape[1:]``, as a new numpy array of the
        member's dtype (bf16 as uint16 words, fp8 as uint8) or, with
        ``framework="torch"``, a torch tensor (bf16 as torch.bfloat16). A 0-d
        member has one row and comes back 0-d when rows is None. With
        ``out`` (an array, tensor or buffer of that dtype and size, or raw
        bytes of at least that size) the rows are written into it in place
        and it is returned; a mismatch is refused before anything is read."""
        m = self._member(key, member)
        shape = tuple(m["shape"])
        if not shape:
            if rows not in (None, (0, 1)):
                raise ValueError("a 0-d member has one row: rows=(0, 1)")
            a, b, oshape = 0, 1, ()
        else:
            a, b = (0, shape[0]) if rows is None else rows
            if not (0 <= a <= b <= shape[0]):
                raise IndexError(f"rows ({a}, {b}) outside member {member} with {shape[0]} rows")
            oshape = (b - a,) + shape[1:]
        size = _tensors.SIZES.get(m["dtype"], 1)
        n = size
        for x in oshape:
            n *= x
        if out is None:
            out = _tensors.empty(oshape, m["dtype"], self._fw(framework))
        else:
            _check_dest(out, m["dtype"], n, f"read_member('{key}', '{member}'): out")
        if n:
            self.read_member_into(key, member, a, b, out)
        return out

    # ---- tensors (Mooncake's put_tensor / get_tensor) -----------------------------

    def put_tensor(self, key, tensor, config=None):
        """Store one tensor or array (any dtype ferry knows, bf16 included)
        with its dtype and shape: a structured object with one member,
        ``"tensor"``. Returns 0 (Mooncake's convention); errors raise."""
        return self.put_struct(key, {TENSOR_MEMBER: tensor}, config)

    def _tensor_member(self, key):
        ms = self.get_members(key)
        if len(ms) != 1:
            names = [m["name"] for m in ms]
            raise ValueError(f"{key} holds {len(ms)} members {names}, not one tensor: use read_member")
        return ms[0]

    def get_tensor(self, key, framework=None):
        """The tensor stored under ``key`` by put_tensor (or any structured
        object of one member) as a numpy array, or a torch tensor with
        ``framework="torch"`` — of its dtype (bf16: torch.bfloat16; numpy has
        none: uint16 words) and shape. NotFoundError when there is none."""
        m = self._tensor_member(key)
        return self.read_member(key, m["name"], framework=framework)

    def get_tensor_into(self, key, buffer, size=None, framework=None):
        """Read the tensor under ``key`` into ``buffer`` — an array or tensor
        of the stored dtype and element count, raw bytes of at least its
        size, or (Mooncake's form) an address inside a registered buffer with
        its ``size`` — and return it viewed with the stored shape and dtype:
        the destination itself (same data pointer) when it already has them.
        Dtype and size mismatches are refused before anything is read."""
        m = self._tensor_member(key)
        dtype, shape = m["dtype"], tuple(m["shape"])
        nbytes = m["nbytes"]
        what = f"get_tensor_into('{key}'): buffer"
        if isinstance(buffer, int) and not isinstance(buffer, bool):
            if size is None:
                raise TypeError(f"{what}: an address (int) needs its size")
            if size < nbytes:
                raise ValueError(f"{what}: {size} bytes at the address; the tensor is {nbytes}")
            if nbytes:
                self.read_member_into(key, m["name"], 0, shape[0] if shape else 1, buffer, size)
            fw = self._fw(framework)
            raw = (ctypes.c_char * nbytes).from_address(buffer)
            view = _tensors.from_buffer(raw, dtype, shape, fw) if nbytes else _tensors.empty(shape, dtype, fw)
            return view
        _check_dest(buffer, dtype, nbytes, what)
        if nbytes:
            self.read_member_into(key, m["name"], 0, shape[0] if shape else 1, buffer)
        return _reshaped(buffer, dtype, shape)

    # ---- Mooncake's other calls -------------------------------------------------------

    def upsert(self, key, value, config=None, timeout_ms=10000):
        """Put ``value`` under ``key``, replacing the object there (Mooncake's
        upsert). Not atomic: the old object is removed, then the new one put,
        so a reader in between gets NotFoundError. An object read in the
        last lease (``setup(lease_ms=...)``, 5 s by default) is leased to its
        reader and cannot be removed: upsert waits up to ``timeout_ms`` for
        the lease to lapse, then raises BusyError (saying for how much
        longer it is leased). Returns 0."""
        return self._upsert(self.put, key, (value,), config, timeout_ms)

    def upsert_from(self, key, buffer, size=None, config=None, timeout_ms=10000):
        """upsert from an array, tensor or buffer without a copy, or from an
        address inside a registered buffer with its size. Returns 0."""
        if size is not None and not isinstance(size, int) and config is None:
            size, config = None, size          # upsert_from(key, buffer, config)
        args = (buffer,) if size is None else (buffer, size)
        return self._upsert(self.put_from, key, args, config, timeout_ms)

    def _upsert(self, put, key, args, config, timeout_ms):
        deadline = time.monotonic() + timeout_ms / 1000.0
        wait = 0.005
        while True:
            try:
                return put(key, *args, config=config)
            except ExistsError:
                pass
            try:
                self.remove(key)
            except NotFoundError:
                pass                             # removed by someone else meanwhile: put again
            except BusyError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(min(wait, max(0.0, deadline - time.monotonic())))   # a reader's lease: let it lapse
                wait = min(wait * 2, 0.1)
            if time.monotonic() >= deadline:
                raise ExistsError(f"upsert of '{key}': other writers kept putting it for {timeout_ms} ms")

    def batch_is_exist(self, keys):
        """For each key: 1 when the object exists, 0 when not, or the
        negative FERRY_E* code of a failure for that key (LostError:
        ``-ELOST``). Connection and authentication failures raise."""
        out = []
        for k in keys:
            try:
                out.append(self.is_exist(k))
            except (ConnectionError, AuthError):
                raise
            except Error as e:
                out.append(e.code)
        return out

    def get_size(self, key):
        """The object's size in bytes (NotFoundError when there is none)."""
        return self.get_replica_desc(key)["size"]

    def list_all(self, prefix="", page=1000):
        """Every key with the prefix, paging through list_page."""
        keys, after = [], None
        while True:
            got, more = self.list_page(prefix, after, page)
            keys += got
            if not more or not got:
                return keys
            after = got[-1]


def _reshaped(buf, dtype, shape):
    """buf (an array or tensor with the bytes of a tensor of ferry dtype
    and shape) viewed as that tensor; buf itself when it already is."""
    if _tensors.is_torch(buf):
        import torch
        want = _tensors.torch_dtype(dtype)
        t = buf if buf.dtype == want else buf.view(torch.uint8).reshape(-1)[:_nbytes(dtype, shape)].view(want)
        return t if tuple(t.shape) == tuple(shape) else t.reshape(shape)
    import numpy as np
    if isinstance(buf, np.ndarray):
        want = _tensors.numpy_dtype(dtype)
        a = buf if buf.dtype == want else buf.reshape(-1).view(np.uint8)[:_nbytes(dtype, shape)].view(want)
        return a if a.shape == tuple(shape) else a.reshape(shape)
    a, _ = _tensors.as_numpy(buf, "buffer")
    return a.reshape(-1).view(np.uint8)[:_nbytes(dtype, shape)].view(_tensors.numpy_dtype(dtype)).reshape(shape)


def _nbytes(dtype, shape):
    n = _tensors.SIZES[dtype]
    for x in shape:
        n *= x
    return n
