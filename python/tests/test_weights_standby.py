"""ferry.WeightSubscriber with standby copies (docs/weights.md, "Standby
copies"): a DP2 group of two rank threads takes generations into its
standby arrays while a reader thread pins the active copy over and over
and checks that every read holds one whole generation."""

import threading
import time

import numpy as np
import pytest

import ferry
from conftest import cluster_fixture
from ferry import weights

TIMEOUT_MS = 20000
RUN_S = 60.0
SHAPES = {"a": (64, 48), "b": (300,), "c": (17, 5)}

cluster = cluster_fixture(1, "standby")


def _tensor(name, gen):
    """Tensor `name` of generation gen: every element names the generation
    (gen * 1e4 + its index), so a read of two generations cannot pass."""
    n = int(np.prod(SHAPES[name]))
    return (gen * 10000.0 + np.arange(n, dtype=np.float32) % 1000).reshape(SHAPES[name])


def _whole(arrays, gen):
    return all(np.array_equal(a, _tensor(n, gen) if gen else np.zeros(SHAPES[n], np.float32))
               for n, a in zip(SHAPES, arrays))


def _publish(cluster, gen, model="sbpy"):
    with cluster.store() as s:
        pub = ferry.WeightPublisher(s, model, 0, 1, timeout_ms=TIMEOUT_MS)
        pub.publish(gen, [(n, _tensor(n, gen)) for n in SHAPES])


def _ranks(fn):
    barrier = threading.Barrier(2, timeout=RUN_S)
    out = [None, None]

    def body(r):
        try:
            out[r] = fn(r, barrier)
        except BaseException as e:   # noqa: B902 - handed to the test
            out[r] = e

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(RUN_S)
        assert not t.is_alive(), "a rank thread did not finish in time"
    for r in out:
        if isinstance(r, BaseException):
            raise r
    return out


def _zeros(kind, shape):
    if kind == "torch":
        torch = pytest.importorskip("torch")
        return torch.zeros(shape, dtype=torch.float32)
    return np.zeros(shape, np.float32)


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_standby_reads_whole_generations(cluster, kind):
    model = "sbpy-" + kind
    _publish(cluster, 1, model)
    first = [[_zeros(kind, SHAPES[n]) for n in SHAPES] for _ in range(2)]
    second = [[_zeros(kind, SHAPES[n]) for n in SHAPES] for _ in range(2)]
    flips = [[], []]
    subs = [None, None]
    ready = threading.Event()
    updated = threading.Event()
    stop = threading.Event()
    seen = {"reads": 0, "bad": [], "gens": set(), "held": 0}

    def reader():
        # the first pin is held across the whole first update: the copy it
        # holds (generation 0, zeros) must stay whole while the other is written
        copy, gen, arrays = subs[0].read_begin()
        try:
            ready.set()
            while not updated.is_set() and not stop.is_set():
                seen["held"] += 1
                if not _whole(arrays, gen):
                    seen["bad"].append(("held", copy, gen))
            if not _whole(arrays, gen):   # once more, after the update
                seen["bad"].append(("held after", copy, gen))
        finally:
            subs[0].read_end(copy)
        while not stop.is_set():
            copy, gen, arrays = subs[0].read_begin()
            try:
                if not _whole(arrays, gen):
                    seen["bad"].append((copy, gen))
            finally:
                subs[0].read_end(copy)
            seen["reads"] += 1
            seen["gens"].add(gen)

    def rank(r, barrier):
        with cluster.store() as s:
            shards = [(n, None, a) for n, a in zip(SHAPES, first[r])]
            with ferry.WeightSubscriber(s, model, "sb", r, 2, shards, timeout_ms=TIMEOUT_MS,
                                        batch_bytes=1024, standby=second[r],
                                        on_flip=lambda c, g: flips[r].append((c, g))) as sub:
                assert sub.active[:2] == (0, 0)
                subs[r] = sub
                th = None
                if r == 0:
                    th = threading.Thread(target=reader, daemon=True)
                    th.start()
                    assert ready.wait(RUN_S)      # it holds copy 0 before any update
                try:
                    for gen in (1, 2):
                        barrier.wait()
                        if r == 0 and gen == 2:
                            _publish(cluster, 2, model)
                        barrier.wait()
                        st = sub.update()
                        if r == 0 and gen == 1:
                            updated.set()
                        assert st["generation"] == gen and sub.generation == gen
                        copy, g, arrays = sub.active
                        assert (copy, g) == (gen % 2, gen)
                        assert all(x is y for x, y in zip(arrays, (first, second)[copy][r]))   # the caller's
                        assert _whole(arrays, gen)
                        # the copy that was active holds the generation before
                        assert _whole((second if copy == 0 else first)[r], gen - 1)
                    return st
                finally:
                    if th is not None:
                        deadline = time.monotonic() + RUN_S   # a free read after the pin, then stop
                        while seen["reads"] == 0 and th.is_alive() and time.monotonic() < deadline:
                            time.sleep(0.001)
                        stop.set()
                        th.join(RUN_S)

    stats = _ranks(rank)
    assert all(st["bytes_received"] > 0 for st in stats)   # pushes landed in the standby copy
    assert flips == [[(1, 1), (0, 2)], [(1, 1), (0, 2)]]
    assert seen["bad"] == [] and seen["reads"] > 0 and seen["held"] > 0
    assert seen["gens"] <= {0, 1, 2}


def test_standby_bad_arguments(cluster):
    with cluster.store() as s:
        a = np.zeros(SHAPES["c"], np.float32)
        shards = [("c", None, a)]
        with pytest.raises(ValueError):   # not the shard's shape
            ferry.WeightSubscriber(s, "sbpy", "bad", 0, 1, shards, standby=[np.zeros((5, 17), np.float32)])
        with pytest.raises(ValueError):   # the shard's own memory
            ferry.WeightSubscriber(s, "sbpy", "bad", 0, 1, shards, standby=[a])
        with pytest.raises(ValueError):   # one per shard
            ferry.WeightSubscriber(s, "sbpy", "bad", 0, 1, shards, standby=[])
        with pytest.raises(TypeError):    # a callback needs standby arrays
            ferry.WeightSubscriber(s, "sbpy", "bad", 0, 1, shards, on_flip=print)
        with ferry.WeightSubscriber(s, "sbpy", "plain", 0, 1, shards) as sub:
            with pytest.raises(ferry.Error):
                sub.read_begin()
            with pytest.raises(ferry.Error):
                sub.active
