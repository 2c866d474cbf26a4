"""ferry.weights: publishing policy generations from trainer ranks and
updating rollout workers from the store (docs/weights.md, "Python").

- :class:`WeightPublisher` — every trainer rank publishes the same ordered
  tensors; each tensor is stored once by the rank ``assign`` picks.
- :class:`WeightSubscriber` — single-pull update of a rollout group: each
  byte read from the store once by one worker and pushed to the others.
  ``world=0`` makes it an elastic group whose membership lives in the store
  (``member=`` names this one; each update's stats carry ``epoch``,
  ``members`` and ``position``; docs/weights.md, "Elastic groups").
- :func:`update_direct` — each worker reads its own demand (the baseline).
- :func:`update_compat` — every full tensor, for a ``load_weights(iterable)``
  loader, this worker reading every tensor from the store.
- :class:`CompatGroup` — the same for a rollout group, each tensor read from
  the store once (by its leader) and handed to the other workers (written
  across machines; on one machine they load it from the leader's staging).
- :func:`active`, :func:`manifest`, :func:`assign`, :func:`convert`,
  :func:`key`.

Tensors go in as numpy arrays, torch tensors (bf16 as torch.bfloat16;
nn.Parameter and tensors that require grad as they are) or DLPack objects.
What comes back is numpy unless ``framework="torch"`` is passed (or the
:mod:`ferry.torch` entry points are used): bf16 has no numpy dtype, so
numpy results carry bf16 in ``uint16`` arrays (the raw 16-bit words); torch
results are ``torch.bfloat16``. Every call that touches the store runs with
the GIL released.
"""

import collections

from . import _ferry
from . import _weights
from . import _tensors
from ._ferry import WeightSubscriber

__all__ = ["WeightPublisher", "WeightSubscriber", "CompatGroup", "assign", "convert", "key", "active", "wait_active",
           "manifest", "update_direct", "update_compat", "CompatUpdate", "numpy_dtype",
           "quant_rules"]

_CONVERTIBLE = ("f32", "bf16", "f16")


def numpy_dtype(dtype):
    """The numpy dtype that holds elements of ferry dtype ``dtype`` ("bf16" ->
    uint16 raw words, "f16" -> float16, "f32" -> float32, ...)."""
    return _tensors.numpy_dtype(dtype)


def assign(sizes, rank_node):
    """The publisher rank of each tensor (``ferry_weights_assign``): sizes in
    bytes, in tensor order; ``rank_node[r]`` the node of trainer rank r. The
    same inputs give the same answer on every rank."""
    return _weights.weights_assign(list(sizes), list(rank_node))


def convert(array, src_dtype, dst_dtype, framework="numpy"):
    """A new array holding ``array``'s elements converted from ``src_dtype`` to
    ``dst_dtype`` ("f32", "bf16", "f16"; round to nearest, ties to even), same
    shape. ``array``: a numpy array (bf16: uint16 raw words) or a tensor
    whose itemsize is ``src_dtype``'s. The output is numpy (float32, float16,
    uint16 words for "bf16") or, with ``framework="torch"``, a torch tensor
    (torch.bfloat16 for "bf16")."""
    import numpy as np
    for d in (src_dtype, dst_dtype):
        if d not in _CONVERTIBLE:
            raise ValueError(f"convert: dtype {d!r} is not one of {_CONVERTIBLE}")
    if isinstance(array, np.ndarray) or not (_tensors.is_torch(array) or hasattr(array, "__dlpack__")):
        a = np.ascontiguousarray(array)
    else:
        a, _ = _tensors.as_numpy(array, "convert: array")
        a = np.ascontiguousarray(a)
    if a.dtype.itemsize != numpy_dtype(src_dtype).itemsize:
        raise ValueError(f"convert: {a.dtype} elements are not {src_dtype}")
    out = _tensors.empty(a.shape, dst_dtype, framework)
    _weights.weights_convert(a, src_dtype, out, dst_dtype, a.size)
    return out


def key(model, generation, fragment):
    """The store key of one object of a generation:
    ``ferry/w/<model>/<generation, 20 digits>/<fragment>``."""
    return _weights.weights_key(model, generation, fragment)


def active(store, model):
    """``(generation, digest)`` of the model's announced generation (digest:
    the 16-byte XXH3-128 of its manifest), or None when none is. Raises
    ``ferry.LostError`` ("generation G of M is lost: ...; publish generation
    G+1 or later") when its objects are gone — a node holding them restarted
    or died: it is not current any more, and the next publish must use a
    newer number."""
    return _weights.weights_active(store, model)


def wait_active(store, model, at_least, timeout_ms=60000):
    """Wait, at most ``timeout_ms`` (negative: forever), until the model's
    announced generation is at least ``at_least`` and return it
    (``ferry_weights_wait_active``: a watch of the announcement, no
    polling). Raises ``ferry.TimeoutError`` ("generation G of M was not
    announced within T ms (the active one is A)") or ``ferry.LostError``
    when the generation reached is lost."""
    return _weights.weights_wait_active(store, model, int(at_least), int(timeout_ms))


def manifest(store, model, generation=None):
    """The tensors of a generation (default: the active one), in publish
    order: dicts with name, dtype, shape, bytes, checksum (XXH3-64),
    publisher (trainer rank), segment and key. The digest is checked when it
    is the active generation."""
    if generation is None:
        a = active(store, model)
        if a is None:
            raise _ferry.NotFoundError(f"model {model} has no active generation")
        generation = a[0]
    return _weights.weights_manifest(store, model, int(generation))


def _tensor_item(i, t):
    """(name, memory, dtype) of one tensor to publish, checked here so that a
    bad tensor fails the attempt on every rank (see publish)."""
    import numpy as np
    if not isinstance(t, (tuple, list)) or len(t) not in (2, 3):
        raise TypeError(f"tensors[{i}] must be (name, array) or (name, array, dtype)")
    name, a = t[0], t[1]
    if _tensors.is_torch(a) or (not isinstance(a, np.ndarray) and hasattr(a, "__dlpack__")):
        m = _ferry.memory(a, f"tensor {name}")      # device memory and the like refused here
        if not m.contiguous:
            raise ValueError(f"tensor {name} ({_tensors.describe(a)}) is not contiguous: pass t.contiguous()")
        if len(t) == 3:
            return (name, a, t[2])
        if m.dtype in _CONVERTIBLE:
            return (name, a, m.dtype)
        raise ValueError(f"tensor {name}: dtype {getattr(a, 'dtype', m.dtype)}: pass float32, float16 or "
                         f"bfloat16 tensors, or (name, tensor, dtype)")
    if not isinstance(a, np.ndarray):
        a = np.asarray(a)
    if not a.flags.c_contiguous:
        raise ValueError(f"tensor {name}: the array is not C-contiguous")
    if len(t) == 3:
        return (name, a, t[2])
    if a.dtype == np.float32 or a.dtype == np.float16:
        return (name, a, "f32" if a.dtype == np.float32 else "f16")
    raise ValueError(f"tensor {name}: dtype {a.dtype}: pass float32/float16 arrays or tensors, "
                     f"or (name, array, dtype) (bf16 in numpy: a uint16 array of raw words)")


QUANT_RULES = ("dtype", "include", "exclude", "scale_name", "block", "scale_format")


def quant_rules(quant):
    """FP8 rules (docs/weights.md, "FP8 rollouts") as the keyword arguments
    of :meth:`ferry.reshard.Manifest.quantize`: ``quant`` is a dict of some
    of :data:`QUANT_RULES` (``{}``: the defaults); an unknown key raises
    ValueError."""
    bad = set(quant) - set(QUANT_RULES)
    if bad:
        raise ValueError(f"quant: unknown rules {sorted(bad)} (known: {sorted(QUANT_RULES)})")
    return {"dtype": quant.get("dtype"), "include": quant.get("include"), "exclude": quant.get("exclude"),
            "scale_name": quant.get("scale_name"), "block": tuple(int(b) for b in quant.get("block", (0, 0))),
            "scale_format": quant.get("scale_format", "f32")}


class WeightPublisher:
    """One trainer rank's publisher of a model's generations.

    ``rank_node[r]`` is the node of trainer rank r (default: all on node 0);
    ``out_dtype`` the rollout dtype ("f32", "bf16", "f16"; None keeps each
    tensor's); ``segment`` this node's store segment, preferred for the
    tensors this rank stores (0: none); ``keep`` generations retained;
    ``timeout_ms`` the wait for every rank at the barrier. ``quant``
    (None: none) quantizes before the network (docs/weights.md,
    "Publishing FP8"): a dict of the rules of
    :meth:`ferry.reshard.Manifest.quantize` (``dtype``, ``include``,
    ``exclude``, ``scale_name``, ``block``, ``scale_format``; ``{}`` the
    defaults), used by :meth:`publish` and :meth:`publish_shards` (the
    streaming publish refuses it)."""

    def __init__(self, store, model, rank, world, rank_node=None, out_dtype=None, segment=0, keep=2,
                 timeout_ms=60000, quant=None):
        if rank_node is None:
            rank_node = [0] * world
        rank_node = [int(n) for n in rank_node]
        if len(rank_node) != world:
            raise ValueError(f"rank_node has {len(rank_node)} entries for a world of {world}")
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} is not in a world of {world}")
        if out_dtype is not None and out_dtype not in _CONVERTIBLE:
            raise ValueError(f"out_dtype {out_dtype!r} is not one of {_CONVERTIBLE}")
        self.store, self.model, self.rank, self.world = store, model, rank, world
        self.rank_node, self.out_dtype, self.segment = rank_node, out_dtype, segment
        self.keep, self.timeout_ms = keep, timeout_ms
        self.quant = None
        if quant is not None:
            q = quant_rules(quant)
            self.quant = (q["dtype"], q["include"], q["exclude"], q["scale_name"], q["block"], q["scale_format"])

    def publish(self, generation, tensors):
        """Publish ``generation`` (newer than every earlier one) from this
        rank: every rank passes the same ordered ``(name, tensor)`` list —
        float32/float16 numpy arrays, torch tensors of float32, float16 or
        bfloat16 (nn.Parameter and tensors that require grad as they are),
        or ``(name, uint16_array, "bf16")`` — each the full, contiguous
        tensor. Returns this rank's stats (tensors,
        bytes, total_tensors, total_bytes, cross_node_bytes, put_s,
        commit_s, removed_generations, swept_generations, ...).

        Every rank gets the same outcome: the stats, or the same
        ``ferry.Error`` subclass with one message ("publish of M generation G
        failed: rank R: why"). A rank whose own check of its tensors fails
        (not C-contiguous, no rollout dtype, ...) still takes part and fails
        the attempt at once for every rank; it raises that error with its
        own exception (ValueError, TypeError) as ``__cause__``. Nothing is
        announced then, and the generation may be retried."""
        try:
            items = [_tensor_item(i, t) for i, t in enumerate(tensors)]
        except Exception as e:   # noqa: B902 - every rank must hear of it
            self._abort(generation, e)
        return _ferry.weights_publish(self.store, self.model, self.rank, self.world, self.rank_node,
                                      self.out_dtype or "", self.segment, self.keep, self.timeout_ms,
                                      int(generation), items, self.quant)

    def publish_stream(self, generation, tensors, held=None):
        """Publish ``generation`` as the ``(name, tensor)`` pairs come
        (``ferry_publish_stream_*``; docs/weights.md, "Streaming
        publish"): ``tensors`` may be a generator, the same full tensors in
        the same order on every rank (verl's weight generator). Each tensor
        is stored by one rank chosen as it comes (the fewest bytes so far:
        the stored bytes stay balanced, no rank-0 funnel), converted into
        that rank's current object, which is put as soon as it is full
        (256 MiB): no rank holds the model, and a tensor may be freed as
        soon as the next one is asked for. ``held`` (a list, may be None)
        gets the most bytes this rank held at once. Outcome and errors as
        :meth:`publish`; a tensor this rank cannot take fails the attempt
        on every rank (the generator is not read further here). A
        publisher with ``quant`` raises ValueError: each tensor is stored
        as it comes, before a placement exists."""
        if self.quant is not None:
            raise ValueError("a streamed publish does not quantize: publish or publish_shards do")
        st = _weights.weights_stream_begin(self.store, self.model, self.rank, self.world, self.out_dtype or "",
                                           self.segment, self.keep, self.timeout_ms, int(generation))
        cause = None
        try:
            # No name here holds a tensor while the next is asked for (nor
            # enumerate's cached pair): the caller's generator may free it.
            i = 0
            for t in tensors:
                name, a, dtype = _tensor_item(i, t)
                del t
                _weights.weights_stream_add(st, name, a, dtype)
                del a
                i += 1
        except _ferry.Error:
            pass   # recorded in the stream: its end fails on every rank with it
        except Exception as e:   # noqa: B902 - every rank must hear of it
            cause = e
            _weights.weights_stream_abort(st, str(e))
        if held is not None:
            held.append(_weights.weights_stream_held(st))
        try:
            return _weights.weights_stream_end(st)
        except _ferry.Error as e:
            if cause is not None:
                raise e from cause
            raise

    def publish_shards(self, generation, placement, mine):
        """Publish ``generation`` from the pieces this rank holds, with no
        gather (``ferry_publish_shards``): ``placement`` is a
        :class:`ferry.reshard.Manifest` of the whole trainer world (FSDP,
        TP, PP shards or any mix; every rank passes the same one, and the
        call freezes it), ``mine`` the ``(fragment id, buffer)`` pairs of
        this rank's fragments — a C-contiguous array or CPU tensor holding
        the fragment's box in its tensor's dtype, or, for a fragment with
        strides, the storage those strides and its storage offset index.
        Each box is stored once, by the rank holding its copy 0; replicas
        need no data. ``rank_node`` is not used: the nodes are the
        placement's. Returns this rank's stats; every rank gets the same
        outcome, as for :meth:`publish`: a buffer this rank cannot use
        (another fragment's, of the wrong size or dtype, not contiguous)
        fails the attempt for every rank at once."""
        try:
            mine = [tuple(m) for m in mine]
        except Exception as e:   # noqa: B902 - every rank must hear of it
            self._abort(generation, e)
        return _ferry.weights_publish_shards(self.store, self.model, self.rank, self.world, self.out_dtype or "",
                                             self.segment, self.keep, self.timeout_ms, int(generation), placement,
                                             mine, self.quant)

    def warm(self, placement):
        """The publisher's warm-up (``ferry_publish_warm``; docs/weights.md,
        "Warm memory"): touch once, now, what publishes of ``placement`` (a
        :class:`ferry.reshard.Manifest` of the trainer world, as for
        :meth:`publish_shards`) will write — the store client's staging
        buffer and this machine's segments through this process's mappings
        — so that the first generation costs what later ones do. Local: no
        other rank takes part. Returns the bytes touched."""
        return _ferry.weights_publish_warm(self.store, self.model, self.rank, self.world, self.out_dtype or "",
                                           placement)

    def _abort(self, generation, exc):
        """This rank cannot publish ``generation`` (exc says why): fail the
        attempt for every rank and raise what they all get, from exc."""
        try:
            _ferry.weights_publish_abort(self.store, self.model, self.rank, self.world, self.timeout_ms,
                                         int(generation), str(exc) or type(exc).__name__)
        except _ferry.Error as e:
            raise e from exc
        raise exc   # not reached: the abort always raises

    def __repr__(self):
        return f"WeightPublisher(model={self.model!r}, rank={self.rank}, world={self.world})"


def update_direct(store, model, shards, generation=0):
    """Parameter-direct update, this worker reading its own demand from the
    store. ``shards``: ``(tensor_name, global_offset, array)`` — the array
    (any writable strided numpy array or CPU torch tensor, e.g. a view into
    a padded buffer or a model's parameter, written in place)
    receives the box ``[offset, offset + array.shape)`` of the published
    tensor; its itemsize must be the published dtype's. A fourth element
    ``"f32"``, ``"bf16"`` or ``"f16"`` asks a tensor published as FP8 in
    blocks for ``q * s`` in that dtype (explicit dequantization, lossy with
    respect to the trainer's weights; docs/weights.md). ``generation`` is
    the worker's current one: nothing is read when it is already active.
    Returns stats; ``stats["generation"]`` is the generation now held."""
    return _ferry.weights_update_direct(store, model, list(shards), int(generation))


def _array(entry, data, framework="numpy"):
    """The tensor of a manifest entry over its bytes (a bytearray: shared)."""
    return _tensors.from_buffer(data, entry["dtype"], entry["shape"], framework)


class CompatUpdate:
    """The tensors of one compatibility update: iterate for ``(name,
    array)`` pairs in manifest order (each array is dropped from here as it
    is yielded); ``generation`` and ``stats`` tell what was read."""

    def __init__(self, items, stats):
        self._items = items
        self.stats = stats
        self.generation = stats["generation"]

    def __iter__(self):
        return self

    def __next__(self):
        try:
            return self._items.popleft()
        except IndexError:
            raise StopIteration from None

    def __len__(self):
        return len(self._items)


def update_compat(store, model, generation=0, fn=None, framework="numpy"):
    """Compatibility update: every tensor of the active generation, whole
    and checksum-verified, in manifest order, as numpy arrays of the
    published dtype (bf16: uint16 raw words; convert with :func:`convert`)
    or, with ``framework="torch"``, torch tensors (bf16: torch.bfloat16).

    With ``fn``: ``fn(name, array)`` is called for each tensor as it is
    read (one tensor in memory at a time; the array is the caller's to
    keep; an exception from fn stops the update and propagates); returns
    the stats. Without: every tensor is read first and a
    :class:`CompatUpdate` is returned — an iterator of ``(name, array)``
    ready for ``load_weights(iterable)``, which holds the whole generation
    in memory until iterated (prefer ``fn`` for large models). Nothing is
    read when ``generation`` is already the active one (empty iterator)."""
    fw = _tensors.check_framework(framework)
    if fn is not None:
        return _ferry.weights_update_compat(store, model, int(generation),
                                            lambda e, data: fn(e["name"], _array(e, data, fw)))
    items = collections.deque()
    stats = _ferry.weights_update_compat(store, model, int(generation),
                                         lambda e, data: items.append((e["name"], _array(e, data, fw))))
    return CompatUpdate(items, stats)


class CompatGroup:
    """Compatibility mode for a rollout group: every worker gets every full
    tensor of the active generation, while the store serves each published
    byte once (``ferry_compat_group_*``, docs/weights.md).

    Per tensor one leader (byte-balanced over the members' nodes) reads it
    from the store and writes it once into a delegate on every other node
    and into the other workers of its node; delegates forward it inside
    their node. Every member of ``group`` (the same name, ``world`` members,
    ranks 0..world-1) opens one and calls :meth:`update` together.
    ``node``: this worker's node (any int; the same for all: one node);
    ``staging_bytes``: this worker's staging buffer, at least the largest
    tensor (0: 256 MiB); ``timeout_ms``: barriers and notifications (0:
    60000); ``local_segment``: the store segment on this worker's node (0:
    unknown; a tensor stored on a segment that members of node X named is
    led by a worker on X, so its read stays inside the node);
    ``framework``: what :meth:`update` hands back, "numpy" or "torch". The
    store stays busy (``Store.close()`` raises ``BusyError``) until
    :meth:`close`."""

    def __init__(self, store, model, group, rank, world, node=0, staging_bytes=0, timeout_ms=0,
                 local_segment=0, framework="numpy"):
        self.framework = _tensors.check_framework(framework)
        self._g = _ferry._CompatGroup(store, model, group, int(rank), int(world), int(node),
                                      int(staging_bytes), int(timeout_ms), int(local_segment))
        self.model, self.group, self.rank, self.world = model, group, rank, world

    @property
    def generation(self):
        """The generation last loaded (0: none yet)."""
        return self._g.generation

    @property
    def closed(self):
        return self._g.closed

    def warm(self):
        """The group's part of the documented warm-up (docs/weights.md, "Warm
        memory"), once after opening, before the first :meth:`update`; every
        member calls it. Meets the others (at most ``timeout_ms``), then makes and touches the views of its node-mates'
        staging and writes through its own staging once, so that the first
        update does not pay those first touches. Returns the bytes touched.
        ``ferry.TimeoutError`` when a member did not arrive in time (the group
        still updates: the first update does what the warm-up could not)."""
        return self._g.warm()

    def update(self, fn=None, framework=None):
        """Take the active generation with the whole group (every member
        calls it). With ``fn``: ``fn(name, array)`` for each tensor in
        manifest order, whole and checksum-verified, as it arrives (the
        array is the caller's to keep; an exception from ``fn`` stops the
        update on every worker, and every worker raises the same
        ``ferry.Error`` (code FERRY_EREBUILD, "worker R: the loader stopped
        at tensor T ..."), here with fn's exception as ``__cause__``);
        returns the stats. Without: a
        :class:`CompatUpdate`, an iterator of ``(name, array)`` holding the
        whole generation in memory until iterated. Arrays are numpy, or torch
        tensors with ``framework="torch"`` (default: the group's). Nothing moves when the
        group is already at the active generation. Stats: ``tensors``,
        ``bytes``, ``tensors_led``, ``bytes_read`` (this worker's store
        reads), ``bytes_sent_cross``, ``bytes_sent_intra``,
        ``bytes_received`` (landed in its staging), ``bytes_viewed`` (taken
        from a same-node worker's staging through a read-only view, nothing
        copied), ``batches``, ``imported``, the group's
        ``group_bytes_read`` (= the published bytes), ``group_cross_bytes``,
        ``group_intra_bytes``, ``nodes``, and the phases ``prepare_s``,
        ``exchange_s``, ``plan_s``, ``read_s``, ``wait_s``, ``verify_s``,
        ``load_s``, ``barrier_s``, ``apply_s``, ``total_s``."""
        fw = self.framework if framework is None else _tensors.check_framework(framework)
        if fn is not None:
            return self._g.update(lambda e, data: fn(e["name"], _array(e, data, fw)))
        items = collections.deque()
        stats = self._g.update(lambda e, data: items.append((e["name"], _array(e, data, fw))))
        return CompatUpdate(items, stats)

    def close(self):
        """Deregister and free the staging buffer; the store is free again."""
        self._g.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self):
        return (f"CompatGroup(model={self.model!r}, group={self.group!r}, rank={self.rank}, "
                f"world={self.world})")
