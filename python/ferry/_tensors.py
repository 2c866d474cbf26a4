"""Tensors in and out of ferry: ferry dtype names, numpy and torch.

Every call that takes memory accepts numpy arrays, buffers, torch tensors
and DLPack objects (the C extension's fp_buf_get). This module does the
rest in Python: what a result is made of (``framework="numpy"`` or
``"torch"``), ferry dtype names of arrays and tensors, and zero-copy numpy
views of tensors for the Python helpers that compute on numpy. torch is
imported only when a torch result is asked for or a tensor is passed.
"""

import sys

from . import _ferry

FRAMEWORKS = ("numpy", "torch")

# ferry dtype -> numpy dtype name of its elements (bf16 and fp8 have no numpy
# type: their raw words)
NUMPY = {"f64": "float64", "f32": "float32", "f16": "float16", "bf16": "uint16",
         "i64": "int64", "i32": "int32", "i16": "int16", "i8": "int8",
         "u64": "uint64", "u32": "uint32", "u16": "uint16", "u8": "uint8", "bool": "bool",
         "f8e4m3": "uint8", "f8e5m2": "uint8", "fp8_e4m3": "uint8", "fp8_e5m2": "uint8"}
# numpy dtype name -> ferry dtype (uint16 is u16: bf16 data must be named)
FROM_NUMPY = {"float64": "f64", "float32": "f32", "float16": "f16",
              "int64": "i64", "int32": "i32", "int16": "i16", "int8": "i8",
              "uint64": "u64", "uint32": "u32", "uint16": "u16", "uint8": "u8", "bool": "bool"}
# ferry dtype -> torch dtype attribute (the unsigned wide ones exist from torch 2.3, float8 from 2.1;
# the FP8 names come first: dtype_of gives the canonical one)
TORCH = {"f8e4m3": "float8_e4m3fn", "f8e5m2": "float8_e5m2", "f64": "float64", "f32": "float32", "f16": "float16", "bf16": "bfloat16",
         "i64": "int64", "i32": "int32", "i16": "int16", "i8": "int8", "u8": "uint8", "bool": "bool",
         "u16": "uint16", "u32": "uint32", "u64": "uint64",
         "fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2"}
SIZES = {"f64": 8, "f32": 4, "f16": 2, "bf16": 2, "i64": 8, "i32": 4, "i16": 2, "i8": 1,
         "u64": 8, "u32": 4, "u16": 2, "u8": 1, "bool": 1, "f8e4m3": 1, "f8e5m2": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}
FP8 = ("f8e4m3", "f8e5m2", "fp8_e4m3", "fp8_e5m2")


def check_framework(framework):
    """framework, validated: "numpy" or "torch"."""
    if framework not in FRAMEWORKS:
        raise ValueError(f"framework must be 'numpy' or 'torch', not {framework!r}")
    return framework


def is_torch(obj):
    """True for a torch tensor (nn.Parameter included), without importing torch."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def describe(obj):
    """What obj is, for messages: "torch.Tensor of torch.float32, shape [4, 4]"."""
    t = type(obj)
    name = t.__name__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"
    dt, sh = getattr(obj, "dtype", None), getattr(obj, "shape", None)
    if dt is not None and sh is not None:
        return f"{name} of {dt}, shape {list(sh)}"
    return name


def torch_dtype(dtype):
    """The torch dtype of ferry dtype ``dtype`` (torch.bfloat16 for "bf16"),
    or ValueError naming what this torch lacks. An FP8 dtype is
    torch.float8_e4m3fn / float8_e5m2 where this torch has them, else
    torch.uint8 (the raw bytes: torch before 2.1, Debian's 1.13)."""
    import torch
    name = TORCH.get(dtype)
    if name is None:
        raise ValueError(f"unknown ferry dtype {dtype!r} (known: {sorted(TORCH)})")
    t = getattr(torch, name, None)
    if t is None and dtype in FP8:
        return torch.uint8
    if t is None:
        raise ValueError(f"ferry dtype {dtype} has no torch dtype in torch {torch.__version__} (torch.{name}); "
                         f"read it with framework='numpy'")
    return t


def numpy_dtype(dtype):
    """The numpy dtype holding elements of ferry dtype ``dtype`` ("bf16" ->
    uint16 raw words, "fp8_*" -> uint8 raw bytes)."""
    import numpy as np
    try:
        return np.dtype(NUMPY[dtype])
    except KeyError:
        raise ValueError(f"unknown ferry dtype {dtype!r} (known: {sorted(NUMPY)})") from None


def dtype_of(obj):
    """The ferry dtype name of an array, tensor or buffer's elements ("bf16"
    for torch.bfloat16), or None when it has none (untyped bytes, complex)."""
    if is_torch(obj):
        for k, v in TORCH.items():
            if str(obj.dtype) == "torch." + v:
                return k
        return None
    dt = getattr(obj, "dtype", None)
    if dt is not None and type(obj).__module__ == "numpy":
        import numpy as np
        d = np.dtype(dt)
        if d.byteorder == ">" or (d.byteorder == "=" and sys.byteorder == "big"):
            return None
        return FROM_NUMPY.get(d.name)
    return _ferry.memory(obj, "value").dtype


def shape_of(obj):
    """The shape of an array or tensor as a tuple (a buffer: its memory's)."""
    sh = getattr(obj, "shape", None)
    if sh is not None and not callable(sh):
        return tuple(int(x) for x in sh)
    return _ferry.memory(obj, "value").shape


def as_numpy(obj, what="value", writable=False):
    """(numpy array sharing obj's memory, ferry dtype or None): numpy arrays
    as they are, buffers through numpy, tensors and DLPack objects through
    ferry's memory export (a torch bfloat16 tensor becomes a uint16 view of
    its words, dtype "bf16"). Nothing is copied; errors name obj ``what``."""
    import numpy as np
    if isinstance(obj, np.ndarray):
        if writable and not obj.flags.writeable:
            raise ValueError(f"{what} ({describe(obj)}) is read-only: a destination must be writable")
        return obj, dtype_of(obj)
    m = _ferry.memory(obj, what, writable)
    return np.asarray(m), m.dtype


def empty(shape, dtype, framework="numpy"):
    """A new uninitialised array of ``shape`` and ferry ``dtype``: numpy (bf16
    as uint16 words) or torch (bf16 as torch.bfloat16)."""
    check_framework(framework)
    if framework == "torch":
        import torch
        return torch.empty(tuple(shape), dtype=torch_dtype(dtype))
    import numpy as np
    return np.empty(tuple(shape), dtype=numpy_dtype(dtype))


def from_buffer(data, dtype, shape, framework="numpy"):
    """An array or tensor over the bytes of ``data`` (a bytearray or other
    writable buffer: shared, not copied) as ``shape`` of ferry ``dtype``."""
    check_framework(framework)
    if framework == "torch":
        import torch
        n = 1
        for x in shape:
            n *= int(x)
        if n == 0:
            return torch.empty(tuple(shape), dtype=torch_dtype(dtype))
        t = torch.frombuffer(data, dtype=torch.uint8)
        return t.view(torch_dtype(dtype)).reshape(tuple(shape))
    import numpy as np
    return np.frombuffer(data, dtype=numpy_dtype(dtype)).reshape(tuple(shape))


def as_framework(array, dtype, framework):
    """A numpy result of ferry ``dtype`` as ``framework`` asks (torch: shares
    its memory; bf16 words become torch.bfloat16)."""
    check_framework(framework)
    if framework == "numpy":
        return array
    import numpy as np
    import torch
    a = np.ascontiguousarray(array)
    if a.size == 0:
        return torch.empty(a.shape, dtype=torch_dtype(dtype))
    t = torch.from_numpy(a.reshape(-1).view(np.uint8))
    return t.view(torch_dtype(dtype)).reshape(a.shape)
