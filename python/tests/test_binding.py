"""The cffi binding (ferry._binding, docs/python.md "One way to add a
call"): declared from include/ferry/*.h at build time, so every function
the library exports is callable, every constant has the compiler's value
and every struct the compiler's layout, and a blocking call releases the
GIL."""

import errno
import os
import re
import subprocess
import threading
import time

import pytest

import ferry
from ferry._binding import ffi, lib
from conftest import FERRY_BIN, cluster_fixture, store  # noqa: F401 (fixtures)

cluster = cluster_fixture(1, "binding")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def exported_functions():
    """The ferry_* functions libferry.so exports (nm -D)."""
    so = os.path.join(os.path.dirname(FERRY_BIN), "libferry.so")
    if not os.path.exists(so):
        pytest.skip(f"no libferry.so beside {FERRY_BIN} (set FERRY_BIN)")
    out = subprocess.run(["nm", "-D", "--defined-only", so], check=True, capture_output=True, text=True).stdout
    return sorted({m.group(1) for m in re.finditer(r" T (ferry_\w+)$", out, re.M)})


def test_every_exported_function_is_declared():
    names = exported_functions()
    assert len(names) > 100, names
    missing = [n for n in names if not hasattr(lib, n)]
    assert not missing, f"exported by libferry.so, not declared to cffi: {missing}"


def test_constants_have_the_compilers_values():
    assert lib.FERRY_ENOENT == -errno.ENOENT and lib.FERRY_EUNREACH == -errno.EHOSTUNREACH
    assert lib.FERRY_EAUTH == -(lib.FERRY_EBASE + 1)
    assert (lib.FERRY_VERSION_MAJOR, lib.FERRY_VERSION_MINOR, lib.FERRY_VERSION_PATCH) == \
        tuple(int(x) for x in ferry.__version__.split("."))
    assert lib.FERRY_REMOTE_RW == lib.FERRY_REMOTE_READ | lib.FERRY_REMOTE_WRITE
    assert 0 < lib.FERRY_DELTA_CROSSOVER < 1          # a floating macro, as a double


def test_struct_layout_is_the_headers():
    """Structs filled by C read back through the declared fields: a config
    by its _init() (the documented default timeout), a ferry_error by a
    refused call (its code beside its message)."""
    cfg = ffi.new("ferry_store_config *")
    assert lib.ferry_store_config_init(cfg) == 0
    assert cfg.timeout_ms == 10000
    h = ffi.new("ferry_store **")
    err = ffi.new("ferry_error *")
    cfg.lease_ms = lib.FERRY_STORE_LEASE_MAX_MS + 1  # refused before any connection
    rc = lib.ferry_store_open(cfg, h, err)
    assert rc == lib.FERRY_EINVAL and err.code == rc and h[0] == ffi.NULL
    assert ffi.string(err.msg), "a refused open names why"


def test_strerror_through_the_binding():
    assert ffi.string(lib.ferry_strerror(lib.FERRY_ENOENT)).decode() == ferry.strerror(-errno.ENOENT)


def test_a_blocking_call_releases_the_gil(store):  # noqa: F811
    """One thread waits 2 s in a barrier nobody else reaches; another keeps
    counting meanwhile. With the GIL held by the waiting call the counter
    would stand still for the 2 s."""
    counts, stop = [0], threading.Event()

    def count():
        while not stop.is_set():
            counts[0] += 1

    t = threading.Thread(target=count)
    t.start()
    try:
        start = counts[0]
        t0 = time.monotonic()
        with pytest.raises(ferry.TimeoutError):
            store.barrier("binding/gil", "a", 2, timeout_ms=2000)
        waited = time.monotonic() - t0
        during = counts[0] - start
    finally:
        stop.set()
        t.join()
    assert waited >= 1.9, waited
    assert during > 1000, f"the counting thread counted {during} times in the {waited:.1f} s wait"
