"""What the Python calls over the cffi binding share (docs/python.md, "One
way to add a call"): arguments checked as the C extension checked them,
memory arguments under the same rules and messages, and a failed call's
``ferry_error`` raised as its :class:`ferry.Error` subclass."""

import operator

from . import _ferry
from ._binding import ffi, lib

U64_MAX = 2**64 - 1


def text(fn, pos, value):
    """A str argument as the NUL-terminated UTF-8 the C call takes."""
    if not isinstance(value, str):
        raise TypeError(f"{fn}() argument {pos} must be str, not {type(value).__name__}")
    b = value.encode()
    if b"\0" in b:
        raise ValueError("embedded null character")
    return b


def uint(value, what, lo=0, hi=U64_MAX):
    """An integer argument (anything with __index__) in lo..hi: the store's
    revisions, ids, counts and leases are unsigned, so a negative one is
    refused rather than wrapped around."""
    i = operator.index(value)
    if i < lo or i > hi:
        top = "2**64-1" if hi == U64_MAX else hi
        raise ValueError(f"{what} must be an integer from {lo} to {top}, not {i!r}")
    return i


def source(obj, what):
    """The memory of a source argument (C-contiguous) as (char *, nbytes);
    the pointer holds the memory until it is dropped."""
    if type(obj) is bytes:
        return ffi.from_buffer(obj), len(obj)
    return exported(_ferry._view(obj, what, False), "char[]", False)


def exported(view, ctype="char[]", writable=False):
    """(ctype pointer, nbytes) over the exporter of a checked memoryview
    (_ferry._view), the view itself released: the pointer holds the
    exporter, not a memoryview (a memoryview exported to cffi that ends up
    in cyclic garbage, an exception's frames, is cleared while exported and
    crashed the interpreter at exit)."""
    n, obj = view.nbytes, view.obj
    view.release()
    return ffi.from_buffer(ctype, obj, require_writable=writable), n


def str_of(chars):
    """A str from C's UTF-8 (undecodable bytes as surrogates)."""
    return ffi.string(chars).decode("utf-8", "surrogateescape")


def seq(obj, what):
    """A tuple copy of a sequence argument (it holds the items for the
    call); str and bytes refused."""
    if isinstance(obj, (str, bytes)):
        raise TypeError(f"{what} must be a list, not {type(obj).__name__}")
    try:
        return tuple(obj)
    except TypeError:
        raise TypeError(f"{what} must be a sequence") from None


def key(obj, what):
    """A str item (a key in a list) as NUL-terminated UTF-8."""
    if not isinstance(obj, str):
        raise TypeError(f"{what} must be str, not {type(obj).__name__}")
    b = obj.encode()
    if b"\0" in b:
        raise ValueError(f"{what} contains a NUL character")
    return b


def dest(obj, what):
    """The memory of a destination argument (C-contiguous, writable) as
    (char *, nbytes)."""
    return exported(_ferry._view(obj, what, True), "char[]", True)


_SENTINEL = {"int": -2**31, "int64_t": -2**63}


def results(n, ctype):
    """The per-item results of a batch call, each its sentinel (never
    written by the call), so that an item the call did not reach is seen."""
    return ffi.new(f"{ctype}[]", [_SENTINEL[ctype]] * n)


def results_list(rc, res, fe, ctype):
    """After a batch call that returned rc: the per-item results as a list,
    or the error when the call failed as a whole (the connection, the
    token, or an item it did not reach)."""
    out = list(res)
    if rc < 0:
        sentinel = _SENTINEL[ctype]
        whole = rc in (lib.FERRY_ECONNRESET, lib.FERRY_ECONNREFUSED, lib.FERRY_EAUTH)
        if whole or sentinel in out or not any(x < 0 for x in out):
            raise error(rc, fe)
    return out


def copy_str(struct, field, value, what):
    """value (bytes) into the char array field of a struct, NUL included;
    ValueError when it does not fit."""
    cap = len(getattr(struct, field))
    if len(value) >= cap:
        raise ValueError(f"{what} is longer than {cap - 1} bytes")
    setattr(struct, field, value)


_FIELDS = {}


def counters(struct):
    """{field: value} of a counters struct (ferry_*_stats), in the header's
    order, its reserved room left out: the names are the header's, never
    retyped."""
    t = ffi.typeof(struct)
    if t.kind == "pointer":
        t = t.item
    names = _FIELDS.get(t)
    if names is None:
        names = _FIELDS[t] = [f for f, _ in t.fields if f != "reserved"]
    return {f: getattr(struct, f) for f in names}


def strerror(code, /):
    """strerror(code) -> the text of a ferry error code"""
    return ffi.string(lib.ferry_strerror(code)).decode()


def error(rc, fe=None, msg=None):
    """The exception of a call that returned rc (its Error subclass, .code
    rc), with the sentence the call left in fe (or msg); MemoryError for
    FERRY_ENOMEM."""
    if rc == lib.FERRY_ENOMEM:
        return MemoryError()
    if fe is not None:
        msg = ffi.string(fe.msg).decode("utf-8", "replace")
    return _ferry._error(rc, msg or "")


def new_error():
    return ffi.new("ferry_error *")


__all__ = ["ffi", "lib", "text", "uint", "seq", "key", "copy_str", "source", "dest", "results", "results_list", "str_of", "strerror",
           "error", "new_error", "exported", "counters", "U64_MAX"]
