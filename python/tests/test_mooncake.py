"""Mooncake's signatures where a Mooncake user types them (docs/store.md,
"Mooncake calls in ferry"): a Mooncake-style script runs unchanged but for
its import and setup line, and with_hard_pin really pins."""

import os
import subprocess
import sys

import numpy as np
import pytest

import ferry
from conftest import NODE_SIZE, cluster_fixture

cluster = cluster_fixture(1, "mooncake")

HERE = os.path.dirname(os.path.abspath(__file__))


def test_mooncake_snippet_runs_unchanged(cluster):
    pytest.importorskip("torch")
    env = dict(os.environ, FERRY_MASTER=cluster.addr, FERRY_TOKEN_FILE=cluster.token_file)
    env.pop("FERRY_TOKEN", None)
    p = subprocess.run([sys.executable, os.path.join(HERE, "mooncake_snippet.py")], env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    lines = p.stdout.splitlines()
    print("\n".join(lines))
    assert lines[0] == f"zero-copy ok {512 * 512 * 4}"
    assert lines[1] == f"batch ok {[512 * 512] * 4}"
    assert lines[2] == "batch_is_exist [1, 0]" and lines[3] == f"get_size {512 * 512 * 4}"
    assert lines[4] == "upsert ok"
    assert lines[5] == "tensors ok torch.bfloat16 (64, 32)"
    assert lines[6] == "close 0"


def test_signatures_are_mooncakes(store):
    a = np.arange(1024, dtype=np.uint8)
    assert store.register_buffer(a.ctypes.data, a.nbytes) == 0
    try:
        assert store.put_from("sig/a", a.ctypes.data, 512) == 0            # the first 512 bytes
        assert store.get_size("sig/a") == 512
        assert store.put_from(key="sig/b", buffer=a.ctypes.data, size=16, config=None) == 0
        out = np.zeros(16, np.uint8)
        assert store.get_into("sig/b", out) == 16 and np.array_equal(out, a[:16])
        with pytest.raises(ValueError, match="not inside a buffer registered"):
            store.put_from("sig/c", a.ctypes.data + 1000, 100)             # runs past the registration
        assert not store.is_exist("sig/c")
        with pytest.raises(TypeError, match="needs its size"):
            store.put_from("sig/c", a.ctypes.data)
    finally:
        assert store.unregister_buffer(a.ctypes.data) == 0
    # ferry's own forms keep working: a buffer with the config third
    assert store.put_from("sig/d", a, ferry.ReplicateConfig(replica_num=1)) == 0
    assert store.batch_put_from(["sig/e"], [a], {"replica_num": 1}) == [0]
    cfg = ferry.ReplicateConfig()
    cfg.with_hard_pin = True
    assert cfg.hard_pin and cfg.replica_num == 1
    cfg.preferred_segment = "host:1234"
    with pytest.raises(TypeError, match="names segments by their id"):
        store.put("sig/f", b"x", cfg)
    assert store.batch_is_exist(["sig/a", "sig/none"]) == [1, 0]
    with pytest.raises(ferry.NotFoundError):
        store.get_size("sig/none")


def test_upsert_waits_for_a_readers_lease(cluster):
    with cluster.store(lease_ms=300) as s:
        s.put("ups/a", b"old")
        assert s.get("ups/a") == b"old"                   # leased to this reader for 300 ms
        with pytest.raises(ferry.BusyError, match=r"leased to a reader for \d+ ms more"):
            s.upsert("ups/a", b"new", timeout_ms=0)
        assert s.get("ups/a") == b"old"                   # refused: nothing changed
        assert s.upsert("ups/a", b"new") == 0             # waits for the lease to lapse
        assert s.get("ups/a") == b"new"
        assert s.upsert("ups/none", b"x") == 0 and s.get("ups/none") == b"x"


def test_with_hard_pin_survives_eviction(store):
    """A hard-pinned object stays while soft ones are evicted for room."""
    blob = np.ones(NODE_SIZE // 8, np.uint8)
    cfg = ferry.ReplicateConfig()
    cfg.with_hard_pin = True
    assert store.put_from("pin/kept", blob, cfg) == 0
    for i in range(12):                                   # 1.5 nodes' worth of soft objects
        assert store.put_from(f"pin/soft/{i}", blob) == 0
    assert store.is_exist("pin/kept") == 1
    soft = store.batch_is_exist([f"pin/soft/{i}" for i in range(12)])
    assert soft[-1] == 1 and soft.count(0) >= 5, soft    # the oldest soft ones made room
