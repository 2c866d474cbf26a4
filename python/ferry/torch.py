"""ferry.torch: ferry's calls with torch tensors as results.

Every ferry call already takes torch tensors as input (CPU; bf16,
``nn.Parameter`` and tensors that require grad included; a destination is
written in place). This module is where results come back as torch tensors
of the stored dtype (``torch.bfloat16`` for bf16, never uint16 words): each
entry point is the ferry call of the same name with ``framework="torch"``.
``import ferry`` does not import torch; ``import ferry.torch`` does.

- :class:`Store` — a :class:`ferry.Store` whose tensor results are torch
  (``get_tensor``, ``get_tensor_into`` on an address, ``read_member``), and
  :class:`ReplicateConfig` beside it, as ``mooncake.store`` has them.
- :class:`CompatGroup`, :func:`update_compat` — compatibility updates
  yielding ``(name, tensor)``.
- :func:`get_tensor`, :func:`read_member`, :func:`read_sparse_objects`,
  :func:`read_sample`, :func:`convert` — for a store or queue made elsewhere.
- :func:`torch_dtype`, :func:`ferry_dtype` — dtype names both ways.
- torch models (docs/python.md, "torch models"): :func:`publish_module`
  (a module or state dict, whole or from the shards of a layout),
  :func:`publish_delta` with a :class:`DeltaEncoder` (each rank's boxes
  compared with what it last published: a sparse, exact delta, or dense
  when cheaper; docs/sparse.md, "Deltas from a trainer"),
  :class:`Subscriber` (parameter-direct into a module's parameters, by
  layout and role rules; with a sparse generation active its ``update()``
  follows the registry's chain: ``ferry.sparse.update``), :func:`weights` (the compatibility iterator for
  ``model.load_weights``), :class:`NameMap` (trainer -> rollout names,
  fused targets included), :func:`role_of`, :func:`build_layout`.
- FP8 rollouts (docs/weights.md, "FP8 rollouts"): ``Subscriber(...,
  quant=rules)`` writes FP8 bytes and block scales into the parameters;
  :func:`fp8_empty` and :func:`fp8_view` (``torch.uint8`` on a torch
  without float8, Debian's 1.13; ``torch.float8_e4m3fn`` where it has it),
  :func:`dequantize_fp8` (``q * s``, asked explicitly: lossy).
"""

import torch as _torch   # the point of this module: fail here, not later, without torch

from . import _tensors
from . import samples as _samples
from . import sparse as _sparse
from . import store as _store
from . import weights as _weights
from .store import ReplicateConfig
from ._torch_weights import (DEFAULT_RULES, ROLES, NameMap, Subscriber, Weights, build_layout, dequantize_fp8,
                             fp8_empty, fp8_view, publish_delta, publish_module, role_of, warm_publisher, weights)
from .sparse import DeltaEncoder

__all__ = ["Store", "ReplicateConfig", "CompatGroup", "update_compat", "get_tensor", "get_tensor_into", "read_member",
           "read_sparse_objects", "read_sample", "convert", "torch_dtype", "ferry_dtype", "empty", "ROLES", "DEFAULT_RULES",
           "NameMap", "Subscriber", "Weights", "build_layout", "publish_module", "publish_delta", "DeltaEncoder",
           "role_of", "warm_publisher", "weights", "fp8_empty", "fp8_view", "dequantize_fp8"]

FRAMEWORK = "torch"


class Store(_store.Store):
    """:class:`ferry.Store` with torch tensor results by default."""

    framework = FRAMEWORK


class CompatGroup(_weights.CompatGroup):
    """:class:`ferry.CompatGroup` whose updates yield torch tensors."""

    def __init__(self, store, model, group, rank, world, node=0, staging_bytes=0, timeout_ms=0,
                 local_segment=0):
        super().__init__(store, model, group, rank, world, node, staging_bytes, timeout_ms, local_segment,
                         framework=FRAMEWORK)


def update_compat(store, model, generation=0, fn=None):
    """:func:`ferry.weights.update_compat` yielding ``(name, torch tensor)``."""
    return _weights.update_compat(store, model, generation, fn, framework=FRAMEWORK)


def get_tensor(store, key):
    """The tensor under ``key`` (put_tensor) as a torch tensor."""
    return store.get_tensor(key, framework=FRAMEWORK)


def get_tensor_into(store, key, buffer, size=None):
    """:meth:`ferry.Store.get_tensor_into`; an address comes back as a torch
    tensor over that memory."""
    return store.get_tensor_into(key, buffer, size, framework=FRAMEWORK)


def read_member(store, key, member, rows=None, out=None):
    """Rows of a member of a structured object as a torch tensor."""
    return store.read_member(key, member, rows=rows, out=out, framework=FRAMEWORK)


def read_sparse_objects(store, keys, targets, publish_prefix=None):
    """:func:`ferry.read_sparse_objects` with torch indices and values."""
    return _sparse.read_sparse_objects(store, keys, targets, publish_prefix, framework=FRAMEWORK)


def read_sample(queue, sample):
    """The payload of a popped sample as torch tensors (int32 tokens and
    prompt, float32 logprobs and rewards)."""
    return queue.read(sample, framework=FRAMEWORK)


def convert(tensor, src_dtype, dst_dtype):
    """:func:`ferry.weights.convert` to a torch tensor ("bf16": torch.bfloat16)."""
    return _weights.convert(tensor, src_dtype, dst_dtype, framework=FRAMEWORK)


def torch_dtype(dtype):
    """The torch dtype of a ferry dtype name ("bf16" -> torch.bfloat16)."""
    return _tensors.torch_dtype(dtype)


def ferry_dtype(dtype):
    """The ferry dtype name of a torch dtype (torch.bfloat16 -> "bf16")."""
    return _store.dtype_name(dtype)


def empty(shape, dtype):
    """An uninitialised torch tensor of a ferry dtype."""
    return _tensors.empty(shape, dtype, FRAMEWORK)
