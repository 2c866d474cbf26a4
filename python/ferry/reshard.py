"""Reshard planning: placement manifests, layouts, model presets, plans.

A pure, address-free planner (see docs/reshard.md and docs/manifest.md):
give it what a source holds and what each target fragment needs, and it
returns the overlap regions and the lowered byte runs.

    from ferry import reshard
    model = reshard.preset("qwen3-8b")
    src = reshard.build(model, "fsdp:8")
    dst = reshard.build(model, "tp:4,dp:2")
    plan = reshard.Plan(src, dst)
    for run in plan.runs(dst_rank=0):
        ...

Failures raise ``ferry.Error`` with ``.code`` (a negative FERRY_E* code)
and a message naming the tensor and fragment.

Execution (docs/exec.md, "Python"): bind each side's fragments to live
arrays with :class:`Binding`, then move the bytes between engines with
:func:`execute` (or :func:`attest` and :class:`Executor` for repeated runs).
"""

import operator
import os
from collections import namedtuple

from . import _call
from ._binding import ffi, lib
from ._ferry import Error
from ._ferry import Binding, AttestedPlan, Executor, Engine

__all__ = [
    "Error", "Manifest", "Model", "Plan", "PlanCache", "Region", "Run", "Loop",
    "preset", "presets", "build", "parse_layout", "dtype_size",
    "LAYER_FIRST", "LAYER_LAST",
    "Binding", "AttestedPlan", "Executor", "Engine", "attest", "execute", "peers_of",
]

LAYER_FIRST = -1  # embedding side (first pipeline stage)
LAYER_LAST = -2   # final norm and lm_head (last pipeline stage)

Region = namedtuple(
    "Region", "tensor src_tensor src_fragment dst_fragment src_rank dst_rank offset shape bytes")
Region.__doc__ = "The box of a tensor a target fragment takes from a source fragment (global coordinates)."

Loop = namedtuple("Loop", "count src_stride dst_stride")

Run = namedtuple(
    "Run", "tensor src_fragment dst_fragment src_rank dst_rank src_object src_offset dst_offset len loops bytes")
Run.__doc__ = ("len contiguous bytes, repeated over nested loops (outermost first). Source offsets are into "
               "src_object when it is set, else into the source fragment's buffer.")

# ---- manifests, models, layouts, plans over the cffi binding ---------------------------

_U32 = 2**32 - 1
_NDIM = lib.FERRY_MAX_DIMS
_ROLES = ("replicated", "column", "row", "vocab")


def _u32(value, what):
    return _call.uint(value, what, 0, _U32)


def _dims(obj, what):
    """None, or the list of at most FERRY_MAX_DIMS non-negative ints of a sequence."""
    if obj is None:
        return None
    try:
        seq = list(obj)
    except TypeError:
        raise TypeError(f"{what}: a sequence of ints") from None
    if len(seq) > _NDIM:
        raise ValueError(f"{what}: at most {_NDIM} dims")
    return [_call.uint(v, what) for v in seq]


def _set_dims(array, dims):
    if dims:
        array[0:len(dims)] = dims


def _hex(digest):
    out = ffi.new("char[33]")
    lib.ferry_digest_hex(digest, out)
    return ffi.string(out).decode()


def _check(rc, fe=None, msg=None):
    if rc < 0:
        raise _call.error(rc, fe, msg)
    return rc


def _index(value, hi, what):
    i = operator.index(value)
    if i < 0 or i > hi:
        raise IndexError(what)
    return i


def _address(cdata):
    return int(ffi.cast("uintptr_t", cdata))


class Manifest:
    """Manifest(ranks, nodes=None, gpus_per_node=8): a placement manifest"""

    __slots__ = ("_m", "__weakref__")

    def __init__(self, ranks, nodes=None, gpus_per_node=8):
        ranks, gpn = _u32(ranks, "ranks"), _u32(gpus_per_node, "gpus_per_node")
        nv = ffi.NULL
        if nodes is not None:
            try:
                nodes = list(nodes)
            except TypeError:
                raise TypeError("nodes: a sequence of ints") from None
            if len(nodes) != ranks:
                raise ValueError("nodes: one node per rank")
            if any(operator.index(n) < 0 or n > _U32 for n in nodes):
                raise ValueError("nodes: node numbers fit 32 bits")
            nv = ffi.new("uint32_t[]", nodes)
        out = ffi.new("ferry_manifest **")
        _check(lib.ferry_manifest_create(ranks, nv, gpn, out), msg=None if ranks else "a manifest needs at least one rank")
        self._m = ffi.gc(out[0], lib.ferry_manifest_close)

    @classmethod
    def _wrap(cls, out):
        self = cls.__new__(cls)
        self._m = ffi.gc(out[0], lib.ferry_manifest_close)
        return self

    @property
    def _manifest_address(self):
        return _address(self._m)   # for the calls still in the C extension (fp_manifest_of)

    @property
    def ranks(self):
        """ranks in the topology"""
        return lib.ferry_manifest_rank_count(self._m)

    @property
    def tensor_count(self):
        """tensors"""
        return lib.ferry_manifest_tensor_count(self._m)

    @property
    def fragment_count(self):
        """fragments (empty split pieces excluded)"""
        return lib.ferry_manifest_fragment_count(self._m)

    def add_tensor(self, /, name, dtype, shape):
        """add_tensor(name, dtype, shape) -> index"""
        t, fe = ffi.new("ferry_tensor_desc *"), _call.new_error()
        keep = (ffi.new("char[]", _call.text("add_tensor", 1, name)), ffi.new("char[]", _call.text("add_tensor", 2, dtype)))
        t.name, t.dtype = keep
        t.itemsize = lib.ferry_dtype_size(keep[1])
        d = _dims(shape, "shape") or []
        t.ndim = len(d)
        _set_dims(t.shape, d)
        return _check(lib.ferry_manifest_add_tensor(self._m, t, fe), fe)

    def add_fragment(self, /, tensor, rank, offset=None, shape=None, replica=0, strides=None, storage_offset=0,
                     object=None, object_offset=0):
        """add_fragment(tensor, rank, offset=None, shape=None, replica=0, strides=None, storage_offset=0, object=None, object_offset=0)"""
        f, fe = ffi.new("ferry_fragment *"), _call.new_error()
        f.tensor, f.rank, f.replica = _u32(tensor, "tensor"), _u32(rank, "rank"), _u32(replica, "replica")
        f.storage_offset, f.object_offset = _call.uint(storage_offset, "storage_offset"), _call.uint(object_offset, "object_offset")
        obj = ffi.NULL if object is None else ffi.new("char[]", _call.text("add_fragment", 8, object))
        f.object = obj
        off, shp, st = _dims(offset, "offset"), _dims(shape, "shape"), _dims(strides, "strides")
        _set_dims(f.offset, off)
        _set_dims(f.shape, shp)
        _set_dims(f.strides, st)
        f.has_strides = st is not None
        t = ffi.new("ferry_tensor_desc *")
        if lib.ferry_manifest_tensor(self._m, f.tensor, t) == 0:
            if any(d is not None and len(d) != t.ndim for d in (off, shp, st)):
                raise _call.error(lib.FERRY_EINVAL, msg="offset, shape and strides need one value per dim of the tensor")
            if shp is None:   # no shape: the rest of the tensor from offset
                for d in range(t.ndim):
                    f.shape[d] = t.shape[d] - f.offset[d] if f.offset[d] < t.shape[d] else 0
        _check(lib.ferry_manifest_add_fragment(self._m, f, fe), fe)

    def add_split(self, /, tensor, rank=0, parts=None, rank_stride=None, offset=None, shape=None, replicas=1,
                  replica_stride=0, replica=0):
        """add_split(tensor, rank=0, parts=None, rank_stride=None, offset=None, shape=None, replicas=1, replica_stride=0, replica=0)"""
        s, fe = ffi.new("ferry_split *"), _call.new_error()
        s.tensor, s.rank, s.replicas = _u32(tensor, "tensor"), _u32(rank, "rank"), _u32(replicas, "replicas")
        s.replica_stride, s.replica = _u32(replica_stride, "replica_stride"), _u32(replica, "replica")
        p, r = _dims(parts, "parts"), _dims(rank_stride, "rank_stride")
        off, shp = _dims(offset, "offset"), _dims(shape, "shape")
        if (off is None) != (shp is None):
            raise _call.error(lib.FERRY_EINVAL, msg="offset and shape come together")
        s.whole = off is None
        if any(v > _U32 for v in (p or []) + (r or [])):
            raise _call.error(lib.FERRY_EINVAL, msg="parts and rank_stride fit 32 bits")
        for array, d in ((s.parts, p), (s.rank_stride, r), (s.offset, off), (s.shape, shp)):
            _set_dims(array, d)
        _check(lib.ferry_manifest_add_split(self._m, s, fe), fe)

    def quantize(self, /, dtype=None, include=None, exclude=None, scale_name=None, block=(0, 0), scale_format="f32"):
        """quantize(dtype=None, include=None, exclude=None, scale_name=None, block=(0, 0), scale_format='f32') -> Manifest: the tensors the rules pick stored as FP8 in blocks, with their scale tensors (None and 0: the defaults: f8e4m3, every linear weight, '%s_scale_inv', 128 x 128)"""
        r = ffi.new("ferry_quant_rules *")
        lib.ferry_quant_rules_init(r)
        keep = []
        for i, (field, v) in enumerate((("dtype", dtype), ("include", include), ("exclude", exclude),
                                         ("scale_name", scale_name))):
            c = ffi.NULL if v is None else ffi.new("char[]", _call.text("quantize", i + 1, v))
            keep.append(c)
            setattr(r, field, c)   # NULL: the rules' default
        b0, b1 = block
        r.fp8.block_rows, r.fp8.block_cols = _u32(b0, "block"), _u32(b1, "block")
        if scale_format == "ue8m0":
            r.fp8.scale_format = lib.FERRY_FP8_SCALE_UE8M0
        elif scale_format != "f32":
            raise ValueError(f"scale_format must be 'f32' or 'ue8m0', not '{scale_format}'")
        out, fe = ffi.new("ferry_manifest **"), _call.new_error()
        _check(lib.ferry_manifest_quantize(self._m, r, out, fe), fe)
        return Manifest._wrap(out)

    def tensor_quant(self, i, /):
        """tensor_quant(i) -> None, or {role, partner, dtype, block, scale_format}"""
        q = ffi.new("ferry_tensor_quant *")
        if lib.ferry_manifest_tensor_quant(self._m, _index(i, _U32, "tensor index out of range"), q) < 0:
            raise IndexError("tensor index out of range")
        if q.role == lib.FERRY_QUANT_NONE:
            return None
        return {"role": "weight" if q.role == lib.FERRY_QUANT_WEIGHT else "scale", "partner": q.partner,
                "dtype": ffi.string(q.fp8_dtype).decode(), "block": (q.fp8.block_rows, q.fp8.block_cols),
                "scale_format": "ue8m0" if q.fp8.scale_format == lib.FERRY_FP8_SCALE_UE8M0 else "f32"}

    def validate(self, /):
        """whole-manifest checks"""
        fe = _call.new_error()
        _check(lib.ferry_manifest_validate(self._m, fe), fe)

    def _desc(self, i):
        t = ffi.new("ferry_tensor_desc *")
        if lib.ferry_manifest_tensor(self._m, _index(i, _U32, "tensor index out of range"), t) < 0:
            raise IndexError("tensor index out of range")
        return t

    def tensor(self, i, /):
        """tensor(i) -> (name, dtype, itemsize, shape)"""
        t = self._desc(i)
        return _call.str_of(t.name), _call.str_of(t.dtype), t.itemsize, tuple(t.shape[0:t.ndim])

    def find_tensor(self, name, /):
        """find_tensor(name) -> index (KeyError)"""
        rc = lib.ferry_manifest_find_tensor(self._m, _call.text("find_tensor", 1, name))
        if rc < 0:
            raise KeyError(name)
        return rc

    def fragment(self, id, /):
        """fragment(id) -> dict"""
        f = ffi.new("ferry_fragment *")
        if lib.ferry_manifest_fragment(self._m, _index(id, _call.U64_MAX, "fragment id out of range"), f) < 0:
            raise IndexError("fragment id out of range")
        n = self._desc(f.tensor).ndim
        return {"tensor": f.tensor, "rank": f.rank, "node": f.node, "replica": f.replica,
                "offset": tuple(f.offset[0:n]), "shape": tuple(f.shape[0:n]),
                "strides": tuple(f.strides[0:n]) if f.has_strides else None, "storage_offset": f.storage_offset,
                "object": _call.str_of(f.object) if f.object else None, "object_offset": f.object_offset}

    def rank_bytes(self, rank, /):
        """rank_bytes(rank) -> bytes the rank stores"""
        b = ffi.new("uint64_t *")
        if lib.ferry_manifest_rank_bytes(self._m, _index(rank, _U32, "rank out of range"), b) < 0:
            raise IndexError("rank out of range")
        return b[0]

    def node_of(self, rank, /):
        """node_of(rank) -> node"""
        r = _index(rank, lib.ferry_manifest_rank_count(self._m) - 1, "rank out of range")
        return lib.ferry_manifest_node_of(self._m, r)

    def digest(self, /):
        """XXH3-128 hex of the tensors and fragments"""
        d = ffi.new("uint8_t[16]")
        _check(lib.ferry_manifest_digest(self._m, d))
        return _hex(d)

    def topology_digest(self, /):
        """XXH3-128 hex of the topology"""
        d = ffi.new("uint8_t[16]")
        _check(lib.ferry_manifest_topology_digest(self._m, d))
        return _hex(d)

    def to_json(self, /):
        """the JSON text (docs/manifest.md)"""
        text = lib.ferry_manifest_to_json(self._m)
        if text == ffi.NULL:
            raise MemoryError()
        try:
            return ffi.string(text).decode()
        finally:
            lib.free(text)

    def save(self, path, /):
        """save(path): write the JSON atomically"""
        fe = _call.new_error()
        _check(lib.ferry_manifest_save(self._m, os.fsencode(path), fe), fe)

    @classmethod
    def from_json(cls, text, /):
        """Manifest.from_json(text)"""
        b = text.encode() if isinstance(text, str) else bytes(text)
        out, fe = ffi.new("ferry_manifest **"), _call.new_error()
        _check(lib.ferry_manifest_from_json(b, len(b), out, fe), fe)
        return cls._wrap(out)

    @classmethod
    def load(cls, path, /):
        """Manifest.load(path)"""
        out, fe = ffi.new("ferry_manifest **"), _call.new_error()
        _check(lib.ferry_manifest_load(os.fsencode(path), out, fe), fe)
        return cls._wrap(out)


class Model:
    """Model(name, layers, experts=0): a tensor list with parallelism roles"""

    __slots__ = ("_m", "__weakref__")

    def __init__(self, name, layers, experts=0):
        out = ffi.new("ferry_model **")
        _check(lib.ferry_model_create(_call.text("Model", 1, name), _u32(layers, "layers"), _u32(experts, "experts"), out))
        self._m = ffi.gc(out[0], lib.ferry_model_free)

    @property
    def name(self):
        """name"""
        return ffi.string(lib.ferry_model_name(self._m)).decode()

    @property
    def layers(self):
        """layers"""
        return lib.ferry_model_layers(self._m)

    @property
    def experts(self):
        """routed experts"""
        return lib.ferry_model_experts(self._m)

    @property
    def param_count(self):
        """parameters"""
        return lib.ferry_model_param_count(self._m)

    @property
    def bytes(self):
        """bytes of all tensors"""
        return lib.ferry_model_bytes(self._m)

    @property
    def tensor_count(self):
        """tensors"""
        return lib.ferry_model_tensor_count(self._m)

    def add_tensor(self, /, name, dtype, shape, role, layer, expert=-1):
        """add_tensor(name, dtype, shape, role, layer, expert=-1); layer -1: embedding side, -2: head side"""
        t, fe = ffi.new("ferry_model_tensor *"), _call.new_error()
        keep = (ffi.new("char[]", _call.text("add_tensor", 1, name)), ffi.new("char[]", _call.text("add_tensor", 2, dtype)))
        t.desc.name, t.desc.dtype = keep
        t.desc.itemsize = lib.ferry_dtype_size(keep[1])
        t.layer, t.expert = layer, expert
        if role not in _ROLES:
            raise _call.error(lib.FERRY_EINVAL, msg="role: replicated, column, row or vocab")
        t.role = _ROLES.index(role)
        d = _dims(shape, "shape") or []
        t.desc.ndim = len(d)
        _set_dims(t.desc.shape, d)
        _check(lib.ferry_model_add_tensor(self._m, t, fe), fe)

    def tensors(self, /):
        """[(name, dtype, shape, role, layer, expert)]"""
        t, out = ffi.new("ferry_model_tensor *"), []
        for i in range(lib.ferry_model_tensor_count(self._m)):
            lib.ferry_model_tensor_at(self._m, i, t)
            d = t.desc
            out.append((_call.str_of(d.name), _call.str_of(d.dtype), tuple(d.shape[0:d.ndim]), _ROLES[t.role],
                        t.layer, t.expert))
        return out


def preset(name, /):
    """preset(name) -> Model"""
    out, fe = ffi.new("ferry_model **"), _call.new_error()
    _check(lib.ferry_model_preset(_call.text("preset", 1, name), out, fe), fe)
    m = Model.__new__(Model)
    m._m = ffi.gc(out[0], lib.ferry_model_free)
    return m


def presets():
    """names of the model presets"""
    names = []
    while (p := lib.ferry_model_preset_name(len(names))) != ffi.NULL:
        names.append(ffi.string(p).decode())
    return names


def _layout(text, gpus_per_node=0):
    layout, fe = ffi.new("ferry_layout *"), _call.new_error()
    _check(lib.ferry_layout_parse(_call.text("parse_layout", 1, text), layout, fe), fe)
    if gpus_per_node:
        layout.gpus_per_node = gpus_per_node
    return layout


def parse_layout(text, /):
    """parse_layout(text) -> dict"""
    layout = _layout(text)
    canon = ffi.new("char[128]")
    lib.ferry_layout_format(layout, canon, 128)
    return {"fsdp": layout.fsdp, "tp": layout.tp, "dp": layout.dp, "ep": layout.ep, "pp": layout.pp,
            "gpus_per_node": layout.gpus_per_node, "first_node": layout.first_node,
            "ranks": lib.ferry_layout_ranks(layout), "text": ffi.string(canon).decode()}


def build(model, layout, gpus_per_node=0):
    """build(model, layout, gpus_per_node=0) -> Manifest of the model under the layout"""
    if not isinstance(model, Model):
        raise TypeError(f"build() argument 1 must be ferry.reshard.Model, not {type(model).__name__}")
    lay = _layout(layout, _u32(gpus_per_node, "gpus_per_node"))
    out, fe = ffi.new("ferry_manifest **"), _call.new_error()
    _check(lib.ferry_layout_build(model._m, lay, out, fe), fe)
    return Manifest._wrap(out)


def dtype_size(name, /):
    """dtype_size(name) -> bytes per element (0: unknown)"""
    return lib.ferry_dtype_size(_call.text("dtype_size", 1, name))


def _manifest(obj):
    if not isinstance(obj, Manifest):
        raise TypeError("expected a Manifest")
    return obj._m


_LIMITS = ("max_fragments", "max_regions", "max_overlaps")


def _options(limits):
    if set(limits) - set(_LIMITS):
        raise TypeError("options: " + ", ".join(_LIMITS))
    o = ffi.new("ferry_plan_options *")
    for k, v in limits.items():
        setattr(o, k, _call.uint(v, k))
    return o


class Plan:
    """Plan(src, dst, max_fragments=0, max_regions=0, max_overlaps=0).

    Freezes both manifests and keeps them alive. Limits of 0 take the
    library defaults.
    """

    __slots__ = ("_p", "__weakref__")

    def __init__(self, src, dst, **limits):
        out, fe = ffi.new("ferry_plan **"), _call.new_error()
        _check(lib.ferry_plan_create(_manifest(src), _manifest(dst), _options(limits), out, fe), fe)
        self._p = ffi.gc(out[0], lib.ferry_plan_free)

    @classmethod
    def _wrap(cls, out):
        self = cls.__new__(cls)
        self._p = ffi.gc(out[0], lib.ferry_plan_free)
        return self

    @property
    def _plan_address(self):
        return _address(self._p)   # for the calls still in the C extension (fp_plan_of)

    def stats(self):
        """tensors, fragments, regions, runs, bytes, max/mean bytes per target rank, plan_s, digests."""
        s = ffi.new("ferry_plan_stats *")
        lib.ferry_plan_stats_get(self._p, s)
        return {k: _hex(v) if k.endswith("_digest") else v for k, v in _call.counters(s).items()}

    def _iter(self, tensor, src_rank, dst_rank):
        f = ffi.new("ferry_plan_filter *", (tensor, src_rank, dst_rank))
        out = ffi.new("ferry_plan_iter **")
        _check(lib.ferry_plan_iter_open(self._p, f, out))
        return ffi.gc(out[0], lib.ferry_plan_iter_close)

    def regions(self, tensor=-1, src_rank=-1, dst_rank=-1):
        """Iterate Region tuples in plan order; -1 means any."""
        it, r = self._iter(tensor, src_rank, dst_rank), ffi.new("ferry_region *")
        while _check(lib.ferry_plan_iter_next_region(it, r)):
            yield Region(r.tensor, r.src_tensor, r.src_fragment, r.dst_fragment, r.src_rank, r.dst_rank,
                         tuple(r.offset[0:r.ndim]), tuple(r.shape[0:r.ndim]), r.bytes)

    def runs(self, tensor=-1, src_rank=-1, dst_rank=-1):
        """Iterate Run tuples in plan order; -1 means any."""
        it, r = self._iter(tensor, src_rank, dst_rank), ffi.new("ferry_run *")
        while _check(lib.ferry_plan_iter_next_run(it, r)):
            loops = tuple(Loop(r.count[i], r.src_stride[i], r.dst_stride[i]) for i in range(r.nouter))
            yield Run(r.tensor, r.src_fragment, r.dst_fragment, r.src_rank, r.dst_rank,
                      _call.str_of(r.src_object) if r.src_object else None, r.src_offset, r.dst_offset, r.len,
                      loops, r.bytes)

    def __repr__(self):
        s = self.stats()
        return f"<reshard.Plan {s['tensors']} tensors, {s['regions']} regions, {s['runs']} runs, {s['bytes']} bytes>"


class PlanCache:
    """PlanCache(capacity=16): plans keyed by (source, target, topology) digests."""

    __slots__ = ("_c", "__weakref__")

    def __init__(self, capacity=16):
        out = ffi.new("ferry_plan_cache **")
        rc = lib.ferry_plan_cache_create(capacity, out) if operator.index(capacity) > 0 else lib.FERRY_EINVAL
        _check(rc, msg="capacity must be positive")
        self._c = ffi.gc(out[0], lib.ferry_plan_cache_free)

    def get(self, src, dst, **limits):
        """Return (Plan, hit): a hit returns the cached plan without planning again."""
        out, hit, fe = ffi.new("ferry_plan **"), ffi.new("bool *"), _call.new_error()
        _check(lib.ferry_plan_cache_get(self._c, _manifest(src), _manifest(dst), _options(limits), out, hit, fe), fe)
        return Plan._wrap(out), bool(hit[0])

    def __len__(self):
        return lib.ferry_plan_cache_size(self._c)


# ---- execution -------------------------------------------------------------------------

def attest(plan, src, dst, generation=None):
    """AttestedPlan binding ``plan`` to both bindings' digests and ``generation``
    (default: the source binding's). StaleError when a binding is at another
    generation; Error (EINVAL) when it was validated against another placement."""
    if generation is None:
        generation = src.generation
    return AttestedPlan(plan, src, dst, generation)


def peers_of(binding, workers=None):
    """{worker: desc} from the entries of ``binding`` (the side a process
    reaches remotely): an entry's ``desc`` is the region descriptor covering
    its memory (Engine.register), one per worker; entries without one are
    skipped. ``workers`` limits the result."""
    peers = {}
    for e in binding.entries():
        w = e["worker"]
        if workers is not None and w not in workers:
            continue
        if not e["desc"]:
            continue   # not reachable from here; a run that needs it fails with NotFoundError
        if peers.setdefault(w, e["desc"]) != e["desc"]:
            raise ValueError(f"worker {w} has entries with different descriptors: one region per worker, "
                             "or pass peers=")
    return peers


def execute(plan, src_binding, dst_binding, mode="sink", *, engine, workers=None, peers=None, generation=None,
            window=8, notify_tag=0, guards=None, timeout_ms=60000, max_ops=0, max_bytes=0):
    """Run ``plan`` (a Plan or an AttestedPlan) for this process's workers and
    return the result dict: state ("COMPLETED"), error, bytes, ops, batches,
    bytes_done, pending, quarantined.

    mode: "sink" (this process holds source workers and WRITEs into target
    memory, then NOTIFY(notify_tag, generation) per target peer when
    notify_tag != 0) or "reader" (this process holds target workers and
    READs source memory). ``engine`` is this process's Engine; ``workers``
    the initiating workers it runs (default: every worker of the initiating
    binding); ``peers`` {remote worker: region descriptor bytes} (default:
    the ``desc`` of the remote binding's entries, see peers_of), imported
    into ``engine``. ``guards``: objects with ``.id``, ``.acquire()`` and
    ``.release()`` (a raise or a False return is a failure), acquired before
    any byte moves and released after. The run releases the GIL.

    Raises an Error subclass (StaleError for a changed or stale binding,
    NotFoundError for a selector naming no planned worker, ...) when the run
    does not complete; ``e.result`` is then the result dict (state ABORTED,
    FAILED_DRAINED or UNKNOWN) when the run started.
    """
    if mode not in ("sink", "reader"):
        raise ValueError(f"mode: 'sink' or 'reader', not {mode!r}")
    local, remote = (src_binding, dst_binding) if mode == "sink" else (dst_binding, src_binding)
    if isinstance(plan, AttestedPlan):
        attested = plan
    else:
        attested = attest(plan, src_binding, dst_binding, generation)
    if workers is None:
        workers = sorted({e["worker"] for e in local.entries()})
    if peers is None:
        peers = peers_of(remote)
    x = Executor(engine, mode, list(workers), peers, window=window, timeout_ms=timeout_ms, notify_tag=notify_tag,
                 guards=guards, max_ops=max_ops, max_bytes=max_bytes)
    try:
        return x.run(attested, src_binding, dst_binding)
    finally:
        x.close()
