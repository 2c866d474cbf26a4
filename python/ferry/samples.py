"""ferry.samples: rollout/update disaggregation (docs/samples.md, "Python").

- :class:`RolloutSession`, :class:`UpdateSession`, :class:`PolicyVersion` —
  the versioned records, Mooncake-RFC field names; ``to_json()`` and
  ``from_json()`` go through the C encoders, so Python and C write the same
  bytes (canonical: sorted keys, compact).
- :class:`PolicyRegistry` — a model's policy versions: ``publish`` announces
  version v as weight generation v (one compare-and-swap carries both),
  ``current``, ``history``, ``watch`` (a :class:`PolicyWatch`).
- :class:`SampleQueue` — rollout workers ``push`` samples (token ids, logprobs,
  rewards); update workers ``pop`` them under a lease with the version rule
  applied (``max_policy_lag``; stale ones dropped or sent for recompute),
  ``read`` the payload and ``ack`` after the optimizer step.
- :class:`KVCacheGate` — KV cache objects kept under the policy version that
  made them; a read under another version raises :class:`StaleError`.

Errors are :class:`ferry.Error` subclasses: ``QueueFullError`` (a full
bounded queue with ``fail_when_full``), ``TimeoutError``, ``StaleError``, ...
Every call that touches the store runs with the GIL released.
"""

import dataclasses
import json
import time
from dataclasses import dataclass, field

from . import _samples
from . import _tensors
from ._ferry import QueueFullError

__all__ = ["RolloutSession", "UpdateSession", "PolicyVersion", "PolicyRegistry", "PolicyWatch", "SampleQueue",
           "Sample", "KVCacheGate", "QueueFullError", "admit"]


def _meta_text(metadata):
    if metadata is None:
        return None
    if not isinstance(metadata, dict):
        raise TypeError(f"metadata must be a dict, not {type(metadata).__name__}")
    return json.dumps(metadata, ensure_ascii=False, allow_nan=False)


def _meta_of(text):
    return {} if text is None else json.loads(text)


class _Record:
    """to_json()/from_json() over the C encoder named by _c."""

    def _dict(self):
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["metadata"] = _meta_text(d["metadata"])
        for k, v in d.items():
            if isinstance(v, (list, tuple)):
                d[k] = [str(x) for x in v]
        return d

    @classmethod
    def _of(cls, d):
        d = dict(d)
        d["metadata"] = _meta_of(d["metadata"])
        return cls(**d)

    def to_json(self):
        """The canonical JSON text of the record (the C library's bytes)."""
        return getattr(_samples, self._c + "_to_json")(self._dict())

    @classmethod
    def from_json(cls, text):
        """Parse JSON text (str or bytes); ferry.Error (FERRY_EPROTO) names a
        missing, mistyped or over-long field."""
        return cls._of(getattr(_samples, cls._c + "_from_json")(text))


@dataclass
class RolloutSession(_Record):
    """A rollout-side unit of generation. References are
    ``"store://KEY#MEMBER"`` or "" (none); ``SampleQueue.push`` fills the
    prompt/output/logprob/reward refs and sets status "ready_for_update"."""
    _c = "rollout_session"
    session_id: str = ""
    episode_id: str = ""
    request_id: str = ""
    policy_version: int = 0
    prompt_ref: str = ""
    output_ref: str = ""
    logprob_ref: str = ""
    reward_ref: str = ""
    kv_ref: str = ""
    status: str = "generating"   # "generating", "ready_for_update", "trained", "dropped", "recompute"
    metadata: dict = field(default_factory=dict)


@dataclass
class UpdateSession(_Record):
    """An update-side training step (output_policy_version 0: not produced yet)."""
    _c = "update_session"
    update_id: str = ""
    input_policy_version: int = 0
    output_policy_version: int = 0
    trajectory_refs: list = field(default_factory=list)
    reward_refs: list = field(default_factory=list)
    logprob_refs: list = field(default_factory=list)
    status: str = "running"   # "running", "done", "failed"
    metadata: dict = field(default_factory=dict)


@dataclass
class PolicyVersion(_Record):
    """A policy version: ``version_id`` is the weight generation that carries
    it (``weight_generation`` equals it once announced)."""
    _c = "policy_version"
    version_id: int = 0
    parent_version_id: int = 0
    created_at_step: int = 0
    weight_generation: int = 0
    model: str = ""
    metadata: dict = field(default_factory=dict)


def admit(sample_version, input_version, max_policy_lag=0):
    """The lag rule: "admit" (input - lag <= sample <= input), "stale" or "ahead"."""
    return _samples.policy_admit(int(sample_version), int(input_version), int(max_policy_lag))


# ---- the policy registry --------------------------------------------------------------------

class PolicyWatch(_samples.PolicyWatch):
    """New versions of a model, by a watch on its announcing key (no polling).
    ``next(timeout_ms=-1)``: the next version newer than any returned so far
    (the current one first, if any), or None once timeout_ms passed;
    versions announced in between are skipped. A context manager; iterating
    blocks for each next version."""

    def next(self, timeout_ms=-1):
        d = super().next(int(timeout_ms))
        return None if d is None else PolicyVersion._of(d)

    def __iter__(self):
        return self

    def __next__(self):
        return self.next(-1)


def _publish_item(i, t):
    from .weights import _tensor_item
    return _tensor_item(i, t)


class PolicyRegistry:
    """The policy versions of ``model`` in ``store``."""

    def __init__(self, store, model):
        self.store, self.model = store, model

    def current(self):
        """The current :class:`PolicyVersion`, or None when none was announced.
        A generation announced by a plain weight publish reads as a version
        without parent or metadata."""
        d = _samples.policy_current(self.store, self.model)
        return None if d is None else PolicyVersion._of(d)

    def history(self):
        """Announced versions, oldest first (the last 1024)."""
        return [PolicyVersion._of(d) for d in _samples.policy_history(self.store, self.model)]

    def watch(self):
        """A :class:`PolicyWatch` of this model (close it, or use ``with``)."""
        return PolicyWatch(self.store, self.model)

    def publish(self, version, tensors, *, parent=0, created_at_step=0, metadata=None, rank=0, world=1,
                rank_node=None, out_dtype=None, segment=0, keep=2, timeout_ms=60000):
        """Publish ``version`` (an int, or a :class:`PolicyVersion` whose
        fields are used) as weight generation ``version`` from trainer rank
        ``rank`` of ``world`` (every rank calls it with the same ordered
        tensors, as ``WeightPublisher.publish``): the version and its weights
        become current together, or neither does. ``parent`` must be older
        than ``version`` (0: none). Returns this rank's publish stats (plus
        ``version``)."""
        if isinstance(version, PolicyVersion):
            pv = dataclasses.replace(version, model=self.model)
        else:
            pv = PolicyVersion(version_id=int(version), parent_version_id=int(parent),
                               created_at_step=int(created_at_step), model=self.model, metadata=metadata or {})
        if rank_node is None:
            rank_node = [0] * world
        items = [_publish_item(i, t) for i, t in enumerate(tensors)]
        return _samples.policy_publish(self.store, self.model, int(rank), int(world), [int(n) for n in rank_node],
                                     out_dtype or "", int(segment), int(keep), int(timeout_ms), pv._dict(), items)

    def __repr__(self):
        return f"PolicyRegistry(model={self.model!r})"


# ---- sample queues ----------------------------------------------------------------------------

class Sample:
    """A popped sample: ``session`` (a :class:`RolloutSession`), ``id`` and
    ``token`` (the queue record and its delivery), ``uid``, ``pushed_at_ms``,
    ``popped_at_ms``, ``prompt_len``, ``ntokens``, ``nrewards``, ``payload``
    (the payload object's key; "" for a recompute request)."""

    __slots__ = ("_c", "session")

    def __init__(self, c):
        self._c = c
        self.session = RolloutSession._of(c.session)

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._c, name)

    def __repr__(self):
        return (f"Sample(session_id={self.session.session_id!r}, policy_version={self.session.policy_version}, "
                f"id={self._c.id}, token={self._c.token}, ntokens={self._c.ntokens})")


def _c_samples(samples):
    return [s._c if isinstance(s, Sample) else s for s in samples]


def _array(a, dtype, what):
    import numpy as np
    if _tensors.is_torch(a) or (not isinstance(a, np.ndarray) and hasattr(a, "__dlpack__")):
        a, _ = _tensors.as_numpy(a, what)      # shares the tensor's memory
    a = np.asarray(a)
    want = np.dtype(dtype)
    if a.dtype != want:
        if want.kind == "i" and a.dtype.kind in "iu" and a.size and (a.min() < -2**31 or a.max() >= 2**31):
            raise ValueError(f"{what}: values do not fit int32")
        if want.kind == "i" and a.dtype.kind not in "iu" and a.size:
            raise TypeError(f"{what}: token ids must be integers, not {a.dtype}")
        a = a.astype(want)
    return np.ascontiguousarray(a.reshape(-1))


class SampleQueue(_samples.SampleQueue):
    """A leased sample queue (payloads under ``ferry/rl/<queue>/``).

    Producer side: ``bound`` (> 0 sets the queue's bound, records
    outstanding), ``fail_when_full`` (push raises :class:`QueueFullError`
    at once instead of waiting for room), ``push_timeout_ms`` (waiting for
    room or the master; 0: 60000). Consumer side: ``input_version`` (the
    policy version being trained), ``max_policy_lag`` (0: that version
    only), ``stale_policy`` ("drop" or "recompute"), ``lease_ms`` (0:
    30000), ``consumer`` (names the consumer in claims). One queue object
    per thread: a second thread's call raises BusyError (``stats()``
    excepted). A context manager."""

    def push(self, session, tokens, logprobs, rewards, prompt=None):
        """Store the payload and push the record; returns the record id.
        ``tokens``/``prompt``: int32 token ids; ``logprobs`` (one per token)
        and ``rewards``: float32 (other numeric arrays are converted). A
        :class:`RolloutSession` is updated in place (refs, status). A full
        queue waits up to push_timeout_ms (TimeoutError) or raises
        QueueFullError with fail_when_full; nothing is left behind."""
        rs = session if isinstance(session, RolloutSession) else RolloutSession(**session)
        t = _array(tokens, "int32", "tokens")
        lp = _array(logprobs, "float32", "logprobs")
        rw = _array(rewards, "float32", "rewards")
        p = None if prompt is None else _array(prompt, "int32", "prompt")
        rid, d = super().push(rs._dict(), t, lp, rw, p)
        back = RolloutSession._of(d)
        for f in ("prompt_ref", "output_ref", "logprob_ref", "reward_ref", "status"):
            setattr(rs, f, getattr(back, f))
        return rid

    def pop(self, max=1, timeout_ms=0):
        """Lease up to ``max`` records and apply the version rule; returns the
        admitted :class:`Sample` list (possibly empty: stale, ahead and
        duplicate records are handled and counted in stats()). With
        ``timeout_ms`` > 0, pops again until at least one sample is admitted
        or the deadline passes."""
        deadline = time.monotonic() + timeout_ms / 1000.0
        wait = 0.002
        while True:
            got = super().pop(int(max))
            left = deadline - time.monotonic()
            if got or timeout_ms <= 0 or left <= 0:
                return [Sample(c) for c in got]
            time.sleep(min(wait, left))   # the queue has no wake-up: back off, 2 ms to 50 ms
            wait = min(wait * 2, 0.05)

    def pop_recompute(self, max=1):
        """Rollout side: lease up to ``max`` samples the consumers sent back for
        recompute (sessions only). Ack them after pushing the recomputed one."""
        return [Sample(c) for c in super().pop_recompute(int(max))]

    def read(self, sample, framework="numpy"):
        """The payload of a popped sample: ``{"prompt", "tokens", "logprobs",
        "rewards"}`` as new numpy arrays (int32, int32, float32, float32), or
        torch tensors with ``framework="torch"``."""
        c = sample._c if isinstance(sample, Sample) else sample
        fw = _tensors.check_framework(framework)
        out = {"prompt": _tensors.empty((c.prompt_len,), "i32", fw),
               "tokens": _tensors.empty((c.ntokens,), "i32", fw),
               "logprobs": _tensors.empty((c.ntokens,), "f32", fw),
               "rewards": _tensors.empty((c.nrewards,), "f32", fw)}
        super().read(c, *(a if n else None for a, n in
                          zip(out.values(), (c.prompt_len, c.ntokens, c.ntokens, c.nrewards))))
        return out

    def ack(self, samples):
        """After the optimizer step: ack each sample (trained, exactly once)
        and remove its payload. Returns a bool per sample: False for one whose
        lease lapsed and that was delivered again (not acked; counted
        ack_stale)."""
        return super().ack(_c_samples(samples))

    def release(self, samples):
        """Give samples back for another consumer now (nack)."""
        return super().release(_c_samples(samples))

    def set_version(self, input_version):
        """The consumer's new input version (after an optimizer step)."""
        return super().set_version(int(input_version))


class KVCacheGate(_samples.KVCacheGate):
    """KV cache objects under ``ferry/kv/<ns>/<version>/<name>``:
    ``put(version, name, data) -> ref``; ``get(ref, active_version) -> bytes``
    raises :class:`StaleError` (nothing read, counted refused) when the
    reference was made under another version; ``get_into(ref,
    active_version, buffer) -> bytes read``; ``retire(version) -> removed``
    removes every KV object of that version and nothing else; ``stats()``
    -> {stored, hits, refused, retired} of this gate."""

    @staticmethod
    def ref_version(ref):
        """The policy version a KV reference was made under."""
        return _samples.kvcache_ref_version(ref)

    def __repr__(self):
        return f"KVCacheGate(ns={self.ns!r})"

