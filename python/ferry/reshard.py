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
"""

from collections import namedtuple

from . import _ferry
from ._ferry import Error, Manifest, Model, PlanCache as _PlanCache

__all__ = [
    "Error", "Manifest", "Model", "Plan", "PlanCache", "Region", "Run", "Loop",
    "preset", "presets", "build", "parse_layout", "dtype_size",
    "LAYER_FIRST", "LAYER_LAST",
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
