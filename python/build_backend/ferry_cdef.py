"""Generate the C source of ``ferry._ferry_cffi`` from the public headers.

Run at build time (CMake's ``ferry_cffi_src`` rule, and so ``pip install``):

    python3 ferry_cdef.py CC INCLUDE_DIR BRIDGE_H OUT_C

The declarations given to ``cffi.FFI.cdef`` are ``include/ferry/ferry.h``
as the C compiler preprocesses it, cut to the lines that come from
``include/ferry/`` (the system headers it includes are cffi's own types);
the integer constants are the headers' object-like ``FERRY_*`` macros,
declared ``#define NAME ...`` so that their values come from the compiler
too. Nothing of a struct is typed here: its layout is the header's, and the
module cffi emits checks it against the compiler's at build time (API mode).
BRIDGE_H, the small C that cffi cannot express (python/ferry/_cffi_bridge.h),
is declared from its own ``FP_CDEF`` section and compiled into the module.

The generator needs the ``cffi`` package (python3-cffi) in the interpreter
that runs it, not in the one the module is built for: the emitted C is the
same for every CPython, so CMake runs it with the first interpreter that has
cffi. The module needs ``_cffi_backend`` where it is imported.
"""

import os
import re
import subprocess
import sys

_ATTR = re.compile(r"__attribute__\s*\(\((?:[^()]|\((?:[^()]|\([^()]*\))*\))*\)\)")
_MARKER = re.compile(r'^# \d+ "([^"]+)"')


def _preprocess(cc, include, extra=()):
    cmd = [cc, "-E", "-std=c11", "-D_GNU_SOURCE", "-I", include, *extra, os.path.join(include, "ferry", "ferry.h")]
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def declarations(cc, include):
    """The preprocessed declarations of include/ferry/*.h, attributes dropped."""
    ours = os.path.realpath(os.path.join(include, "ferry")) + os.sep
    keep, mine = [], False
    for line in _preprocess(cc, include).splitlines():
        m = _MARKER.match(line)
        if m:
            mine = os.path.realpath(m.group(1)).startswith(ours)
            continue
        if mine and line.strip():
            keep.append(line)
    return _ATTR.sub("", "\n".join(keep)) + "\n"


def constants(cc, include):
    """``#define NAME ...`` of every integer FERRY_* macro of the headers,
    ``static const double NAME;`` of a floating one (strings are left out)."""
    names = set()
    for h in sorted(os.listdir(os.path.join(include, "ferry"))):
        with open(os.path.join(include, "ferry", h)) as f:
            names.update(re.findall(r"^#define (FERRY_\w+)[ \t]+\S", f.read(), re.M))
    out = []
    for line in _preprocess(cc, include, ("-dM",)).splitlines():
        m = re.match(r"#define (FERRY_\w+) (.+)$", line)
        if m and m.group(1) in names and '"' not in m.group(2) and "__attribute__" not in m.group(2):
            floating = re.search(r"\d\.\d*|\d[eE][-+]?\d", m.group(2))
            out.append(f"static const double {m.group(1)};" if floating else f"#define {m.group(1)} ...")
    return "\n".join(sorted(out)) + "\n"


def bridge_cdef(path):
    """The declarations between ``FP_CDEF begin`` and ``FP_CDEF end`` of the
    bridge header, ``FP_PYTHON(prototype)`` as cffi's ``extern "Python+C"``
    (a function written in Python that the bridge's C calls)."""
    with open(path) as f:
        text = f.read()
    m = re.search(r"/\* FP_CDEF begin \*/\n(.*?)/\* FP_CDEF end \*/", text, re.S)
    if not m:
        raise SystemExit(f"ferry_cdef: {path} has no FP_CDEF section")
    return re.sub(r"FP_PYTHON\((.*?;)\)", r'extern "Python+C" \1', m.group(1))


def main(argv):
    if len(argv) != 5:
        raise SystemExit("usage: ferry_cdef.py CC INCLUDE_DIR BRIDGE_H OUT_C")
    cc, include, bridge, out = argv[1:]
    import cffi
    ffi = cffi.FFI()
    ffi.cdef(declarations(cc, include) + constants(cc, include) + bridge_cdef(bridge))
    ffi.set_source("ferry._ferry_cffi", f'#include "ferry/ferry.h"\n#include "{os.path.basename(bridge)}"\n')
    tmp = out + ".tmp"
    ffi.emit_c_code(tmp)
    os.replace(tmp, out)


if __name__ == "__main__":
    main(sys.argv)
