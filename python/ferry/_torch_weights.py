"""ferry.torch's weight helpers (re-exported there; docs/python.md, "torch
models"): layouts of a torch module's tensors by role rule, publishing a
module from the pieces a rank holds, a subscriber over a module's
parameters, the compatibility iterator and the trainer -> rollout name map.

Nothing here moves bytes itself: publishing is ``WeightPublisher.publish``
or ``publish_shards``, updates are ``WeightSubscriber`` (single-pull) or
``weights.update_direct``, compatibility is ``update_compat`` or a
``CompatGroup``. This file decides which tensor goes where.
"""

import errno
import fnmatch
import queue
import re
import threading

import torch

from . import _ferry
from . import _tensors
from . import reshard as _reshard
from . import weights as _weights

ROLES = ("column", "row", "vocab", "replicated")

# Megatron's and vLLM's conventions for torch Linear weights ([out, in]):
# column-parallel splits dim 0 (the outputs), row-parallel dim 1 (the
# inputs), vocab-parallel dim 0 of an embedding or head. First match wins;
# a tensor no rule matches is replicated.
DEFAULT_RULES = (
    ("*embed_tokens*", "vocab"), ("*wte*", "vocab"), ("*tok_embed*", "vocab"), ("*lm_head*", "vocab"),
    ("*embed.weight", "vocab"),
    ("*qkv_proj*", "column"), ("*q_proj*", "column"), ("*k_proj*", "column"), ("*v_proj*", "column"),
    ("*gate_up_proj*", "column"), ("*gate_proj*", "column"), ("*up_proj*", "column"),
    ("*c_attn*", "column"), ("*c_fc*", "column"), ("*fc1*", "column"), ("*w1.*", "column"), ("*w3.*", "column"),
    ("*o_proj*", "row"), ("*out_proj*", "row"), ("*down_proj*", "row"), ("*c_proj*", "row"), ("*fc2*", "row"),
    ("*w2.*", "row"),
)


FERRY_ESTATE = -(4096 + 4)   # include/ferry/common.h


def _err(cls, code, msg):
    e = cls(msg)
    e.code = code
    return e


def _stale(msg):
    return _err(_ferry.StaleError, -errno.ESTALE, msg)


def role_of(name, ndim, rules=None, roles=None):
    """The TP role of tensor ``name``: ``roles[name]`` when given (a per-tensor
    override), else the first ``(pattern, role)`` of ``rules`` (default
    :data:`DEFAULT_RULES`; fnmatch patterns) that matches, else
    "replicated". A 1-dim tensor whose role is "row" is replicated: the bias
    of a row-parallel layer is added once, after the reduction."""
    role = None
    if roles and name in roles:
        role = roles[name]
    else:
        for pattern, r in (DEFAULT_RULES if rules is None else rules):
            if fnmatch.fnmatchcase(name, pattern):
                role = r
                break
    role = role or "replicated"
    if role not in ROLES:
        raise ValueError(f"tensor {name}: role {role!r} is not one of {ROLES}")
    if role == "row" and ndim < 2:
        role = "replicated"
    return role


def _layers(names):
    """The pipeline layer of each name: its first number; tensors before the
    first numbered one are the embedding side, those after the last the
    head side (the stages reshard.build gives them)."""
    nums = [re.search(r"\d+", n) for n in names]
    found = [i for i, m in enumerate(nums) if m]
    out = []
    for i, m in enumerate(nums):
        if m:
            out.append(int(m.group()))
        elif not found or i < found[0]:
            out.append(_reshard.LAYER_FIRST)
        else:
            out.append(_reshard.LAYER_LAST)
    return out


def build_layout(model, tensors, layout, rules=None, roles=None):
    """The placement (:class:`ferry.reshard.Manifest`) of ``tensors`` —
    ``(name, shape, dtype)`` with the full shapes, in order — under
    ``layout`` ("tp:2,dp:2", "fsdp:4", ...), each tensor's role from
    :func:`role_of`: ``reshard.build`` over a model made from them."""
    tensors = [(n, tuple(int(x) for x in s), d) for n, s, d in tensors]
    layers = _layers([t[0] for t in tensors])
    m = _reshard.Model(model, max([l for l in layers if l >= 0], default=0) + 1)
    for (name, shape, dtype), layer in zip(tensors, layers):
        m.add_tensor(name, dtype, list(shape), role_of(name, len(shape), rules, roles), layer)
    return _reshard.build(m, layout)


def _boxes(placement, rank, replica0=False):
    """{tensor index: [(fragment id, offset, shape)]} of rank's fragments."""
    out = {}
    for fid in range(placement.fragment_count):
        f = placement.fragment(fid)
        if f["rank"] != rank or (replica0 and f["replica"] != 0):
            continue
        out.setdefault(f["tensor"], []).append((fid, f["offset"], f["shape"]))
    return out


def _named(module_or_dict, buffers):
    """(name, tensor) of a module's parameters (and buffers), or a dict's items."""
    if isinstance(module_or_dict, torch.nn.Module):
        items = list(module_or_dict.named_parameters())
        if buffers:
            items += [(n, b) for n, b in module_or_dict.named_buffers() if b is not None]
        return items
    return list(dict(module_or_dict).items())


def _box_view(t, offset, shape):
    v = t
    for d, (o, n) in enumerate(zip(offset, shape)):
        v = v.narrow(d, o, n)
    return v


def _module_placement(publisher, items, layout, rules, roles, shapes):
    """(name, full shape, dtype) of every tensor of ``items`` and the
    placement of ``layout`` over them (publish_module's)."""
    shapes = shapes or {}
    tensors = []
    for n, t in items:
        tensors.append((n, tuple(shapes.get(n, tuple(t.shape))), _tensors.dtype_of(t)))
    placement = build_layout(publisher.model, tensors, layout, rules, roles)
    if placement.ranks != publisher.world:
        raise ValueError(f"layout {layout!r} has {placement.ranks} ranks; the trainer world is {publisher.world}")
    return tensors, placement


def _unquantized(entries, quant):
    """The tensors a generation published with FP8 ``quant`` was quantized
    from: its scale tensors left out (the quantized layout derives them),
    its FP8 weights as bf16 (any float: quantizing sets the FP8 dtype)."""
    fmt = _weights.quant_rules(quant)["scale_name"] or "%s_scale_inv"
    fp8 = [n for n, _, d in entries if d in _tensors.FP8]
    scales = {fmt % n for n in fp8}          # the C rule: "%s" once, "%%" a "%"
    return [(n, s, "bf16" if d in _tensors.FP8 else d) for n, s, d in entries if n not in scales]


def fp8_empty(shape, dtype="f8e4m3"):
    """An uninitialised FP8 tensor of ``shape``: ``torch.float8_e4m3fn``
    (or ``float8_e5m2``) where this torch has it, else ``torch.uint8``
    holding the raw FP8 bytes (torch before 2.1, Debian's 1.13). Either is
    a parameter an FP8 :class:`Subscriber` writes."""
    return torch.empty(tuple(shape), dtype=_tensors.torch_dtype(dtype))


def fp8_view(t, dtype="f8e4m3"):
    """FP8 bytes (a ``torch.uint8`` tensor) as ``torch.float8_e4m3fn`` (or
    ``float8_e5m2``) where this torch has it — a view, nothing copied —
    else ``t`` itself."""
    want = _tensors.torch_dtype(dtype)
    return t if want == torch.uint8 or t.dtype == want else t.view(want)


def _fp8_table(dtype):
    """The value of each of the 256 codes of ``dtype`` (decoded from the
    format: OCP E4M3 "fn" — no infinities, NaN at 0x7f/0xff — or E5M2)."""
    e4m3 = dtype in ("f8e4m3", "fp8_e4m3")
    mbits, bias = (3, 7) if e4m3 else (2, 15)
    out = []
    for code in range(256):
        e, m = (code & 0x7f) >> mbits, code & ((1 << mbits) - 1)
        if (e4m3 and e == 15 and m == 7) or (not e4m3 and e == 31 and m):
            v = float("nan")
        elif not e4m3 and e == 31:
            v = float("inf")
        elif e == 0:
            v = m * 2.0 ** (1 - bias - mbits)
        else:
            v = (1 + m / 2.0 ** mbits) * 2.0 ** (e - bias)
        out.append(-v if code & 0x80 else v)
    return torch.tensor(out, dtype=torch.float32)


def dequantize_fp8(q, scale_inv, block=(128, 128), dtype=torch.float32, fp8="f8e4m3"):
    """``q * s`` of a 2-D FP8 tensor (uint8 bytes or a float8 tensor) and
    its block scales (``scale_inv``: float32, one per ``block``, the
    blocks of ``q``'s box from its first row and column): each code's value
    times its block's scale in float32, then as ``dtype`` (torch's
    rounding). Lossy with respect to the trainer's weights: the FP8 values,
    not the ones quantized (docs/weights.md, "FP8 rollouts")."""
    codes = q.view(torch.uint8) if q.dtype != torch.uint8 else q
    if codes.dim() != 2 or scale_inv.dim() != 2:
        raise ValueError(f"dequantize_fp8: a 2-D tensor and 2-D scales, not {list(q.shape)} and "
                         f"{list(scale_inv.shape)}")
    rows, cols = codes.shape
    b0, b1 = int(block[0]), int(block[1])
    need = (-(-rows // b0), -(-cols // b1))
    if tuple(scale_inv.shape) != need or scale_inv.dtype != torch.float32:
        raise ValueError(f"dequantize_fp8: {rows} x {cols} in {b0} x {b1} blocks needs {list(need)} float32 "
                         f"scales, not {list(scale_inv.shape)} {scale_inv.dtype}")
    s = scale_inv.repeat_interleave(b0, 0)[:rows].repeat_interleave(b1, 1)[:, :cols]
    return (_fp8_table(fp8)[codes.long()] * s).to(dtype)


def warm_publisher(publisher, module, layout=None, *, buffers=False, rules=None, roles=None, shapes=None):
    """The trainer's warm-up before its first :func:`publish_module` with
    the same arguments (docs/weights.md, "Warm memory"): what those
    publishes write — the store client's staging buffer and this
    machine's segments, through this process's mappings — is touched once
    now, so that generation 1 costs what later ones do. Local to this rank.
    Without ``layout`` only the segments are warmed. Returns the bytes
    touched."""
    if layout is None:
        return publisher.store.warm(write=True)
    _, placement = _module_placement(publisher, _named(module, buffers), layout, rules, roles, shapes)
    return publisher.warm(placement)


def publish_module(publisher, generation, module, layout=None, *, buffers=False, rules=None, roles=None,
                   shapes=None):
    """Publish ``generation`` of a module's parameters (``named_parameters()``;
    with ``buffers=True`` its buffers too) or of a state dict, from every
    trainer rank of ``publisher`` (a :class:`ferry.WeightPublisher`).

    Without ``layout`` every rank passes its full tensors and each tensor is
    stored once by the rank ``assign`` picks (``publish``). With ``layout``
    ("fsdp:4", "tp:2,fsdp:2", ...: ranks = the publisher's world) the
    generation is published from shards (``publish_shards``): the layout's
    placement of the tensors (roles by ``rules``/``roles``, as
    :func:`role_of`) says which box each rank stores. A rank's tensor is
    either the full tensor (its box is cut out of it: a view, copied only
    when it is not contiguous — row-parallel boxes) or already the box
    (a TP- or FSDP-sharded module); ``shapes`` ({name: full shape}) gives the
    full shapes of sharded tensors (default: each tensor's own). Returns
    this rank's publish stats; every rank gets the same outcome."""
    items = _named(module, buffers)
    if layout is None:
        return publisher.publish(generation, [(n, t, _tensors.dtype_of(t)) for n, t in items])
    placement, pieces = _publish_plan(publisher, items, layout, rules, roles, shapes)
    # a box that is not contiguous in the rank's tensor (row-parallel) is copied now, each publish
    return publisher.publish_shards(generation, placement,
                                    [(fid, v.contiguous() if copy else v) for fid, v, copy in pieces])


def publish_delta(encoder, generation, module, layout, *, buffers=False, rules=None, roles=None, shapes=None):
    """:func:`publish_module` through a :class:`ferry.sparse.DeltaEncoder`
    (docs/sparse.md, "Deltas from a trainer"): every trainer rank passes
    its encoder and the same ``layout`` ("fsdp:4", "tp:2,fsdp:2", ...); its
    boxes are compared, bit for bit in the rollout dtype, with what the rank
    last published, and the generation goes out as a sparse delta (the
    changed elements, set semantics: exact) or dense when that is cheaper
    (the encoder's crossover and chain rule, a rank without a snapshot).
    Arguments and the module's tensors as for :func:`publish_module`
    (a layout is required: the encoder compares the boxes it places).
    Returns this rank's delta stats (``kind``: "sparse", "dense_first",
    "dense_fraction" or "dense_chain")."""
    if layout is None:
        raise ValueError("publish_delta needs a layout (\"fsdp:N\", ...): the encoder compares its boxes")
    placement, pieces = _publish_plan(encoder.publisher, _named(module, buffers), layout, rules, roles, shapes)
    return encoder.publish_shards(generation, placement,
                                  [(fid, v.contiguous() if copy else v) for fid, v, copy in pieces])


def _publish_plan(publisher, items, layout, rules, roles, shapes):
    """The placement and this rank's pieces ``(fragment id, view, copy?)``
    of a module publish (publish_module's, publish_delta's): made once per
    publisher and reused while the
    tensors (names, storage, shapes, strides, dtypes) and arguments stay
    the same — an RL job's steady state, where rebuilding the layout and
    cutting ~150 views took a few ms of every rank's publish. The views
    follow the tensors' storage, so in-place optimizer steps are seen; a
    re-bound or reshaped tensor makes a new plan."""
    key = (layout, repr(rules), repr(roles), repr(shapes) if shapes else None,
           tuple((n, t.data_ptr(), t.dtype, tuple(t.shape), t.stride(), t.storage_offset()) for n, t in items))
    held = getattr(publisher, "_module_plan", None)
    if held is not None and held[0] == key:
        return held[1], held[2]
    tensors, placement = _module_placement(publisher, items, layout, rules, roles, shapes)
    pieces = []
    for ti, boxes in _boxes(placement, publisher.rank, replica0=True).items():
        name, t = items[ti]
        full = tensors[ti][1]
        data = t.detach()
        for fid, off, shp in boxes:
            if tuple(data.shape) == tuple(full):
                v = _box_view(data, off, shp)
            elif tuple(data.shape) == tuple(shp):
                v = data
            else:
                raise ValueError(f"tensor {name}: shape {list(data.shape)} is neither the full {list(full)} nor "
                                 f"rank {publisher.rank}'s box {list(shp)} of layout {layout!r}")
            pieces.append((fid, v, not v.is_contiguous()))
    publisher._module_plan = (key, placement, pieces)
    return placement, pieces


class NameMap:
    """Trainer tensor names -> rollout parameter names.

    ``mapping``: None (names kept), a dict (names it has are renamed, the
    others kept; a value of None drops the tensor) or a callable
    ``name -> str | None`` (None: the rollout has no such tensor).
    ``stacked``: fused rollout parameters the way vLLM's
    ``stacked_params_mapping`` lists them, ``(param_name, shard_name,
    shard_id)``: a mapped name containing ``shard_name`` goes into the rows
    of the parameter named with ``param_name`` in its place, the parts
    stacked along dim 0 in the order listed (q, k, v -> qkv_proj; gate, up
    -> gate_up_proj)."""

    def __init__(self, mapping=None, stacked=()):
        if mapping is not None and not (callable(mapping) or isinstance(mapping, dict)):
            raise TypeError("mapping: a dict, a callable or None")
        self.mapping = mapping
        self.stacked = [tuple(s) for s in stacked]

    @classmethod
    def of(cls, names):
        """A NameMap from None, a dict, a callable or a NameMap."""
        return names if isinstance(names, NameMap) else cls(names)

    def rename(self, name):
        """The rollout name of trainer tensor ``name`` (before fusing), or None."""
        if self.mapping is None:
            return name
        if isinstance(self.mapping, dict):
            return self.mapping.get(name, name)
        return self.mapping(name)

    def target(self, name):
        """``(rollout parameter, part)`` of trainer tensor ``name``: part is
        the position of a fused shard (0 for q, 1 for k, ...) or None; None
        when the rollout has no such tensor."""
        r = self.rename(name)
        if r is None:
            return None
        for param_name, shard_name, _ in self.stacked:
            if shard_name in r:
                parts = [s for p, s, _ in self.stacked if p == param_name]
                return r.replace(shard_name, param_name), parts.index(shard_name)
        return r, None


class _Dest:
    """One rollout parameter the subscriber writes, as it was at open."""

    def __init__(self, name, p):
        self.name, self.p = name, p
        self.ptr, self.shape, self.stride, self.dtype = p.data_ptr(), tuple(p.shape), p.stride(), p.dtype

    def check(self, ptrs=None):
        """ptrs: the storages the parameter may hold (standby copies: either copy); default its own."""
        p = self.p
        if (tuple(p.shape), p.stride(), p.dtype) != (self.shape, self.stride, self.dtype) or \
                p.data_ptr() not in (ptrs or (self.ptr,)):
            raise _stale(f"parameter {self.name} was re-bound after the subscriber opened (p.data = ...): it is now "
                         f"{_tensors.describe(p)} at {p.data_ptr():#x}, the subscriber writes the storage at "
                         f"{self.ptr:#x} (shape {list(self.shape)}, {self.dtype}); nothing was written — close the "
                         f"subscriber and open a new one over the new storage")


class Subscriber:
    """A rollout worker's parameter-direct subscription: the active
    generation's tensors written straight into a torch module's parameters
    (their storages registered; no copy on the worker).

    ``layout`` ("tp:2,dp:2"; this worker is ``rank`` of its ranks) and the
    role rules (``rules``, ``roles``: :func:`role_of`, the roles
    ``reshard.build`` knows) say which box of each published tensor the
    worker holds; ``names`` (a :class:`NameMap`, dict or callable) which
    parameter receives it, fused ones included (q/k/v into the row slices
    of qkv_proj). The module's parameters (and buffers with
    ``buffers=True``) hold the boxes: a parameter's shape must be its box's
    (or the stacked boxes' of a fused one), its dtype the published one.
    ``tensors``: the published ``(name, shape, dtype)`` list (default: the
    active generation's manifest). With ``group`` the workers of the layout
    update together (``WeightSubscriber``: each byte read once, pushed to
    the replicas); without, each reads its own demand. ``standby=True``
    (with a group) keeps a second storage per parameter: each update writes
    the copy the module does not hold, then re-binds every parameter's
    ``.data`` to it in one step (docs/weights.md, "Standby copies"; 2x the
    parameters' memory), and ``update(next=G)`` becomes possible.

    ``quant`` (a dict of FP8 rules, :func:`ferry.weights.quant_rules`; the
    trainers' ``WeightPublisher(quant=...)``) makes this an FP8 rollout
    (docs/weights.md, "FP8 rollouts"): the layout is quantized, each picked
    weight's parameter holds its box as FP8 bytes — a ``torch.uint8``
    tensor (:func:`fp8_empty`; ``torch.float8_e4m3fn`` where this torch has
    it) — and the module has the derived scale tensors as parameters of
    their own (``<weight>_scale_inv``, float32, the scale rows or columns
    of the box's blocks; fused targets stack them like the weights)."""

    def __init__(self, store, model, module, layout, rank, group=None, *, names=None, rules=None, roles=None,
                 buffers=False, tensors=None, node=0, timeout_ms=60000, batch_bytes=0, local_segment=0,
                 standby=False, quant=None):
        self.store, self.model, self.rank, self.layout, self.group = store, model, int(rank), layout, group
        self.names = NameMap.of(names)
        if tensors is None:   # the dense generation the active chain starts at (the active one when dense)
            from . import sparse as _sparse
            dense = _sparse.chain(store, model, 0)["dense"]
            tensors = [(e["name"], e["shape"], e["dtype"]) for e in _weights.manifest(store, model, dense)]
            if quant is not None:
                tensors = _unquantized(tensors, quant)
        placement = build_layout(model, tensors, layout, rules, roles)
        if quant is not None:   # FP8 weights and their scale tensors, as the trainers publish them
            placement = placement.quantize(**_weights.quant_rules(quant))
            tensors = [(n, shape, dtype) for n, dtype, _, shape in
                       (placement.tensor(i) for i in range(placement.tensor_count))]
        self.world = placement.ranks
        if not 0 <= self.rank < self.world:
            raise ValueError(f"rank {rank} is not in layout {layout!r} ({self.world} ranks)")
        params = dict(_named(module, buffers))
        self.shards, self._dests = self._plan(tensors, placement, params)
        self.generation = 0
        self._sub = None
        self._copies = None
        if standby and group is None:
            raise ValueError("standby copies need a group (the standby copy is what the group writes)")
        if group is not None:
            kw = {}
            if standby:   # a second storage per parameter; every shard's view into it, as into the first
                # zeros, not empty: written once now, at set-up, so that the first update that lands
                # in it does not pay a first touch per page (docs/weights.md, "Warm memory")
                self._copies = ({n: d.p.data for n, d in self._dests.items()},
                                {n: torch.zeros_like(d.p.data) for n, d in self._dests.items()})
                kw = {"standby": [self._standby_view(dst) for _, _, dst in self.shards], "on_flip": self._on_flip}
            self._sub = _weights.WeightSubscriber(store, model, group, self.rank, self.world, self.shards,
                                                  timeout_ms=timeout_ms, node=node, batch_bytes=batch_bytes,
                                                  local_segment=local_segment, **kw)

    def _standby_view(self, dst):
        """The standby copy's view of a shard: the same place in its parameter's second storage."""
        for n, d in self._dests.items():
            base = self._copies[0][n]
            off = dst.storage_offset() - base.storage_offset()
            if dst.data_ptr() >= base.data_ptr() and \
                    dst.data_ptr() < base.data_ptr() + max(1, base.numel()) * base.element_size():
                other = self._copies[1][n]
                return other.as_strided(dst.size(), dst.stride(), other.storage_offset() + off)
        raise ValueError("a shard lies in no parameter")

    def _on_flip(self, copy, generation):
        """The standby copy became active: every parameter now holds it (between inference steps)."""
        for n, d in self._dests.items():
            d.p.data = self._copies[copy][n]

    def _plan(self, tensors, placement, params):
        boxes = _boxes(placement, self.rank)
        fused = {}     # rollout name -> [(part, tensor index, offset, shape)]
        for ti, (name, shape, dtype) in enumerate(tensors):
            tgt = self.names.target(name)
            if tgt is None or ti not in boxes:
                continue
            if len(boxes[ti]) != 1:
                raise ValueError(f"tensor {name}: layout {self.layout!r} gives rank {self.rank} "
                                 f"{len(boxes[ti])} pieces; a parameter holds one box")
            _, off, shp = boxes[ti][0]
            fused.setdefault(tgt[0], []).append((tgt[1] if tgt[1] is not None else -1, ti, off, shp))
        shards, dests = [], {}
        for pname, parts in fused.items():
            if pname not in params:
                raise ValueError(f"tensor {tensors[parts[0][1]][0]} maps to {pname}, which the module does not "
                                 f"have")
            p = params[pname]
            parts.sort(key=lambda x: x[0])
            rows = sum(s[0] for _, _, _, s in parts) if parts[0][0] >= 0 else parts[0][3][0]
            want = (rows,) + tuple(parts[0][3][1:])
            if tuple(p.shape) != want or (parts[0][0] < 0 and len(parts) > 1):
                raise ValueError(f"parameter {pname} has shape {list(p.shape)}; layout {self.layout!r} gives rank "
                                 f"{self.rank} {' + '.join(str(list(s)) for *_, s in parts)} of "
                                 f"{', '.join(tensors[t][0] for _, t, _, _ in parts)}")
            at = 0
            for _, ti, off, shp in parts:
                name, _, dtype = tensors[ti]
                got = _tensors.dtype_of(p)
                fp8 = dtype in _tensors.FP8 and got in ("u8", dtype)
                if got != dtype and not fp8:
                    raise ValueError(f"parameter {pname} is {p.dtype}; tensor {name} is published as {dtype}"
                                     + (" (FP8: a torch.uint8 parameter, ferry.torch.fp8_empty)"
                                        if dtype in _tensors.FP8 else ""))
                dst = p.data.narrow(0, at, shp[0]) if parts[0][0] >= 0 else p.data
                if fp8 and got != "u8":
                    dst = dst.view(torch.uint8)   # the binding takes the FP8 bytes as bytes
                at += shp[0]
                shards.append((name, tuple(off), dst))
            dests[pname] = _Dest(pname, p)
        return shards, dests

    def check(self):
        """Raise ``ferry.StaleError`` naming the first parameter re-bound
        since open (``p.data = other``): an update would write the old storage.
        With standby copies a parameter holds one of its two copies."""
        for n, d in self._dests.items():
            d.check(None if self._copies is None else (self._copies[0][n].data_ptr(),
                                                       self._copies[1][n].data_ptr()))

    def warm(self):
        """The rollout's warm-up before its first :meth:`update`
        (docs/weights.md, "Warm memory"): this machine's segments are
        touched once through this process's mappings, so that the first
        update reads them at memory speed. Returns the bytes touched."""
        return self.store.warm(write=False)

    def update(self, alone=False, next=None):
        """Take the active generation into the parameters; returns the stats
        (``generation``: the one held now). With a group, every member calls
        it (single-pull); ``alone=True`` (or no group) reads this worker's
        own demand — a worker that restarted while the others hold the active
        generation. Nothing moves when the parameters hold the active one.
        A re-bound parameter raises ``ferry.StaleError`` before anything is
        read (the group's other members then time out after
        ``timeout_ms``). ``next=G`` (standby copies only): an overlapped
        update of generation G, which the trainers may still be publishing
        (``WeightSubscriber.update(next=)``; docs/weights.md, "Overlapped
        updates"); the stats say ``overlapped``."""
        self.check()
        if next is not None:   # overlapped: the group takes `next` while the trainers publish it
            if self._copies is None:
                raise ValueError("update(next=...) needs standby copies (Subscriber(..., standby=True))")
            st = self._sub.update(next=int(next))
            self.generation = st["generation"]
            return st
        group = self._sub is not None and not alone
        from . import sparse as _sparse
        # one round trip: the announced generation and whether it is sparse (not its manifest: the
        # dense update reads that itself)
        act = _sparse.active(self.store, self.model)
        if act is not None and act[0] <= self.generation and (not group or act[1]):
            # current, or a newer sparse delta; a group member holding an active sparse generation
            # too (the members of a sparse one each read their own entries: nobody waits for it)
            return {"generation": self.generation, "bytes_read": 0}
        if act is not None and act[0] > self.generation and act[1]:
            # a sparse generation is active: follow its chain (each worker reads its own entries)
            st = _sparse.update(self.store, self.model, self.shards, self.generation)
            self.generation = st["generation"]
            st["bytes_read"] = st["dense_bytes"] + st["read"]["bytes_read"]
            return st
        if not group:
            st = _weights.update_direct(self.store, self.model, self.shards, self.generation)
        else:   # the group agrees on the generation (nothing moves when every member holds it)
            st = self._sub.update()
        self.generation = st["generation"]
        return st

    def apply_sparse(self, keys, node=0):
        """Apply the sparse delta objects ``keys`` (``put_sparse_object``)
        to the parameters in place: each shard reads the entries of its box
        (``read_sparse_objects``) and ``sparse_apply`` adds (or sets) them.
        Every delta must apply to the generation the parameters hold (its
        base; else ``ferry.ConflictError`` and nothing changed) and lead to
        one generation, which they hold afterwards (returned). Returns
        ``(generation, counters)``."""
        from . import sparse as _sparse
        self.check()
        targets = [_sparse.Target(name, node, 0, tuple(off), tuple(dst.shape)) for name, off, dst in self.shards]
        results, counters = _sparse.read_sparse_objects(self.store, list(keys), targets, framework="torch")
        gens = {r.delta_generation for r in results}
        if len(gens) > 1:
            raise ValueError(f"the deltas lead to generations {sorted(gens)}; apply one generation at a time")
        for r in results:   # the fence of every delta before the first write
            if r.apply == "scatter_add" and r.base_generation != self.generation:
                raise _err(_ferry.ConflictError, FERRY_ESTATE, f"sparse delta of {r.tensor_id}: {r.base_generation} -> "
                                           f"{r.delta_generation} applies to generation {r.base_generation}; the "
                                           f"parameters hold {self.generation}; nothing changed")
        for r in results:
            _sparse.sparse_apply(r, self.shards[r.target][2], self.generation)
        if gens:
            self.generation = gens.pop()
        return self.generation, counters

    def close(self):
        """Release the parameters' registrations and the store."""
        if self._sub is not None:
            self._sub.close()
            self._sub = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self):
        return (f"ferry.torch.Subscriber(model={self.model!r}, layout={self.layout!r}, rank={self.rank}, "
                f"params={len(self._dests)}, generation={self.generation})")


class Weights:
    """An iterator of ``(rollout name, torch.Tensor)`` of one compatibility
    update, ready for ``model.load_weights(weights)``; ``generation`` is the
    generation it carries and ``stats`` (once iterated to the end) what was
    read. Tensors stream: each is handed over as it arrives, at most
    ``depth`` waiting, so the generation is never all in memory; a loader
    that stops early (or raises) stops the update (on every worker of a
    group)."""

    _END = object()

    def __init__(self, run, names, generation, depth=16):
        self.names, self.generation, self.stats = NameMap.of(names), generation, None
        self._q = queue.Queue(depth)
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._produce, args=(run,), name="ferry-weights", daemon=True)
        self._t.start()

    def _produce(self, run):
        def fn(name, t):
            to = self.names.rename(name)
            while to is not None:
                if self._stop.is_set():
                    raise RuntimeError("the loader stopped taking tensors")
                try:
                    self._q.put((to, t), timeout=0.1)
                    return
                except queue.Full:
                    continue
        try:
            self.stats = run(fn)
            self._q.put((self._END, None))
        except BaseException as e:   # noqa: B902 - handed to the consumer
            self._q.put((self._END, e))

    def __iter__(self):
        return self

    def __next__(self):
        if self._t is None:
            raise StopIteration
        name, t = self._q.get()
        if name is self._END:
            self._t.join()
            self._t = None
            if t is not None:
                raise t
            if self.stats:
                self.generation = self.stats.get("generation", self.generation)
            raise StopIteration
        return name, t

    def close(self):
        """Stop the update if it is still running and wait for it."""
        if self._t is None:
            return
        self._stop.set()
        while self._t.is_alive():
            try:
                self._q.get(timeout=0.1)
            except queue.Empty:
                pass
        self._t.join()
        self._t = None

    def __del__(self):
        try:
            self.close()
        except Exception:   # noqa: B902 - interpreter shutdown
            pass


def weights(store, model, names=None, group=None, generation=0):
    """The compatibility iterator: every tensor of the active generation as
    ``(rollout name, torch.Tensor)`` (names through ``names``: a
    :class:`NameMap`, dict or callable; a fused target is the loader's
    business, as vLLM's ``stacked_params_mapping`` is), whole and
    checksum-verified, in manifest order, streamed (:class:`Weights`). With
    ``group`` (a ``ferry.CompatGroup``) the group's members take it together
    (each byte read from the store once); without, this worker reads every
    tensor (``update_compat``; nothing when ``generation`` is the active
    one)."""
    if group is not None:
        return Weights(lambda fn: group.update(fn, framework="torch"), names, group.generation)
    return Weights(lambda fn: _weights.update_compat(store, model, generation, fn, framework="torch"), names,
                   generation)
