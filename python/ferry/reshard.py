"""Reshard planning: placement manifests, layouts, model presets, plans.

A pure, address-free planner (see docs/reshard.md and docs/manifest.md):
give it what a source holds and what each target fragment needs, and it
returns the overlap regions and the lowered byte runs.

    from ferry import reshard
    model = reshard.preset("qwen3-8b")
    src = reshard.build(model, "fsdp:8")
    dst = reshard.build(model, "tp:4,dp:2")
    plan = reshard.Plan(src, dst)
    for run in plan.runs(dst_rank=0):
        ...

Failures raise ``ferry.Error`` with ``.code`` (a negative FERRY_E* code)
and a message naming the tensor and fragment.

Execution (docs/exec.md, "Python"): bind each side's fragments to live
arrays with :class:`Binding`, then move the bytes between engines with
:func:`execute` (or :func:`attest` and :class:`Executor` for repeated runs).
"""

from collections import namedtuple

from . import _ferry
from ._ferry import Error, Manifest, Model, PlanCache as _PlanCache
from ._ferry import Binding, AttestedPlan, Executor, Engine

__all__ = [
    "Error", "Manifest", "Model", "Plan", "PlanCache", "Region", "Run", "Loop",
    "preset", "presets", "build", "parse_layout", "dtype_size",
    "LAYER_FIRST", "LAYER_LAST",
    "Binding", "AttestedPlan", "Executor", "Engine", "attest", "execute", "peers_of",
]

LAYER_FIRST = -1  # embedding side (first pipeline stage)
LAYER_LAST = -2   # final norm and lm_head (last pipeline stage)

Region = namedtuple(
    "Region", "tensor src_tensor src_fragment dst_fragment src_rank dst_rank offset shape bytes")
Region.__doc__ = "The box of a tensor a target fragment takes from a source fragment (global coordinates)."

Loop = namedtuple("Loop", "count src_stride dst_stride")

Run = namedtuple(
    "Run", "tensor src_fragment dst_fragment src_rank dst_rank src_object src_offset dst_offset len loops bytes")
Run.__doc__ = ("len contiguous bytes, repeated over nested loops (outermost first). Source offsets are into "
               "src_object when it is set, else into the source fragment's buffer.")

preset = _ferry.preset
presets = _ferry.presets
build = _ferry.build
parse_layout = _ferry.parse_layout
dtype_size = _ferry.dtype_size


class Plan:
    """Plan(src, dst, max_fragments=0, max_regions=0, max_overlaps=0).

    Freezes both manifests and keeps them alive. Limits of 0 take the
    library defaults.
    """

    def __init__(self, src, dst, **limits):
        self._p = _ferry.Plan(src, dst, **limits)

    @classmethod
    def _wrap(cls, p):
        self = cls.__new__(cls)
        self._p = p
        return self

    def stats(self):
        """tensors, fragments, regions, runs, bytes, max/mean bytes per target rank, plan_s, digests."""
        return self._p.stats()

    def regions(self, tensor=-1, src_rank=-1, dst_rank=-1):
        """Iterate Region tuples in plan order; -1 means any."""
        for t in self._p.iter("regions", tensor, src_rank, dst_rank):
            yield Region._make(t)

    def runs(self, tensor=-1, src_rank=-1, dst_rank=-1):
        """Iterate Run tuples in plan order; -1 means any."""
        for t in self._p.iter("runs", tensor, src_rank, dst_rank):
            yield Run(*t[:9], tuple(Loop._make(l) for l in t[9]), t[10])

    def __repr__(self):
        s = self.stats()
        return f"<reshard.Plan {s['tensors']} tensors, {s['regions']} regions, {s['runs']} runs, {s['bytes']} bytes>"


class PlanCache:
    """PlanCache(capacity=16): plans keyed by (source, target, topology) digests."""

    def __init__(self, capacity=16):
        self._c = _PlanCache(capacity)

    def get(self, src, dst, **limits):
        """Return (Plan, hit): a hit returns the cached plan without planning again."""
        p, hit = self._c.get(src, dst, **limits)
        return Plan._wrap(p), hit

    def __len__(self):
        return self._c.size()


# ---- execution -------------------------------------------------------------------------

def _plan_of(plan):
    return plan._p if isinstance(plan, Plan) else plan


def attest(plan, src, dst, generation=None):
    """AttestedPlan binding ``plan`` to both bindings' digests and ``generation``
    (default: the source binding's). StaleError when a binding is at another
    generation; Error (EINVAL) when it was validated against another placement."""
    if generation is None:
        generation = src.generation
    return AttestedPlan(_plan_of(plan), src, dst, generation)


def peers_of(binding, workers=None):
    """{worker: desc} from the entries of ``binding`` (the side a process
    reaches remotely): an entry's ``desc`` is the region descriptor covering
    its memory (Engine.register), one per worker; entries without one are
    skipped. ``workers`` limits the result."""
    peers = {}
    for e in binding.entries():
        w = e["worker"]
        if workers is not None and w not in workers:
            continue
        if not e["desc"]:
            continue   # not reachable from here; a run that needs it fails with NotFoundError
        if peers.setdefault(w, e["desc"]) != e["desc"]:
            raise ValueError(f"worker {w} has entries with different descriptors: one region per worker, "
                             "or pass peers=")
    return peers


def execute(plan, src_binding, dst_binding, mode="sink", *, engine, workers=None, peers=None, generation=None,
            window=8, notify_tag=0, guards=None, timeout_ms=60000, max_ops=0, max_bytes=0):
    """Run ``plan`` (a Plan or an AttestedPlan) for this process's workers and
    return the result dict: state ("COMPLETED"), error, bytes, ops, batches,
    bytes_done, pending, quarantined.

    mode: "sink" (this process holds source workers and WRITEs into target
    memory, then NOTIFY(notify_tag, generation) per target peer when
    notify_tag != 0) or "reader" (this process holds target workers and
    READs source memory). ``engine`` is this process's Engine; ``workers``
    the initiating workers it runs (default: every worker of the initiating
    binding); ``peers`` {remote worker: region descriptor bytes} (default:
    the ``desc`` of the remote binding's entries, see peers_of), imported
    into ``engine``. ``guards``: objects with ``.id``, ``.acquire()`` and
    ``.release()`` (a raise or a False return is a failure), acquired before
    any byte moves and released after. The run releases the GIL.

    Raises an Error subclass (StaleError for a changed or stale binding,
    NotFoundError for a selector naming no planned worker, ...) when the run
    does not complete; ``e.result`` is then the result dict (state ABORTED,
    FAILED_DRAINED or UNKNOWN) when the run started.
    """
    if mode not in ("sink", "reader"):
        raise ValueError(f"mode: 'sink' or 'reader', not {mode!r}")
    local, remote = (src_binding, dst_binding) if mode == "sink" else (dst_binding, src_binding)
    if isinstance(plan, AttestedPlan):
        attested = plan
    else:
        attested = attest(plan, src_binding, dst_binding, generation)
    if workers is None:
        workers = sorted({e["worker"] for e in local.entries()})
    if peers is None:
        peers = peers_of(remote)
    x = Executor(engine, mode, list(workers), peers, window=window, timeout_ms=timeout_ms, notify_tag=notify_tag,
                 guards=guards, max_ops=max_ops, max_bytes=max_bytes)
    try:
        return x.run(attested, src_binding, dst_binding)
    finally:
        x.close()
