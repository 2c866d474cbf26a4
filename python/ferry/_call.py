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
    v = _ferry._view(obj, what, False)
    return ffi.from_buffer(v), v.nbytes


def str_of(chars):
    """A str from C's UTF-8 (undecodable bytes as surrogates)."""
    return ffi.string(chars).decode("utf-8", "surrogateescape")


def strerror(code, /):
    """strerror(code) -> the text of a ferry error code"""
    return ffi.string(lib.ferry_strerror(code)).decode()


def error(rc, fe=None, msg=None):
    """The exception of a call that returned rc (its Error subclass, .code
    rc), with the sentence the call left in fe (or msg)."""
    if fe is not None:
        msg = ffi.string(fe.msg).decode("utf-8", "replace")
    return _ferry._error(rc, msg or "")


def new_error():
    return ffi.new("ferry_error *")


__all__ = ["ffi", "lib", "text", "uint", "source", "str_of", "strerror", "error", "new_error", "U64_MAX"]
