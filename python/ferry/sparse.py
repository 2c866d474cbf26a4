"""ferry.sparse: sparse COO weight deltas (docs/sparse.md, "Python").

- :func:`put_sparse_object` — one COO object per logical tensor update
  (global coordinates; indices ``int32``/``int64`` ``[nnz, ndim]``, values
  ``float32``, ``float16`` or bf16 — ``torch.bfloat16``, or numpy ``uint16``
  words; numpy arrays or torch tensors), validated, sorted by
  tile and stored once; returns the key and the stored descriptor.
- :func:`sparse_admit` — for a weight several trainer ranks hold: exactly one
  rank per logical key is admitted to compute and put.
- :func:`read_sparse_objects` — target-local COO results of a batch of
  targets (:class:`Target` or dicts), each needed entry range read once per
  node; returns ``(results, counters)``.
- :func:`sparse_apply` — scatter a result into a numpy array or torch
  tensor of the target's shape, in place — contiguous or any strided view
  (a row slice of a larger parameter, one part of a fused one, a transposed
  view) — behind the base-generation fence (:class:`ferry.ConflictError`
  when it holds another generation; it is then unchanged).
- :func:`announce` — a sparse generation into the weights registry (one
  compare-and-swap of the active key, retention as for a dense publish);
  :func:`chain` — what a worker holding a generation needs to reach the
  active one; :func:`update` — follow it into the worker's arrays (load the
  dense generation first when the worker is not on the chain).
- :class:`DeltaEncoder` — a trainer rank's encoder: each generation
  compares what the rank holds, bit for bit in the rollout dtype, with what
  it last published and publishes the changed elements (set semantics:
  exact) as a sparse generation, or dense when that is cheaper
  (docs/sparse.md, "Deltas from a trainer"). ``ferry.torch.publish_delta``
  is its form for a module.

Results are numpy arrays, or torch tensors with ``framework="torch"``
(bf16 values as ``torch.bfloat16``; numpy has no bf16: ``uint16`` words).

Everything that touches the store runs with the GIL released. Errors are
:class:`ferry.Error` subclasses (``ExistsError`` for a logical key already
stored, ``NotFoundError``, ``ConflictError`` for the fence) or
``ValueError``/``TypeError`` for arguments Python can already refuse.
"""

from dataclasses import dataclass

import numpy as np

from . import _ferry
from . import _weights
from . import _tensors

__all__ = ["Target", "SparseResult", "put_sparse_object", "sparse_admit", "read_sparse_objects", "sparse_apply",
           "announce", "chain", "update", "DeltaEncoder", "DELTA_KINDS", "COUNTERS"]

# Every ferry_sparse_stats field, in the header's order.
COUNTERS = ("source_objects", "non_ep_source_object_count", "index_gets", "index_cache_hits", "unique_range_gets",
            "full_indices_values_get_count", "dedup_hits", "bytes_read", "entries_read", "entries_kept",
            "boundary_filtered", "plan_s", "read_s", "filter_s", "index_checks", "index_bytes_read", "index_s",
            "index_range_gets", "index_range_bytes", "value_range_bytes", "index_range_s", "value_range_s")

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
    (numpy: bf16 as ``uint16`` words; torch: ``torch.bfloat16``), numpy
    arrays or torch tensors as read_sparse_objects was asked. ``target``
    indexes the targets passed in."""
    target: int
    tensor_id: str
    shape: tuple
    base_generation: int
    delta_generation: int
    apply: str
    value_dtype: str
    indices: object
    values: object

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


def _numpy_of(x, what, writable=False):
    """(numpy array, ferry dtype or None) sharing x's memory: tensors and
    DLPack objects through ferry's export, anything else through numpy."""
    if isinstance(x, np.ndarray):
        return x, None
    if _tensors.is_torch(x) or hasattr(x, "__dlpack__"):
        return _tensors.as_numpy(x, what, writable)
    return np.asarray(x), None


def _value_dtype(values, value_dtype, what="values", known=None):
    if known == "bf16" and value_dtype in (None, "bf16"):
        return "bf16"
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
    idx, _ = _numpy_of(indices, f"put_sparse_object {tensor_id}: indices")
    val, vknown = _numpy_of(values, f"put_sparse_object {tensor_id}: values")
    shape = _dims(global_shape, "global_shape")
    if idx.dtype not in (np.dtype(np.int32), np.dtype(np.int64)):
        raise ValueError(f"put_sparse_object {tensor_id}: indices must be int32 or int64, not {idx.dtype}")
    if idx.ndim != 2 or idx.shape[1] != len(shape):
        raise ValueError(f"put_sparse_object {tensor_id}: indices must be [nnz, {len(shape)}] for a "
                         f"{len(shape)}-D tensor, not {list(idx.shape)}")
    if val.ndim != 1 or val.shape[0] != idx.shape[0]:
        raise ValueError(f"put_sparse_object {tensor_id}: {idx.shape[0]} index rows but values have shape "
                         f"{list(val.shape)} (nnz must match)")
    vdt = _value_dtype(val, value_dtype, known=vknown)
    idx = np.ascontiguousarray(idx.astype(idx.dtype.newbyteorder("<"), copy=False))
    val = np.ascontiguousarray(val.astype(val.dtype.newbyteorder("<"), copy=False))
    d = _desc(tensor_id, shape, generation, source_placement, tile_shape, apply,
              "i32" if idx.dtype.itemsize == 4 else "i64", vdt, int(idx.shape[0]))
    return _weights.sparse_put(store, d, idx, val)


def sparse_admit(store, tensor_id, global_shape, generation, source_placement, rank, apply="scatter_add",
                 index_dtype="i64", value_dtype="f32"):
    """Owner admission for a weight several trainer ranks hold: True for
    exactly one rank per logical key (tensor, base, delta, placement) — it
    computes and puts — False for the others (they skip). The winner asking
    again gets True again."""
    if not isinstance(rank, (int, np.integer)) or rank < 0:
        raise ValueError(f"rank must be a non-negative int, not {rank!r}")
    d = _desc(tensor_id, global_shape, generation, source_placement, None, apply, index_dtype, value_dtype, 0)
    return _weights.sparse_admit(store, d, int(rank))


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


def read_sparse_objects(store, keys, targets, publish_prefix=None, framework="numpy"):
    """Target-local COO results of the source objects ``keys`` (the
    manifest) for ``targets`` (:class:`Target` or dicts with the same
    names): ``(results, counters)``. One :class:`SparseResult` per (source,
    target) pair placement filtering kept (also when it has no entries);
    ``counters`` holds every ``ferry_sparse_stats`` field (:data:`COUNTERS`).
    Within the call each unique entry range is read once per node and fanned
    out to the targets that need it. The store keeps the objects' tile
    indexes for its later calls (its own sparse reader, closed with it), so
    reading the same objects again costs one metadata check each (counted in
    ``index_cache_hits``). ``publish_prefix``: each result is also
    stored as ``<prefix>/<target index>/<tensor_id>``. Indices and values are
    numpy arrays, or torch tensors with ``framework="torch"``."""
    fw = _tensors.check_framework(framework)
    if isinstance(keys, str):
        keys = [keys]
    tgt = [_target(t, i) for i, t in enumerate(targets)]
    raw, counters = _weights.sparse_read(store, list(keys), tgt, publish_prefix)
    out = []
    for r in raw:
        nd = len(r["shape"])
        idx = _tensors.from_buffer(r["indices"], "i64", (r["nnz"], nd), fw)
        val = _tensors.from_buffer(r["values"], r["value_dtype"], (r["nnz"],), fw)
        out.append(SparseResult(r["target"], r["tensor_id"], tuple(r["shape"]), r["base_generation"],
                                r["delta_generation"], r["apply"], r["value_dtype"], idx, val))
    return out, counters


def sparse_apply(result, dense, current_generation, dense_dtype=None):
    """Scatter ``result`` into ``dense`` in place: a writable numpy array or
    torch tensor of the result's local shape — contiguous, or any strided
    view of a larger buffer (``p[16:40]``, a third of a fused ``qkv``,
    ``p.t()``; its strides are passed on, and strides under which two
    elements share an address are refused) — float32, float16 or bf16
    (``torch.bfloat16``, or numpy ``uint16`` words, for which
    ``dense_dtype`` may say "bf16"). ``scatter_add`` is fenced: when
    ``current_generation`` is not the delta's base generation it raises
    :class:`ferry.ConflictError` and ``dense`` is unchanged; so does any
    index outside the shape (``ferry.Error``). Returns the new generation
    (the delta generation)."""
    if not isinstance(result, SparseResult):
        raise TypeError(f"result must be a ferry.sparse.SparseResult, not {type(result).__name__}")
    if not isinstance(dense, np.ndarray) and not _tensors.is_torch(dense) and not hasattr(dense, "__dlpack__"):
        raise TypeError(f"dense must be a numpy array or a tensor, not {type(dense).__name__}")
    what = f"sparse_apply {result.tensor_id}: dense"
    if tuple(dense.shape) != tuple(result.shape):
        raise ValueError(f"{what} ({_tensors.describe(dense)}) has shape {list(dense.shape)}, the target "
                         f"{list(result.shape)}")
    arr, dknown = _numpy_of(dense, what, writable=True)
    if not arr.flags.writeable:
        raise ValueError(f"{what} ({_tensors.describe(dense)}) must be writable")
    ddt = _value_dtype(arr, dense_dtype, "the dense array's elements", known=dknown)
    idx = np.ascontiguousarray(_numpy_of(result.indices, "result.indices")[0], dtype="<i8")
    val = np.ascontiguousarray(_numpy_of(result.values, "result.values")[0])
    if idx.ndim != 2 or idx.shape != (val.shape[0], len(result.shape)):
        raise ValueError(f"sparse_apply {result.tensor_id}: indices {list(idx.shape)} do not match "
                         f"{val.shape[0]} values of a {len(result.shape)}-D target")
    r = {"tensor_id": result.tensor_id, "shape": tuple(result.shape), "base_generation": int(result.base_generation),
         "delta_generation": int(result.delta_generation), "apply": result.apply, "value_dtype": result.value_dtype,
         "nnz": int(val.shape[0])}
    if int(current_generation) < 0:
        raise ValueError("current_generation is non-negative")
    return _ferry.sparse_apply(r, idx, val, arr, ddt, int(current_generation))


# ---- sparse generations -------------------------------------------------------------------------


def announce(store, model, base, generation, keys, keep=2):
    """Announce sparse generation ``generation`` of ``model``: the delta
    ``base -> generation`` made of the sparse objects ``keys`` (each put
    with ``generation=(base, generation)``). One compare-and-swap of the
    model's active key, the same one a dense publish makes: the active
    generation advances and its record names the base and the dense
    generation the chain starts at. ``base`` must be the active generation
    (else :class:`ferry.ConflictError`, nothing announced); a key that is
    not a sparse object of ``(base, generation)``, a tensor the dense
    generation does not have (or has in another shape) or a key named twice
    raises :class:`ferry.Error` (``FERRY_EINVAL``). Retention as for a dense
    publish (``keep`` generations), never breaking the chain to the active
    generation; retired sparse generations lose their objects. Returns
    ``{"generation", "objects", "nnz", "dense_generation", "chain",
    "removed_generations", "announce_s"}``."""
    if isinstance(keys, str):
        keys = [keys]
    return _weights.sparse_announce(store, str(model), int(base), int(generation), list(keys), int(keep))


def active(store, model):
    """``(generation, sparse)`` of the model's announced generation — is it
    a sparse one? — in one master round trip, without reading its text
    (None when nothing is announced). A group's worker asks it before its
    group's dense update: a sparse generation is followed by each worker
    alone (:func:`update`). A sparse generation announced by an older
    library reads as dense; the group's update then refuses it
    (``ferry.ConflictError``, "is a sparse delta")."""
    return _weights.sparse_active(store, str(model))


def chain(store, model, generation=0):
    """What a worker holding ``generation`` (0: none) needs to reach the
    active generation: ``{"active", "dense", "load_dense", "links"}`` —
    load generation ``dense`` whole first when ``load_dense``, then apply
    each link (``{"generation", "base", "keys"}``) in order. The rule
    (docs/sparse.md): a worker on the active chain applies the deltas after
    its generation; any other loads the chain's dense generation first."""
    return _weights.sparse_chain(store, str(model), int(generation))


def update(store, model, shards, generation=0, axis_index=0, no_dense=False):
    """Bring a worker's ``shards`` — ``(tensor_name, global_offset, array)``,
    the array any writable numpy array or CPU torch tensor of the box's
    shape in the published dtype, strided views included (a row slice of a
    larger parameter, a part of a fused one, a transposed view) — from
    ``generation`` to the active one by the rule of :func:`chain`. Every
    delta is read and every fence and view checked before the first write;
    a worker off the chain with ``no_dense=True`` raises
    :class:`ferry.ConflictError` with nothing written. ``axis_index``: the
    worker's index of the placement axis (its EP rank: OWNER objects reach
    only it). Returns stats: ``generation`` (now held), ``dense_generation``
    (loaded first, 0: none), ``dense_bytes``, ``dense_ranges``, ``deltas``,
    ``entries_applied``, ``read`` (the sparse counters, :data:`COUNTERS`,
    summed over the chain), ``resolve_s``, ``read_s``, ``dense_s``,
    ``apply_s``."""
    items = []
    for i, sh in enumerate(shards):
        if not isinstance(sh, (tuple, list)) or len(sh) != 3:
            raise TypeError(f"shards[{i}] must be (tensor name, offset, array)")
        name, off, arr = sh
        if isinstance(arr, np.ndarray):
            a = arr
        else:
            a, _ = _numpy_of(arr, f"shards[{i}] ({name})", writable=True)
        items.append((name, None if off is None else tuple(int(x) for x in off), a))
    return _ferry.sparse_update(store, str(model), int(axis_index), bool(no_dense), items, int(generation))


# ---- deltas from a trainer ----------------------------------------------------------------------

# How a delta publish went (ferry_delta_stats.kind), as its stats' "kind".
DELTA_KINDS = ("sparse", "dense_first", "dense_fraction", "dense_chain")


class DeltaEncoder:
    """A trainer rank's delta encoder (``ferry_delta_publish``;
    docs/sparse.md, "Deltas from a trainer") for the rank of ``publisher``
    (a :class:`ferry.WeightPublisher`: model, rank, world, rank_node,
    out_dtype, segment, keep, timeout_ms).

    It keeps a snapshot of what this rank last published, in the rollout
    dtype (one copy of the pieces it stores: :attr:`snapshot_bytes`). Each
    :meth:`publish_shards` compares this rank's pieces with it, bit for bit;
    every rank meets the others and all take the same decision: a sparse
    generation on the last one (each changed tensor one object, set
    semantics, in global coordinates) or a dense one — when a rank has no
    snapshot (the first publish, after :meth:`reset`), when the chain
    already holds ``max_chain`` deltas (default 8), or when the changed
    fraction of every rank's elements is above ``crossover`` (default
    0.05). Rollouts follow the chain as they do for any sparse generation
    (:func:`update`, ``ferry.torch.Subscriber.update()``)."""

    def __init__(self, publisher, crossover=None, max_chain=None):
        self.publisher = publisher
        self._cap = _ferry.delta_open(publisher.model, int(publisher.rank), int(publisher.world),
                                      list(publisher.rank_node) if publisher.rank_node is not None else None,
                                      publisher.out_dtype or "", int(publisher.segment), int(publisher.keep),
                                      int(publisher.timeout_ms), float(crossover or 0.0), int(max_chain or 0))

    def publish_shards(self, generation, placement, mine):
        """Publish ``generation`` from this rank's pieces — the arguments of
        :meth:`ferry.WeightPublisher.publish_shards` (the whole world's
        placement, ``(fragment id, buffer)`` of this rank's fragments).
        Every rank calls it. Returns this rank's stats: ``kind`` (one of
        :data:`DELTA_KINDS`, the same on every rank), ``chain`` (deltas
        since the dense generation, 0 for a dense one), ``elements``,
        ``changed``, ``total_elements``, ``total_changed``,
        ``compared_bytes``, ``objects``, ``nnz``, ``stored_bytes``,
        ``part_bytes``, ``encode_s``, ``encode_gbps``, ``exchange_s``,
        ``store_s``, ``commit_s``, ``snapshot_s``, ``total_s`` and ``dense``
        (the dense publish's stats when the generation went dense). A rank
        whose layout changed since its last publish fails the generation on
        every rank with nothing stored (:class:`ferry.Error`): call
        :meth:`reset` on it and publish again (dense)."""
        mine = [tuple(m) for m in mine]
        return _ferry.delta_publish(self._cap, self.publisher.store, int(generation), placement, mine)

    def reset(self):
        """Forget the snapshot: the next publish is dense."""
        _ferry.delta_reset(self._cap)

    @property
    def snapshot_bytes(self):
        """Bytes of the snapshot the encoder holds (0 when empty)."""
        return _ferry.delta_bytes(self._cap)

    def close(self):
        """Free the encoder and its snapshot (later calls raise)."""
        _ferry.delta_close(self._cap)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
