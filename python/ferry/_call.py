"""What the Python calls over the cffi binding share (docs/python.md, "One
way to add a call"): arguments checked as the C extension checked them,
memory arguments under the same rules and messages, and a failed call's
``ferry_error`` raised as its :class:`ferry.Error` subclass."""

import operator

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


def strerror(code, /):
    """strerror(code) -> the text of a ferry error code"""
    return ffi.string(lib.ferry_strerror(code)).decode()


__all__ = ["ffi", "lib", "text", "uint", "strerror", "U64_MAX"]
