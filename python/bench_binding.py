#!/usr/bin/env python3
"""Before/after of the Python binding (issue #33, item 4), in one run.

    python3 python/bench_binding.py --before /work/main/build/python \\
        --after build/python [--ferry build/ferry] [--rounds 3] [--json]

Starts one cluster (`ferry up --detach --size 1G` in a temporary --dir) and
measures, for each package directory (its PYTHONPATH), in a fresh
interpreter, alternating before and after for --rounds rounds so that both
see the same load:

- put_4k / get_4k: ops/s of Store.put(key, 4 KiB) and Store.get(key), one
  key after another (2,000 each);
- kv_put / kv_get: ops/s of Store.kv_put and Store.kv_get (2,000 each);
- put_from_256m / get_into_256m: GB/s of one 256 MiB put_from and one
  get_into of a numpy array (its memory registered, destination written in
  place), best of three;
- import_s: `import ferry` in a fresh interpreter, best of five;
- *_ns: one call that stays in the process (reshard.dtype_size,
  weights.key, samples.admit, Manifest.fragment), best of five runs of
  20,000: the binding's own cost per call, which the store's round trips
  above hide on a loaded machine.

Rounds alternate which side goes first. Reports each figure's median over
the rounds and after ÷ before as "ratio", oriented so that above 1 is
better (for import_s and *_ns, before ÷ after). The goals of #33: small ops
≥ 0.9, 256 MiB ≥ 0.97. The package under test is imported from the given
directory only (this file imports nothing of ferry itself).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

_CHILD = r'''
import json, sys, time
import numpy as np
import ferry
addr, token_file, tag = sys.argv[1], sys.argv[2], sys.argv[3]
n = 2000
res = {}
with ferry.Store(master=addr, token_file=token_file) as st:
    for attempt in range(200):                 # the last round's objects, once their read leases end
        try:
            st.remove_prefix("bench/")
            break
        except ferry.BusyError:
            time.sleep(0.05)
    small = b"x" * 4096
    for i in range(200):                       # warm the connection
        st.put(f"{tag}/w{i}", small)
    t = time.perf_counter()
    for i in range(n):
        st.put(f"{tag}/k{i}", small)
    res["put_4k"] = n / (time.perf_counter() - t)
    t = time.perf_counter()
    for i in range(n):
        st.get(f"{tag}/k{i}")
    res["get_4k"] = n / (time.perf_counter() - t)
    t = time.perf_counter()
    for i in range(n):
        st.kv_put(f"{tag}/kv{i}", b"v" * 64)
    res["kv_put"] = n / (time.perf_counter() - t)
    t = time.perf_counter()
    for i in range(n):
        st.kv_get(f"{tag}/kv{i}")
    res["kv_get"] = n / (time.perf_counter() - t)
    big = np.full(256 << 20, 7, dtype=np.uint8)
    out = np.zeros(256 << 20, dtype=np.uint8)
    st.register_buffer(big)
    st.register_buffer(out)
    best_put = best_get = 0.0
    for r in range(3):
        key = f"{tag}/big{r}"
        t = time.perf_counter()
        st.put_from(key, big)
        best_put = max(best_put, big.nbytes / (time.perf_counter() - t) / 1e9)
        ptr = out.ctypes.data
        t = time.perf_counter()
        st.get_into(key, out)
        best_get = max(best_get, out.nbytes / (time.perf_counter() - t) / 1e9)
        assert out.ctypes.data == ptr and out[-1] == 7, "get_into must write the array in place"
        out[:] = 0
    res["put_from_256m"], res["get_into_256m"] = best_put, best_get
# calls that stay in this process (no store round trip): what the binding
# itself costs per call, before (the C extension) and after (cffi)
from ferry import reshard, weights, samples
man = reshard.build(reshard.preset("qwen3-8b"), "tp:2")
for name, fn in (("dtype_size_ns", lambda: reshard.dtype_size("bf16")),
                 ("weights_key_ns", lambda: weights.key("m", 7, "w/0")),
                 ("admit_ns", lambda: samples.admit(5, 6, 1)),
                 ("manifest_fragment_ns", lambda: man.fragment(3))):
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(20000):
            fn()
        best = min(best, (time.perf_counter() - t) / 20000 * 1e9)
    res[name] = best
print(json.dumps(res))
'''


def _env(pkg):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.abspath(pkg)
    return env


def _import_s(pkg, tries=5):
    code = "import time; t = time.perf_counter(); import ferry; print(time.perf_counter() - t)"
    return min(float(subprocess.run([sys.executable, "-c", code], env=_env(pkg), check=True, capture_output=True,
                                    text=True).stdout) for _ in range(tries))


def _round(pkg, addr, token_file, tag):
    out = subprocess.run([sys.executable, "-c", _CHILD, addr, token_file, tag], env=_env(pkg), capture_output=True,
                         text=True)
    if out.returncode:
        raise SystemExit(f"bench_binding: the round on {pkg} failed:\n{out.stderr[-3000:]}")
    res = json.loads(out.stdout.strip().splitlines()[-1])
    res["import_s"] = _import_s(pkg)
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", required=True, help="package directory of the build before (its PYTHONPATH)")
    ap.add_argument("--after", required=True, help="package directory of the build after")
    ap.add_argument("--ferry", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build", "ferry"),
                    help="the ferry binary that runs the cluster (default build/ferry)")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--json", action="store_true", help="print the result as one JSON object")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ferry-bench-binding-") as home:
        subprocess.run([a.ferry, "up", "--detach", "--dir", home, "--size", "1G"], check=True, capture_output=True)
        try:
            with open(os.path.join(home, "master.addr")) as f:
                addr = f.read().strip()
            token_file = os.path.join(home, "token")
            runs = {"before": [], "after": []}
            for r in range(a.rounds):
                for side in (("before", "after") if r % 2 == 0 else ("after", "before")):   # both orders
                    runs[side].append(_round(getattr(a, side), addr, token_file, f"bench/{side}{r}"))
        finally:
            subprocess.run([a.ferry, "down", "--dir", home], capture_output=True)
    keys = list(runs["before"][0])
    med = {side: {k: statistics.median(x[k] for x in runs[side]) for k in keys} for side in runs}
    lower_is_better = [k for k in keys if k == "import_s" or k.endswith("_ns")]
    ratio = {k: (med["before"][k] / med["after"][k] if k in lower_is_better else med["after"][k] / med["before"][k])
             for k in keys}
    result = {"before": med["before"], "after": med["after"], "ratio": ratio, "rounds": a.rounds,
              "load": os.getloadavg()}
    if a.json:
        print(json.dumps(result))
    else:
        print(f"{'':16}{'before':>12}{'after':>12}{'ratio':>8}")
        for k in keys:
            unit = "s" if k == "import_s" else "ns/call" if k.endswith("_ns") else "GB/s" if "256m" in k else "ops/s"
            print(f"{k:16}{med['before'][k]:12.4g}{med['after'][k]:12.4g}{ratio[k]:8.3f}  {unit}")
        print(f"rounds {a.rounds}, load average at the end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
