"""ferry.sparse: sparse COO weight deltas (docs/sparse.md, "Python").

- :func:`put_sparse_object` — one COO object per logical tensor update
  (global coordinates; indices ``int32``/``int64`` ``[nnz, ndim]``, values
  ``float32``, ``float16`` or bf16 held as ``uint16``), validated, sorted by
  tile and stored once; returns the key and the stored descriptor.
- :func:`sparse_admit` — for a weight several trainer ranks hold: exactly one
  rank per logical key is admitted to compute and put.
- :func:`read_sparse_objects` — target-local COO results of a batch of
  targets (:class:`Target` or dicts), each needed entry range read once per
  node; returns ``(results, counters)``.
- :func:`sparse_apply` — scatter a result into a dense numpy array behind
  the base-generation fence (:class:`ferry.ConflictError` when the array
  holds another generation; the array is then unchanged).

Everything that touches the store runs with the GIL released. Errors are
:class:`ferry.Error` subclasses (``ExistsError`` for a logical key already
stored, ``NotFoundError``, ``ConflictError`` for the fence) or
``ValueError``/``TypeError`` for arguments Python can already refuse.
"""

from dataclasses import dataclass

import numpy as np

from . import _ferry

__all__ = ["Target", "SparseResult", "put_sparse_object", "sparse_admit", "read_sparse_objects", "sparse_apply",
           "COUNTERS"]

# Every ferry_sparse_stats field, in the header's order.
COUNTERS = ("source_objects", "non_ep_source_object_count", "index_gets", "index_cache_hits", "unique_range_gets",
            "full_indices_values_get_count", "dedup_hits", "bytes_read", "entries_read", "entries_kept",
            "boundary_filtered", "plan_s", "read_s", "filter_s")

_VALUE_DTYPES = {"float32": "f32", "float16": "f16", "uint16": "bf16"}   # bf16 travels as raw 16-bit words
_NUMPY_OF = {"f32": np.float32, "f16": np.float16, "bf16": np.uint16}
_APPLY = ("scatter_add", "scatter_set")


@dataclass(frozen=True)
class Target:
    """A logical box of a tensor held on a node: global ``offset`` and local
    ``shape`` (one int per dimension) at index ``axis_index`` of the
    placement axis (e.g. its EP rank; OWNER objects reach only the matching
    index)."""
    tensor_id: str
    node: int
    axis_index: int
    offset: tuple
    shape: tuple


@dataclass
class SparseResult:
    """A target-local COO result: ``indices`` int64 ``[nnz, ndim]`` in the
    target's local coordinates, ``values`` ``[nnz]`` of ``value_dtype``
    (bf16 as ``uint16``). ``target`` indexes the targets passed in."""
    target: int
    tensor_id: str
    shape: tuple
    base_generation: int
    delta_generation: int
    apply: str
    value_dtype: str
    indices: np.ndarray
    values: np.ndarray

    @property
    def nnz(self):
        return int(self.values.shape[0])


def _placement(p):
    """("replicate", axis) or ("owner", axis, index) -> kind, axis, owner."""
    if isinstance(p, str) or not isinstance(p, (tuple, list)) or not p:
        raise TypeError(f"source_placement must be ('replicate', axis) or ('owner', axis, index), not {p!r}")
    kind = p[0]
    if kind == "replicate":
        if len(p) != 2:
            raise ValueError(f"source_placement {tuple(p)!r}: a REPLICATE placement is ('replicate', axis)")
        return "replicate", str(p[1]), 0
    if kind == "owner":
        if len(p) != 3 or not isinstance(p[2], (int, np.integer)) or p[2] < 0:
            raise ValueError(f"source_placement {tuple(p)!r}: an OWNER placement is ('owner', axis, index >= 0)")
        return "owner", str(p[1]), int(p[2])
    raise ValueError(f"source_placement kind must be 'replicate' or 'owner', not {kind!r}")


def _generation(g):
    if not isinstance(g, (tuple, list)) or len(g) != 2:
        raise TypeError(f"generation must be (base, delta), not {g!r}")
    base, delta = (int(x) for x in g)
    if base < 0 or delta < 0:
        raise ValueError(f"generation {tuple(g)!r}: generations are non-negative")
    return base, delta


def _dims(v, what):
    try:
        t = tuple(int(x) for x in v)
    except TypeError:
        raise TypeError(f"{what} must be a sequence of ints, not {v!r}") from None
    if any(x < 0 for x in t):
        raise ValueError(f"{what} {t}: extents are non-negative")
    return t


def _desc(tensor_id, global_shape, generation, source_placement, tile_shape, apply, index_dtype, value_dtype, nnz):
    if not isinstance(tensor_id, str):
        raise TypeError(f"tensor_id must be str, not {type(tensor_id).__name__}")
    if apply not in _APPLY:
        raise ValueError(f"apply must be 'scatter_add' or 'scatter_set', not {apply!r}")
    kind, axis, owner = _placement(source_placement)
    base, delta = _generation(generation)
    return {"tensor_id": tensor_id, "shape": _dims(global_shape, "global_shape"), "base_generation": base,
            "delta_generation": delta, "placement_kind": kind, "placement_axis": axis, "placement_owner": owner,
            "tile": None if tile_shape is None else _dims(tile_shape, "tile_shape"), "apply": apply,
            "index_dtype": index_dtype, "value_dtype": value_dtype, "nnz": nnz}


def _value_dtype(values, value_dtype, what="values"):
    name = _VALUE_DTYPES.get(values.dtype.name)
    if value_dtype is not None:
        if value_dtype not in _NUMPY_OF:
            raise ValueError(f"the dtype of {what} must be 'f32', 'bf16' or 'f16', not {value_dtype!r}")
        if np.dtype(_NUMPY_OF[value_dtype]) != values.dtype:
            raise ValueError(f"{what} are {values.dtype}; {value_dtype} needs {np.dtype(_NUMPY_OF[value_dtype])}")
        return value_dtype
    if name is None:
        raise ValueError(f"{what} must be float32, float16 or bf16 held as uint16, not {values.dtype}")
    return name


def put_sparse_object(store, tensor_id, global_shape, indices, values, generation, source_placement,
                      tile_shape=None, apply="scatter_add", value_dtype=None):
    """Store one COO object: ``indices`` ``[nnz, ndim]`` int32/int64 global
    coordinates, ``values`` ``[nnz]`` (float32, float16, or bf16 as uint16;
    ``value_dtype`` may name it), ``generation=(base, delta)``,
    ``source_placement=("replicate", axis)`` or ``("owner", axis, index)``,
    ``tile_shape`` None (chosen from the shape), ``apply`` "scatter_add"
    (deltas; duplicate coordinates summed) or "scatter_set" (exact values;
    duplicates refused). Returns ``(key, descriptor dict)`` — the stored nnz,
    ntiles and tile shape. ``ExistsError`` when the logical key (tensor,
    base, delta, placement) is already stored: nothing is stored twice."""
    idx = np.asarray(indices)
    val = np.asarray(values)
    shape = _dims(global_shape, "global_shape")
    if idx.dtype not in (np.dtype(np.int32), np.dtype(np.int64)):
        raise ValueError(f"put_sparse_object {tensor_id}: indices must be int32 or int64, not {idx.dtype}")
    if idx.ndim != 2 or idx.shape[1] != len(shape):
        raise ValueError(f"put_sparse_object {tensor_id}: indices must be [nnz, {len(shape)}] for a "
                         f"{len(shape)}-D tensor, not {list(idx.shape)}")
    if val.ndim != 1 or val.shape[0] != idx.shape[0]:
        raise ValueError(f"put_sparse_object {tensor_id}: {idx.shape[0]} index rows but values have shape "
                         f"{list(val.shape)} (nnz must match)")
    vdt = _value_dtype(val, value_dtype)
    idx = np.ascontiguousarray(idx.astype(idx.dtype.newbyteorder("<"), copy=False))
    val = np.ascontiguousarray(val.astype(val.dtype.newbyteorder("<"), copy=False))
    d = _desc(tensor_id, shape, generation, source_placement, tile_shape, apply,
              "i32" if idx.dtype.itemsize == 4 else "i64", vdt, int(idx.shape[0]))
    return _ferry.sparse_put(store, d, idx, val)


def sparse_admit(store, tensor_id, global_shape, generation, source_placement, rank, apply="scatter_add",
                 index_dtype="i64", value_dtype="f32"):
    """Owner admission for a weight several trainer ranks hold: True for
    exactly one rank per logical key (tensor, base, delta, placement) — it
    computes and puts — False for the others (they skip). The winner asking
    again gets True again."""
    if not isinstance(rank, (int, np.integer)) or rank < 0:
        raise ValueError(f"rank must be a non-negative int, not {rank!r}")
    d = _desc(tensor_id, global_shape, generation, source_placement, None, apply, index_dtype, value_dtype, 0)
    return _ferry.sparse_admit(store, d, int(rank))


def _target(t, i):
    if isinstance(t, dict):
        try:
            t = Target(t["tensor_id"], t["node"], t["axis_index"], t["offset"], t["shape"])
        except KeyError as e:
            raise ValueError(f"targets[{i}] lacks {e.args[0]!r} (tensor_id, node, axis_index, offset, shape)") from None
    elif not isinstance(t, Target):
        raise TypeError(f"targets[{i}] must be a ferry.sparse.Target or a dict, not {type(t).__name__}")
    if not isinstance(t.tensor_id, str):
        raise TypeError(f"targets[{i}].tensor_id must be str")
    node, axis = int(t.node), int(t.axis_index)
    if not (0 <= node < 2 ** 32 and 0 <= axis < 2 ** 32):
        raise ValueError(f"targets[{i}]: node and axis_index are 32-bit non-negative ints")
    return (t.tensor_id, node, axis, _dims(t.offset, f"targets[{i}].offset"), _dims(t.shape, f"targets[{i}].shape"))


def read_sparse_objects(store, keys, targets, publish_prefix=None):
    """Target-local COO results of the source objects ``keys`` (the
    manifest) for ``targets`` (:class:`Target` or dicts with the same
    names): ``(results, counters)``. One :class:`SparseResult` per (source,
    target) pair placement filtering kept (also when it has no entries);
    ``counters`` holds every ``ferry_sparse_stats`` field (:data:`COUNTERS`).
    Within the call each unique entry range is read once per node and fanned
    out to the targets that need it. ``publish_prefix``: each result is also
    stored as ``<prefix>/<target index>/<tensor_id>``."""
    if isinstance(keys, str):
        keys = [keys]
    tgt = [_target(t, i) for i, t in enumerate(targets)]
    raw, counters = _ferry.sparse_read(store, list(keys), tgt, publish_prefix)
    out = []
    for r in raw:
        nd = len(r["shape"])
        idx = np.frombuffer(r["indices"], dtype="<i8").reshape(r["nnz"], nd)
        val = np.frombuffer(r["values"], dtype=np.dtype(_NUMPY_OF[r["value_dtype"]]).newbyteorder("<"))
        out.append(SparseResult(r["target"], r["tensor_id"], tuple(r["shape"]), r["base_generation"],
                                r["delta_generation"], r["apply"], r["value_dtype"], idx, val))
    return out, counters


def sparse_apply(result, dense, current_generation, dense_dtype=None):
    """Scatter ``result`` into ``dense`` (a C-contiguous, writable numpy
    array of the result's local shape: float32, float16, or bf16 as uint16 —
    ``dense_dtype`` may say "bf16"). ``scatter_add`` is fenced: when
    ``current_generation`` is not the delta's base generation it raises
    :class:`ferry.ConflictError` and ``dense`` is unchanged; so does any
    index outside the shape (``ferry.Error``). Returns the new generation
    (the delta generation)."""
    if not isinstance(result, SparseResult):
        raise TypeError(f"result must be a ferry.sparse.SparseResult, not {type(result).__name__}")
    if not isinstance(dense, np.ndarray):
        raise TypeError(f"dense must be a numpy array, not {type(dense).__name__}")
    if tuple(dense.shape) != tuple(result.shape):
        raise ValueError(f"sparse_apply {result.tensor_id}: the array has shape {tuple(dense.shape)}, the target "
                         f"{tuple(result.shape)}")
    if not dense.flags.c_contiguous or not dense.flags.writeable:
        raise ValueError(f"sparse_apply {result.tensor_id}: the array must be C-contiguous and writable")
    ddt = _value_dtype(dense, dense_dtype, "the dense array's elements")
    idx = np.ascontiguousarray(result.indices, dtype="<i8")
    val = np.ascontiguousarray(result.values)
    if idx.ndim != 2 or idx.shape != (val.shape[0], len(result.shape)):
        raise ValueError(f"sparse_apply {result.tensor_id}: indices {list(idx.shape)} do not match "
                         f"{val.shape[0]} values of a {len(result.shape)}-D target")
    r = {"tensor_id": result.tensor_id, "shape": tuple(result.shape), "base_generation": int(result.base_generation),
         "delta_generation": int(result.delta_generation), "apply": result.apply, "value_dtype": result.value_dtype,
         "nnz": int(val.shape[0])}
    if int(current_generation) < 0:
        raise ValueError("current_generation is non-negative")
    return _ferry.sparse_apply(r, idx, val, dense, ddt, int(current_generation))
