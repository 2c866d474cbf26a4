"""ferry.Store: the client of the ferry store (objects in node memory placed
by a master, KV with revisions, watch, barriers, leased queues).

The C extension (``ferry._ferry.Store``) does every call with the GIL
released; this module adds the numpy-facing helpers of structured objects
and :class:`ReplicateConfig`. See docs/store.md ("Python").
"""

from . import _ferry
from ._ferry import (Error, NotFoundError, ExistsError, NoSpaceError, LostError, BusyError, ConflictError,
                     TimeoutError, AuthError, ConnectionError, StaleError, UnreachableError, Watch)

__all__ = ["Store", "Watch", "ReplicateConfig", "Error", "NotFoundError", "ExistsError", "NoSpaceError",
           "LostError", "BusyError", "ConflictError", "TimeoutError", "AuthError", "ConnectionError",
           "StaleError", "UnreachableError", "dtype_name"]


class ReplicateConfig:
    """Where a put may land: ``replica_num`` copies on distinct segments
    (0 means 1, at most 8), ``preferred_segments`` tried first in order (a
    preference, not a requirement: see ``preferred`` in the placement), and
    ``hard_pin`` (never evicted). A dict with the same names works too."""

    __slots__ = ("replica_num", "preferred_segments", "hard_pin")

    def __init__(self, replica_num=1, preferred_segments=(), hard_pin=False):
        self.replica_num = replica_num
        self.preferred_segments = list(preferred_segments)
        self.hard_pin = hard_pin

    def __repr__(self):
        return (f"ReplicateConfig(replica_num={self.replica_num!r}, "
                f"preferred_segments={self.preferred_segments!r}, hard_pin={self.hard_pin!r})")


# numpy dtype name -> ferry dtype name (bf16 has no numpy type: see dtype_name)
_DTYPES = {
    "float64": "f64", "float32": "f32", "float16": "f16",
    "int64": "i64", "int32": "i32", "int16": "i16", "int8": "i8",
    "uint64": "u64", "uint32": "u32", "uint16": "u16", "uint8": "u8",
    "bool": "bool",
}
_NUMPY = {v: k for k, v in _DTYPES.items()}
_NUMPY["bf16"] = "uint16"   # read back as raw 16-bit words


def dtype_name(dtype):
    """The ferry dtype name ("f32", "i64", "bool", ...) of a numpy dtype."""
    import numpy as np
    dt = np.dtype(dtype)
    if dt.byteorder == ">" or (dt.byteorder == "=" and np.little_endian is False):
        raise ValueError(f"dtype {dt}: only little-endian data is stored")
    try:
        return _DTYPES[dt.name]
    except KeyError:
        raise ValueError(f"dtype {dt} has no ferry name (known: {sorted(_DTYPES)})") from None


def _member_of(name, value):
    """(name, ferry dtype, shape, C-contiguous array) of one put_struct value."""
    import numpy as np
    override = None
    if isinstance(value, tuple):
        if len(value) != 2 or not isinstance(value[1], str):
            raise TypeError(f"member {name}: a value is an array or (array, dtype name)")
        value, override = value
    a = np.asarray(value)
    if not a.flags.c_contiguous:
        a = np.ascontiguousarray(a)   # keeps 0-d arrays 0-d, unlike ascontiguousarray alone
    if override is None:
        dt = dtype_name(a.dtype)
    else:
        dt = override
        if _ferry_dtype_size(dt) != a.dtype.itemsize:
            raise ValueError(f"member {name}: dtype {dt} does not match the array's {a.dtype} elements")
    return (name, dt, a.shape, a)


def _ferry_dtype_size(name):
    sizes = {"f64": 8, "f32": 4, "f16": 2, "bf16": 2, "i64": 8, "i32": 4, "i16": 2, "i8": 1,
             "u64": 8, "u32": 4, "u16": 2, "u8": 1, "bool": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}
    return sizes.get(name, 0)


class Store(_ferry.Store):
    """A client of the ferry store (Mooncake-style names).

    ``store = ferry.Store(); store.setup(master="10.0.0.1:7700",
    token_file="/etc/ferry/token")``; unset arguments come from FERRY_MASTER,
    FERRY_TOKEN, FERRY_TOKEN_FILE and FERRY_TRANSPORT. ``Store(**kw)``
    calls ``setup(**kw)`` at once when given arguments. A context manager:
    ``with Store(master=...) as s: ...`` closes at the end.

    Errors are :class:`ferry.Error` subclasses with ``.code`` (the negative
    FERRY_E* code) and the master's sentence as the message.
    """

    def __init__(self, **kw):
        if kw:
            self.setup(**kw)

    def put_struct(self, key, members, config=None):
        """Store a dict ``{name: array}`` as one structured object.

        A value is a numpy array (any array_like; copied only when not
        C-contiguous), or ``(array, dtype_name)`` to store it under another
        ferry dtype of the same element size: bfloat16 data goes in as
        ``(uint16_array, "bf16")``. Members keep the dict's order."""
        items = members.items() if hasattr(members, "items") else members
        raw = [_member_of(str(name), value) for name, value in items]
        return self.put_struct_raw(key, raw, config)

    def read_member(self, key, member, rows=None):
        """Rows ``[a, b)`` (``rows=(a, b)``, along dimension 0; None: all) of
        a member as a new numpy array of the member's dtype (bf16 comes back
        as uint16 words) and shape ``(b - a,) + shape[1:]``. A 0-d member
        has one row and comes back 0-d when rows is None."""
        import numpy as np
        for m in self.get_members(key):
            if m["name"] == member:
                break
        else:
            raise NotFoundError(f"{key}: no member {member!r}")
        shape = tuple(m["shape"])
        npdt = np.dtype(_NUMPY.get(m["dtype"], "uint8"))
        if m["dtype"] not in _NUMPY:   # fp8 and other 1-byte kinds: raw bytes
            if _ferry_dtype_size(m["dtype"]) != 1:
                raise ValueError(f"member {member}: dtype {m['dtype']} has no numpy type")
        if not shape:
            if rows not in (None, (0, 1)):
                raise ValueError("a 0-d member has one row: rows=(0, 1)")
            out = np.empty((), dtype=npdt)
            self.read_member_into(key, member, 0, 1, out)
            return out
        a, b = (0, shape[0]) if rows is None else rows
        if not (0 <= a <= b <= shape[0]):
            raise IndexError(f"rows ({a}, {b}) outside member {member} with {shape[0]} rows")
        out = np.empty((b - a,) + shape[1:], dtype=npdt)
        if out.nbytes:
            self.read_member_into(key, member, a, b, out)
        return out

    def list_all(self, prefix="", page=1000):
        """Every key with the prefix, paging through list_page."""
        keys, after = [], None
        while True:
            got, more = self.list_page(prefix, after, page)
            keys += got
            if not more or not got:
                return keys
            after = got[-1]
