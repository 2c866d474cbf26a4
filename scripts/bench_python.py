#!/usr/bin/env python3
"""Before/after benchmark of the Python binding, both sides in one run.

    /usr/bin/python3 scripts/bench_python.py --before DIR [--after DIR] [--rounds N] [--json]

DIR is a PYTHONPATH holding a ``ferry`` package (``build/python`` after
``make``; ``--after`` defaults to this checkout's). One cluster (a master
and a 1 GiB node of FERRY_BIN, default build/ferry) serves both; each round
runs a fresh interpreter per side, the sides alternating, and the medians
over the rounds are printed with after/before ratios:

- ``put_get_4k_ops``: 4 KiB ``put`` + ``get`` pairs per second, and
  ``put_get_4k_cpu_us`` the client process's CPU time per pair;
- ``kv_ops``: ``kv_put`` + ``kv_get`` pairs of 64-byte values per second,
  ``kv_cpu_us`` the same CPU time;
- ``put_from_256m_gbps`` / ``get_into_256m_gbps``: one 256 MiB numpy array
  (touched first) stored and read back in place;
- ``import_s``: ``import ferry`` in a fresh interpreter (torch not loaded);
- ``call_ns``: one ``ferry_log_get_level()`` through the side's binding (the
  C extension's ``_log_get_level`` where it has no cffi module) and, for the
  after side, the same call through cffi in ABI mode over ``libferry.so``
  (``abi_call_ns``, FERRY_LIBFERRY, default build/libferry.so).

The machine's load average is printed with the figures: compare the ratios
of one run, never figures of two runs.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "python", "tests"))

SMALL = 4096
BIG = 256 << 20
CALLS = 200000


def _rate(fn, n):
    """(calls per second of wall time, CPU microseconds of this process per
    call): on a loaded machine the first is mostly the scheduler's, the
    second what the binding costs."""
    t, c = time.perf_counter(), time.process_time()
    for i in range(n):
        fn(i)
    return n / (time.perf_counter() - t), (time.process_time() - c) / n * 1e6


def worker(addr, token_file, libferry):
    """One side's figures, as a JSON line on stdout."""
    t = time.perf_counter()
    import ferry
    out = {"import_s": time.perf_counter() - t}
    import numpy as np
    try:
        from ferry._binding import lib
        get_level = lib.ferry_log_get_level
    except ImportError:
        get_level = ferry._ferry._log_get_level
    t = time.perf_counter()
    for _ in range(CALLS):
        get_level()
    out["call_ns"] = (time.perf_counter() - t) / CALLS * 1e9
    if libferry:
        import cffi
        from ferry._binding import ffi as api_ffi
        abi = cffi.FFI()
        abi.cdef("int ferry_log_get_level(void);")
        abi_level = abi.dlopen(libferry).ferry_log_get_level
        t = time.perf_counter()
        for _ in range(CALLS):
            abi_level()
        out["abi_call_ns"] = (time.perf_counter() - t) / CALLS * 1e9
        del api_ffi
    with ferry.Store(master=addr, token_file=token_file) as s:
        small = os.urandom(SMALL)
        pid = os.getpid()
        n = 2000

        def put_get(i):
            s.put(f"b/{pid}/{i}", small)
            s.get(f"b/{pid}/{i}")
        out["put_get_4k_ops"], out["put_get_4k_cpu_us"] = _rate(put_get, n)
        s.remove_prefix(f"b/{pid}/")
        val = b"v" * 64

        def kv(i):
            s.kv_put(f"k/{pid}/{i % 64}", val)
            s.kv_get(f"k/{pid}/{i % 64}")
        out["kv_ops"], out["kv_cpu_us"] = _rate(kv, n)
        a = np.ones(BIG, dtype=np.uint8)
        b = np.zeros(BIG, dtype=np.uint8)
        t = time.perf_counter()
        s.put_from(f"big/{pid}", a)
        out["put_from_256m_gbps"] = BIG / (time.perf_counter() - t) / 1e9
        t = time.perf_counter()
        s.get_into(f"big/{pid}", b)
        out["get_into_256m_gbps"] = BIG / (time.perf_counter() - t) / 1e9
        assert b[0] == 1 and b[-1] == 1
        deadline = time.monotonic() + 30
        while True:   # the read's lease lapses after a second or so
            try:
                s.remove(f"big/{pid}")
                break
            except ferry.BusyError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
    print(json.dumps(out))


def _side(path, c, libferry):
    env = dict(os.environ, PYTHONPATH=path)
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", c.addr, c.token_file,
                        libferry or ""], env=env, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise SystemExit(f"bench_python: the side {path} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description="before/after figures of the Python binding, in one run")
    ap.add_argument("--before", help="PYTHONPATH of the package to compare against")
    ap.add_argument("--after", default=os.path.join(REPO, "build", "python"), help="PYTHONPATH of this package")
    ap.add_argument("--rounds", type=int, default=5, help="rounds, the sides alternating (default 5)")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    ap.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        return worker(a.worker[0], a.worker[1], a.worker[2] or None)
    if not a.before:
        ap.error("--before DIR is needed")
    libferry = os.environ.get("FERRY_LIBFERRY", os.path.join(REPO, "build", "libferry.so"))
    sys.path.insert(0, a.after)          # conftest imports ferry: this side's
    import conftest
    conftest.NODE_SIZE = 1 << 30
    sides = {"before": [], "after": []}
    with tempfile.TemporaryDirectory(prefix="ferry-bench-py-") as tmp:
        import pathlib
        with conftest.running_cluster(pathlib.Path(tmp), 1) as c:
            for _ in range(a.rounds):
                sides["before"].append(_side(a.before, c, None))
                sides["after"].append(_side(a.after, c, libferry))
    med = {k: {f: statistics.median(r[f] for r in v) for f in v[0]} for k, v in sides.items()}
    ratio = {f: med["after"][f] / med["before"][f] for f in med["before"]}
    res = {"load_average": os.getloadavg(), "rounds": a.rounds, "before": med["before"], "after": med["after"],
           "after_over_before": ratio}
    if a.json:
        print(json.dumps(res, indent=1))
        return
    print(f"load average {res['load_average'][0]:.2f} {res['load_average'][1]:.2f} {res['load_average'][2]:.2f}; "
          f"medians of {a.rounds} rounds")
    print(f"{'':22} {'before':>12} {'after':>12} {'after/before':>13}")
    for f in med["after"]:
        b = med["before"].get(f)
        print(f"{f:22} {b if b is not None else float('nan'):12.4g} {med['after'][f]:12.4g} "
              f"{ratio[f] if f in ratio else float('nan'):13.3f}")


if __name__ == "__main__":
    main()
