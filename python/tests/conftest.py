"""Shared by the tests that run against a real cluster: one `ferry master`
and some `ferry node` processes (FERRY_BIN, default build/ferry), started by
running_cluster() or by a module fixture made with cluster_fixture()."""

import contextlib
import os
import secrets
import selectors
import subprocess
import threading
import time

import pytest

import ferry

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FERRY_BIN = os.environ.get("FERRY_BIN", os.path.join(REPO, "build", "ferry"))
# the demos and benchmarks (ferry-lab, built beside ferry)
FERRY_LAB = os.environ.get("FERRY_LAB", os.path.join(os.path.dirname(FERRY_BIN), "ferry-lab"))
NODE_SIZE = 64 << 20
START_S = 30.0          # deadline for the master and each node to come up


def _kill(p):
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _log_tail(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()[-3000:]
    except OSError:
        return ""


def _wait_addr(path, proc, log, deadline):
    """HOST:PORT from the master's address file, polled until the deadline."""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"ferry master exited with {proc.returncode}:\n{_log_tail(log)}")
        try:
            with open(path) as f:
                addr = f.read().strip()
            if addr:
                return addr
        except FileNotFoundError:
            pass
        time.sleep(0.01)
    raise RuntimeError(f"ferry master did not write {path} in {START_S} s:\n{_log_tail(log)}")


def _wait_line(proc, word, deadline):
    """Read proc's stdout line by line until one contains word."""
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    seen = []
    buf = b""
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"no '{word}' line in {START_S} s; output so far: {seen}")
            if not sel.select(left):
                continue
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                raise RuntimeError(f"exited ({proc.wait()}) before '{word}'; output: {seen}")
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                text = line.decode(errors="replace")
                seen.append(text)
                if word in text:
                    return text
    finally:
        sel.close()


def _drain(stream):
    for _ in iter(lambda: stream.read(4096), b""):
        pass


class Cluster:
    """addr, token and token_file of a running cluster; procs: the master
    then each node (subprocess.Popen)."""

    def __init__(self, addr, token, token_file, procs):
        self.addr, self.token, self.token_file, self.procs = addr, token, token_file, procs

    def store(self, **kw):
        kw.setdefault("master", self.addr)
        kw.setdefault("token_file", self.token_file)
        return ferry.Store(**kw)


def require_ferry_bin():
    if not os.access(FERRY_BIN, os.X_OK):
        pytest.skip(f"no ferry binary at {FERRY_BIN} (set FERRY_BIN)")


def require_ferry_lab():
    require_ferry_bin()
    if not os.access(FERRY_LAB, os.X_OK):
        pytest.skip(f"no ferry-lab binary at {FERRY_LAB} (set FERRY_LAB)")


def _start(tmp, nodes, procs, drains, master_args):
    token = secrets.token_hex(32)
    tok = tmp / "token"
    tok.write_text(token + "\n")
    os.chmod(tok, 0o600)
    env = dict(os.environ)
    for k in ("FERRY_MASTER", "FERRY_TOKEN", "FERRY_TOKEN_FILE", "FERRY_FAULT"):
        env.pop(k, None)
    mlog = tmp / "master.log"
    with open(mlog, "wb") as lf:
        master = subprocess.Popen([FERRY_BIN, "master", "--dir", str(tmp / "m"), "--listen", "127.0.0.1:0",
                                   "--addr-file", str(tmp / "addr"), "--token-file", str(tok), *master_args],
                                  stdin=subprocess.DEVNULL, stdout=lf, stderr=subprocess.STDOUT, env=env)
    procs.append(master)
    addr = _wait_addr(tmp / "addr", master, mlog, time.monotonic() + START_S)
    for _ in range(nodes):
        node = subprocess.Popen([FERRY_BIN, "node", "--master", addr, "--size", f"{NODE_SIZE >> 20}M",
                                 "--token-file", str(tok)],
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=None, env=env)
        procs.append(node)
        _wait_line(node, "mounted", time.monotonic() + START_S)
        drain = threading.Thread(target=_drain, args=(node.stdout,), daemon=True)
        drain.start()
        drains.append((drain, node.stdout))
    c = Cluster(addr, token, str(tok), procs)
    # every node's segment is visible to clients before the tests start
    with c.store() as s:
        deadline = time.monotonic() + START_S
        while len(s.status()["segments"]) < nodes:
            assert time.monotonic() < deadline, s.status()
            time.sleep(0.01)
    return c


@contextlib.contextmanager
def running_cluster(tmp, nodes, master_args=()):
    """A master and `nodes` nodes under the directory tmp, yielded as a
    Cluster once every segment is mounted; all killed on exit."""
    procs, drains = [], []
    try:
        yield _start(tmp, nodes, procs, drains, master_args)
    finally:
        for p in reversed(procs):
            _kill(p)
        for t, stream in drains:
            t.join(5)        # the node is gone: its output ends
            if not t.is_alive():
                stream.close()


def cluster_fixture(nodes, name):
    """A module-scoped `cluster` fixture: running_cluster() with `nodes`
    nodes under a fresh temporary directory named after name."""

    @pytest.fixture(scope="module")
    def cluster(tmp_path_factory):
        require_ferry_bin()
        with running_cluster(tmp_path_factory.mktemp(name), nodes) as c:
            yield c

    return cluster


@pytest.fixture(scope="module")
def store(cluster):
    """A Store on the module's cluster (the module defines `cluster`)."""
    s = cluster.store()
    yield s
    s.close()


def run_threads(fns, timeout_s=120.0):
    """Run each of fns on a thread of its own (a rank each): (results,
    errors), an exception in the errors list where its function raised. Every
    thread must finish within timeout_s."""
    res, err = [None] * len(fns), [None] * len(fns)

    def run(i):
        try:
            res[i] = fns[i]()
        except BaseException as e:   # noqa: B902 - returned to the test
            err[i] = e
    ts = [threading.Thread(target=run, args=(i,)) for i in range(len(fns))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout_s)
    assert not any(t.is_alive() for t in ts), "a rank did not finish in time"
    return res, err
