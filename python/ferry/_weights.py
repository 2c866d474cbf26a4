"""The calls of ferry.weights and ferry.sparse that run over the cffi binding
(include/ferry/weights.h): the publisher assignment, dtype conversion, object
keys, the active generation and its manifest, and the sparse generations'
announcement, active mark and chain. Publishing, updates and the sparse
objects' reads are still the C extension's (python/ferry/_ferry_weights.c,
_ferry_sparse*.c). Store calls count on the store as in flight (Store.close()
refuses meanwhile) and release the GIL (cffi's calls do)."""

from . import _call
from . import _ferry
from ._binding import ffi, lib

_U32 = 2**32 - 1


def _store_call(store, fn, *args):
    """fn(store's handle, *args, &error): its result, or its error raised."""
    if not isinstance(store, _ferry.Store):
        raise TypeError(f"expected a ferry.Store, not {type(store).__name__}")
    fe = _call.new_error()
    h = ffi.cast("ferry_store *", store._enter())
    try:
        rc = fn(h, *args, fe)
    finally:
        store._leave()
    return rc, fe


def _checked(store, fn, *args):
    rc, fe = _store_call(store, fn, *args)
    if rc < 0:
        raise _call.error(rc, fe)
    return rc


def _u64_seq(o, hi, what):
    out = []
    for i, x in enumerate(_call.seq(o, what)):
        if not isinstance(x, int) or x < 0 or x > _call.U64_MAX:
            raise ValueError(f"{what}[{i}] must be an int in [0, {hi}]")
        if x > hi:
            raise ValueError(f"{what}[{i}] = {x} is above {hi}")
        out.append(x)
    return out


# ---- assign, convert, key -----------------------------------------------------------------

def weights_assign(sizes, rank_node, /):
    """weights_assign(sizes, rank_node) -> [publisher rank per tensor]"""
    s = _u64_seq(sizes, _call.U64_MAX, "sizes")
    r = _u64_seq(rank_node, _U32, "rank_node")
    if len(r) > _U32:
        raise ValueError("too many ranks")
    pub, fe = ffi.new("uint32_t[]", len(s) or 1), _call.new_error()
    rc = lib.ferry_weights_assign(ffi.new("uint64_t[]", s or 1), len(s), ffi.new("uint32_t[]", r or 1), len(r), pub,
                                  fe)
    if rc < 0:
        raise _call.error(rc, fe)
    return list(pub[0:len(s)])


_CONVERT_DTYPES = 'convert: dtypes are "f32", "bf16" or "f16"'


def weights_convert(src, src_dtype, dst, dst_dtype, count, /):
    """weights_convert(src, src_dtype, dst, dst_dtype, count): dst a writable C-contiguous buffer"""
    sd, dd = _call.text("weights_convert", 2, src_dtype), _call.text("weights_convert", 4, dst_dtype)
    count = _call.uint(count, "count")
    ss, ds = lib.ferry_dtype_size(sd), lib.ferry_dtype_size(dd)
    if not ss or not ds:
        raise _call.error(lib.FERRY_EINVAL, msg=_CONVERT_DTYPES)
    sp, sn = _call.source(src, "convert: source")
    dp, dn = _call.dest(dst, "convert: destination")
    if count > sn // ss or count > dn // ds:
        raise ValueError(f"convert: {count} elements do not fit the buffers ({sn} and {dn} bytes)")
    sa, da = int(ffi.cast("uintptr_t", sp)), int(ffi.cast("uintptr_t", dp))
    if count and sa < da + count * ds and da < sa + count * ss and not (sa == da and sd == dd):
        raise ValueError("convert: source and destination overlap")
    rc = lib.ferry_convert(sp, sd, dp, dd, count)
    if rc < 0:
        raise _call.error(rc, msg=_CONVERT_DTYPES)


def weights_key(model, generation, fragment, /):
    """weights_key(model, generation, fragment) -> the object key of a fragment"""
    m, f = _call.text("weights_key", 1, model), _call.text("weights_key", 3, fragment)
    cap = len(m) + len(f) + 64
    buf = ffi.new("char[]", cap)
    rc = lib.ferry_weights_key(m, _call.uint(generation, "generation"), f, buf, cap)
    if rc < 0:
        raise _call.error(rc, msg="key: the model name is empty or holds '/'" if rc == lib.FERRY_EINVAL else None)
    return ffi.unpack(buf, rc).decode("utf-8", "surrogateescape")


# ---- reading -------------------------------------------------------------------------------

def weights_active(store, model, /):
    """weights_active(store, model) -> (generation, digest) or None"""
    ws = ffi.new("ferry_weights_status *")
    rc, fe = _store_call(store, lib.ferry_weights_active_status, _call.text("weights_active", 2, model), ws)
    if rc == lib.FERRY_ENOENT:
        return None
    if rc < 0:
        raise _call.error(rc, fe)   # LostError: "generation G of M is lost: ..."
    return ws.generation, ffi.unpack(ffi.cast("char *", ws.digest), 16)


def _entry(e):
    return {"name": _call.str_of(e.name), "dtype": _call.str_of(e.dtype), "shape": tuple(e.shape[0:e.ndim]),
            "bytes": e.bytes, "checksum": e.checksum, "publisher": e.publisher, "segment": e.segment,
            "key": _call.str_of(e.key)}


def weights_manifest(store, model, generation, /):
    """weights_manifest(store, model, generation) -> [entry dict]"""
    m = ffi.new("ferry_weight_manifest *")
    _checked(store, lib.ferry_weights_manifest, _call.text("weights_manifest", 2, model),
             _call.uint(generation, "generation"), m)
    try:
        return [_entry(m.entries[i]) for i in range(m.n)]
    finally:
        lib.ferry_weight_manifest_free(m)


def weights_wait_active(store, model, at_least, timeout_ms, /):
    """weights_wait_active(store, model, at_least, timeout_ms) -> the announced generation once it is at least at_least"""
    g = ffi.new("uint64_t *")
    _checked(store, lib.ferry_weights_wait_active, _call.text("weights_wait_active", 2, model),
             _call.uint(at_least, "at_least"), timeout_ms, g)
    return g[0]


# ---- sparse generations ----------------------------------------------------------------------

def sparse_announce(store, model, base, generation, keys, keep, /):
    """sparse_announce(store, model, base, generation, keys, keep) -> stats dict"""
    m, gen = _call.text("sparse_announce", 2, model), _call.uint(generation, "generation")
    ks = [ffi.new("char[]", _call.key(k, "keys[i]")) for k in _call.seq(keys, "keys")]
    st = ffi.new("ferry_sparse_announce_stats *")
    _checked(store, lib.ferry_sparse_announce, m, _call.uint(base, "base"), gen, ffi.new("char *[]", ks + [ffi.NULL]),
             len(ks), _call.uint(keep, "keep", 0, _U32), st)
    return {"generation": gen, **_call.counters(st)}


def sparse_chain(store, model, held, /):
    """sparse_chain(store, model, held) -> {active, dense, load_dense, links}"""
    ch = ffi.new("ferry_sparse_chain *")
    _checked(store, lib.ferry_sparse_chain_resolve, _call.text("sparse_chain", 2, model), _call.uint(held, "held"), ch)
    try:
        links = [{"generation": ln.generation, "base": ln.base,
                  "keys": [_call.str_of(ln.keys[j]) for j in range(ln.nkeys)]}
                 for ln in (ch.links[i] for i in range(ch.nlinks))]
        return {"active": ch.active, "dense": ch.dense, "load_dense": bool(ch.load_dense), "links": links}
    finally:
        lib.ferry_sparse_chain_free(ch)


def sparse_active(store, model, /):
    """sparse_active(store, model) -> (generation, sparse) or None"""
    g, sparse = ffi.new("uint64_t *"), ffi.new("bool *")
    rc, fe = _store_call(store, lib.ferry_sparse_active, _call.text("sparse_active", 2, model), g, sparse)
    if rc == lib.FERRY_ENOENT:
        return None
    if rc < 0:
        raise _call.error(rc, fe)
    return g[0], bool(sparse[0])


# ---- sparse objects: put, admission (include/ferry/sparse.h) ---------------------------------

_NDIM = lib.FERRY_SPARSE_NDIM_MAX
_APPLY = {"scatter_add": lib.FERRY_SPARSE_SCATTER_ADD, "scatter_set": lib.FERRY_SPARSE_SCATTER_SET}


def _d_u64(d, k, rec, field, opt=False):
    if k not in d:
        if opt:
            return
        raise KeyError(f"sparse descriptor: {k} is missing")
    v = d[k]
    if not isinstance(v, int):
        raise TypeError(f"{k} must be an int, not {type(v).__name__}")
    if v < 0 or v > _call.U64_MAX:
        raise ValueError(f"{k} must be a non-negative 64-bit int")
    if rec is not None:
        setattr(rec, field, v)
    return v


def _d_str(d, k):
    if k not in d:
        raise KeyError(f"sparse descriptor: {k} is missing")
    return _call.key(d[k], k)


def _dims(o, what):
    t = _call.seq(o, what)
    if not 1 <= len(t) <= _NDIM:
        raise ValueError(f"{what} must have 1..{_NDIM} dimensions, not {len(t)}")
    for i, x in enumerate(t):
        if not isinstance(x, int) or x < 0 or x > _call.U64_MAX:
            raise ValueError(f"{what}[{i}] must be a non-negative int")
    return list(t)


def _desc_of(d):
    """The ferry_sparse_desc of the dict ferry.sparse builds: tensor_id, shape,
    base_generation, delta_generation, placement_kind ("owner"|"replicate"),
    placement_axis, placement_owner, tile (None: chosen), apply, index_dtype,
    value_dtype, nnz."""
    if not isinstance(d, dict):
        raise TypeError(f"descriptor must be a dict, not {type(d).__name__}")
    out = ffi.new("ferry_sparse_desc *")
    _call.copy_str(out, "tensor_id", _d_str(d, "tensor_id"), "tensor_id")
    _d_u64(d, "base_generation", out, "base_generation")
    _d_u64(d, "delta_generation", out, "delta_generation")
    kind = _d_str(d, "placement_kind")
    if len(kind) >= 16:
        raise ValueError("placement_kind is longer than 15 bytes")
    _call.copy_str(out.placement, "axis", _d_str(d, "placement_axis"), "placement_axis")
    owner = _d_u64(d, "placement_owner", None, None, opt=True) or 0
    apply = _d_str(d, "apply")
    if len(apply) >= 16:
        raise ValueError("apply is longer than 15 bytes")
    if apply.decode() not in _APPLY:
        raise ValueError(f'apply must be "scatter_add" or "scatter_set", not "{apply.decode()[:40]}"')
    out.apply = _APPLY[apply.decode()]
    _call.copy_str(out, "index_dtype", _d_str(d, "index_dtype"), "index_dtype")
    _call.copy_str(out, "value_dtype", _d_str(d, "value_dtype"), "value_dtype")
    _d_u64(d, "nnz", out, "nnz", opt=True)
    if kind == b"owner":
        out.placement.kind = lib.FERRY_SPARSE_OWNER
    elif kind == b"replicate":
        out.placement.kind = lib.FERRY_SPARSE_REPLICATE
    else:
        raise ValueError(f'placement kind must be "owner" or "replicate", not "{kind.decode()}"')
    if owner > _U32:
        raise ValueError("placement owner must fit in 32 bits")
    out.placement.owner = owner
    if "shape" not in d:
        raise KeyError("sparse descriptor: shape is missing")
    shape = _dims(d["shape"], "global_shape")
    out.ndim, out.shape[0:len(shape)] = len(shape), shape
    tile = d.get("tile")
    if tile is not None:
        tile = _dims(tile, "tile_shape")
        if len(tile) != len(shape):
            raise ValueError(f"tile_shape has {len(tile)} dimensions, the tensor {len(shape)}")
        out.tile[0:len(tile)] = tile
    return out


def _desc_dict(d):
    nd = min(d.ndim, _NDIM)
    return {"tensor_id": _call.str_of(d.tensor_id), "shape": tuple(d.shape[0:nd]),
            "base_generation": d.base_generation, "delta_generation": d.delta_generation,
            "placement": {"kind": "owner" if d.placement.kind == lib.FERRY_SPARSE_OWNER else "replicate",
                          "axis": _call.str_of(d.placement.axis), "owner": d.placement.owner},
            "tile": tuple(d.tile[0:nd]),
            "apply": "scatter_set" if d.apply == lib.FERRY_SPARSE_SCATTER_SET else "scatter_add",
            "index_dtype": ffi.string(d.index_dtype).decode(), "value_dtype": ffi.string(d.value_dtype).decode(),
            "nnz": d.nnz, "ntiles": d.ntiles}


def sparse_put(store, desc, indices, values, /):
    """sparse_put(store, desc, indices, values) -> (key, stored desc)"""
    if not isinstance(store, _ferry.Store):
        raise TypeError(f"expected a ferry.Store, not {type(store).__name__}")
    d = _desc_of(desc)
    tid, idt, vdt = _call.str_of(d.tensor_id), ffi.string(d.index_dtype), ffi.string(d.value_dtype)
    if idt not in (b"i32", b"i64") or vdt not in (b"f32", b"bf16", b"f16"):
        raise ValueError(f"put_sparse_object {tid}: index dtype {idt.decode()} (i32 or i64) or value dtype "
                         f"{vdt.decode()} (f32, bf16 or f16) not supported")
    isz, vsz = lib.ferry_dtype_size(idt), lib.ferry_dtype_size(vdt)
    ip, ilen = _call.source(indices, "put_sparse_object: indices")
    vp, vlen = _call.source(values, "put_sparse_object: values")
    need_i, need_v = d.nnz * d.ndim * isz, d.nnz * vsz
    if ilen != need_i or vlen != need_v:
        raise ValueError(f"put_sparse_object {tid}: {d.nnz} entries of {d.ndim} dimensions need {need_i} index bytes "
                         f"and {need_v} value bytes; the buffers hold {ilen} and {vlen}")
    stored, key = ffi.new("ferry_sparse_desc *"), ffi.new("char[600]")
    _checked(store, lib.ferry_put_sparse_object, d, ip, vp, stored, key, 600)
    return _call.str_of(key), _desc_dict(stored)


def sparse_admit(store, desc, rank, /):
    """sparse_admit(store, desc, rank) -> admitted"""
    d, admitted = _desc_of(desc), ffi.new("bool *")
    _checked(store, lib.ferry_sparse_admit, d, _call.uint(rank, "rank", 0, _U32), admitted)
    return bool(admitted[0])


# ---- the sparse read (the store's reader: its index cache lasts) -----------------------------

def _target_of(o, i, t):
    """(tensor_id, node, axis_index, offset, shape) into the ferry_sparse_target t."""
    if not (isinstance(o, tuple) and len(o) == 5 and isinstance(o[0], str) and isinstance(o[1], int)
            and isinstance(o[2], int) and 0 <= o[1] <= _U32 and 0 <= o[2] <= _U32):
        raise TypeError(f"targets[{i}] must be (tensor_id, node, axis_index, offset, shape)")
    _call.copy_str(t, "tensor_id", _call.key(o[0], "tensor_id"), "tensor_id")
    off, shape = _dims(o[3], f"targets[{i}].offset"), _dims(o[4], f"targets[{i}].shape")
    if len(off) != len(shape):
        raise ValueError(f"targets[{i}]: offset has {len(off)} dimensions, shape {len(shape)}")
    t.node, t.axis_index, t.ndim = o[1], o[2], len(shape)
    t.offset[0:len(off)], t.shape[0:len(shape)] = off, shape


def _result_dict(r):
    nd = min(r.ndim, _NDIM)
    vdt = ffi.string(r.value_dtype)
    return {"target": r.target, "tensor_id": _call.str_of(r.tensor_id), "shape": tuple(r.shape[0:nd]),
            "base_generation": r.base_generation, "delta_generation": r.delta_generation,
            "apply": "scatter_set" if r.apply == lib.FERRY_SPARSE_SCATTER_SET else "scatter_add",
            "value_dtype": vdt.decode(), "nnz": r.nnz,
            "indices": bytearray(ffi.buffer(r.indices, r.nnz * nd * 8)) if r.nnz else bytearray(),
            "values": bytearray(ffi.buffer(r.values, r.nnz * lib.ferry_dtype_size(vdt))) if r.nnz else bytearray()}


def sparse_read(store, keys, targets, publish_prefix, /):
    """sparse_read(store, keys, [(tensor_id, node, axis_index, offset, shape)], publish_prefix) -> ([result dict], counters dict)"""
    if not isinstance(store, _ferry.Store):
        raise TypeError(f"expected a ferry.Store, not {type(store).__name__}")
    rd = ffi.cast("ferry_sparse_reader *", store._sparse_reader())   # opened at the first call, closed with the store
    prefix = ffi.NULL if publish_prefix is None else _call.key(publish_prefix, "publish_prefix")
    ks = [ffi.new("char[]", _call.key(k, "keys[i]")) for k in _call.seq(keys, "keys")]
    ts = _call.seq(targets, "targets")
    tg = ffi.new("ferry_sparse_target[]", len(ts) or 1)
    for i, o in enumerate(ts):
        _target_of(o, i, tg[i])
    res, nres, st = ffi.new("ferry_sparse_result **"), ffi.new("size_t *"), ffi.new("ferry_sparse_stats *")
    try:
        _checked(store, lambda h, *a: lib.ferry_sparse_reader_read(rd, *a), ffi.new("char *[]", ks + [ffi.NULL]),
                 len(ks), tg, len(ts), prefix, res, nres, st)
        return [_result_dict(res[0][i]) for i in range(nres[0])], _call.counters(st)
    finally:
        lib.ferry_sparse_results_free(res[0], nres[0])


# ---- publishing: the config, the stats, the streaming publish --------------------------------

def publisher_config(fn, model, out_dtype, rank, world, segment, keep, timeout_ms):
    """A ferry_publisher_config of the arguments every publish call takes
    (rank_node left NULL); ValueError for a name too long."""
    cfg = ffi.new("ferry_publisher_config *")
    _call.copy_str(cfg, "model", _call.text(fn, 2, model), "model")
    _call.copy_str(cfg, "out_dtype", _call.text(fn, 6, out_dtype), "out_dtype")
    cfg.rank, cfg.world = _call.uint(rank, "rank", 0, _U32), _call.uint(world, "world", 0, _U32)
    cfg.segment, cfg.keep = _call.uint(segment, "segment"), _call.uint(keep, "keep", 0, _U32)
    cfg.timeout_ms = _call.uint(timeout_ms, "timeout_ms")
    return cfg


def tensor_of(t, name, v, dtype):
    """The ferry_weight_tensor t of a checked view v (_ferry._view) of a
    tensor's data in dtype; what t points at, held by the caller."""
    n = ffi.new("char[]", _call.key(name, "tensor name"))
    d = ffi.new("char[]", _call.key(dtype, "dtype"))
    if lib.ferry_dtype_size(d) != v.itemsize or v.ndim > lib.FERRY_MAX_DIMS:
        return None
    ndim, shape = v.ndim, list(v.shape)
    data, _ = _call.exported(v)
    t.name, t.dtype, t.ndim, t.data = n, d, ndim, data
    t.shape[0:ndim] = shape
    return n, d, data


class _Stream:
    """A streaming publish of one generation (ferry_publish_stream_*).
    Dropped before its end, the attempt fails on every rank."""

    __slots__ = ("ps", "store", "gen")

    def __init__(self, ps, store, gen):
        self.ps, self.store, self.gen = ps, store, gen

    def live(self):
        if self.ps is None:
            raise ValueError("the publish stream has ended")
        return self.ps

    def __del__(self):
        if self.ps is not None:
            lib.ferry_publish_stream_abort(self.ps, b"the stream was dropped before its end")
            lib.ferry_publish_stream_end(self.ps, ffi.NULL, ffi.NULL)
            self.ps = None


def weights_stream_begin(store, model, rank, world, out_dtype, segment, keep, timeout_ms, generation, /):
    """weights_stream_begin(...) -> stream: a streaming publish of generation (ferry_publish_stream_begin)"""
    cfg = publisher_config("weights_stream_begin", model, out_dtype, rank, world, segment, keep, timeout_ms)
    gen, out = _call.uint(generation, "generation"), ffi.new("ferry_publish_stream **")
    _checked(store, lib.ferry_publish_stream_begin, cfg, gen, out)
    return _Stream(out[0], store, gen)


def weights_stream_add(stream, name, buffer, dtype, /):
    """weights_stream_add(stream, name, buffer, dtype): one tensor, stored now or by another rank"""
    ps = stream.live()
    v = _ferry._view(buffer, f"tensor {_call.text('weights_stream_add', 2, name).decode()[:200]}", False)
    t = ffi.new("ferry_weight_tensor *")
    held = tensor_of(t, name, v, dtype)
    if held is None:
        raise ValueError(f"tensor {name}: dtype {dtype} does not match the array's {v.itemsize}-byte elements "
                         f"(or more than {lib.FERRY_MAX_DIMS} dims)")
    _checked(stream.store, lambda h, *a: lib.ferry_publish_stream_add(ps, *a), t)


def weights_stream_abort(stream, why, /):
    """weights_stream_abort(stream, why): this rank cannot go on; the end fails on every rank"""
    lib.ferry_publish_stream_abort(stream.live(), _call.text("weights_stream_abort", 2, why))


def weights_stream_held(stream, /):
    """weights_stream_held(stream) -> int: the most bytes this rank held at once"""
    return lib.ferry_publish_stream_held(stream.live())


def weights_stream_end(stream, /):
    """weights_stream_end(stream) -> stats: announce (or fail on every rank)"""
    ps, stream.ps = stream.live(), None   # ended, whatever the outcome
    st = ffi.new("ferry_publish_stats *")
    _checked(stream.store, lambda h, *a: lib.ferry_publish_stream_end(ps, *a), st)
    return {"generation": stream.gen, **_call.counters(st)}
