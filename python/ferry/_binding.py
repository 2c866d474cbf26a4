"""The cffi binding of the C library: ``ffi`` and ``lib``, declared from the
public headers ``include/ferry/*.h`` at build time (see
python/build_backend/ferry_cdef.py and docs/python.md, "One way to add a
call"). ``lib.ferry_*`` are the C functions, called with the GIL released;
``lib.FERRY_*`` the headers' constants; ``ffi.new("ferry_x *")`` allocates a
struct of the header's layout.
"""

from . import _ferry

_module = _ferry._cffi()
ffi = _module.ffi
lib = _module.lib

__all__ = ["ffi", "lib"]
