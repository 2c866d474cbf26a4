"""ferry behind the extension points of RL frameworks (docs/adapters.md).

- :class:`CheckpointEngine` — a checkpoint-engine backend in the shape of
  verl's ``verl.checkpoint_engine.CheckpointEngine``: ``prepare``,
  ``build_topology``, ``init_process_group``, ``finalize``, ``send_weights``
  on trainer ranks and ``receive_weights`` on rollout ranks (async, as verl
  awaits them; ``send_weights_sync`` / ``receive_weights_sync`` otherwise).
- :class:`WorkerExtension` — a vLLM worker extension (``worker_extension_cls``):
  ``init_ferry`` and ``update_weights_from_ferry``, called through
  ``LLM.collective_rpc``, feed ``self.model_runner.model.load_weights(weights=...)``.

Neither framework is imported: these classes have the methods the
frameworks call, and take torch tensors in and out (``import
ferry.adapters`` imports torch).
"""

import asyncio

from . import _torch_weights as _tw
from . import store as _store
from . import weights as _weights

__all__ = ["CheckpointEngine", "WorkerExtension"]


def _open_store(store, master, token_file):
    if store is not None:
        return store, False
    return _store.Store(master=master, token_file=token_file, framework="torch"), True


class CheckpointEngine:
    """ferry as verl's checkpoint engine: trainer ranks publish a generation
    into the store (each tensor stored once, by the rank ``assign`` picks),
    rollout ranks take it (every full tensor, streamed; with a group each
    published byte is read from the store once).

    ``bucket_size`` is verl's constructor argument (the staging of a rollout
    group when not 0); ``master``/``token_file`` (or ``store``) the cluster;
    ``model`` the published model's name; ``out_dtype`` the rollout dtype
    ("bf16", ...; None keeps each tensor's); ``group`` the rollout group's
    name (None: each rollout rank reads every tensor itself); ``names`` the
    trainer -> rollout name map (:class:`ferry.torch.NameMap`, dict or
    callable). The role of a rank comes with ``init_process_group``."""

    def __init__(self, bucket_size=0, *, master=None, token_file=None, store=None, model="policy", out_dtype=None,
                 group=None, names=None, node=0, segment=0, timeout_ms=60000, is_master=False):
        self.bucket_size, self.model, self.out_dtype, self.group = int(bucket_size), model, out_dtype, group
        self.names, self.node, self.segment, self.timeout_ms = names, node, segment, timeout_ms
        self.is_master = is_master
        self._master, self._token_file = master, token_file
        self.store, self._own_store = (store, False) if store is not None else (None, True)
        self.role = self.rank = self.world_size = None
        self.generation = 0
        self._pub = self._cg = None

    def _store(self):
        if self.store is None:
            self.store, self._own_store = _open_store(None, self._master, self._token_file)
        return self.store

    def prepare(self):
        """The metadata ``build_topology`` gets from this worker: where the
        store is and the generation it knows."""
        s = self._store()
        act = _weights.active(s, self.model)
        return {"master": self._master, "model": self.model, "node": self.node,
                "generation": act[0] if act else 0}

    @classmethod
    def build_topology(cls, trainer_world_size, rollout_world_size, metadata):
        """verl's topology step: trainers are ranks 0..T-1 of the publish,
        rollouts ranks 0..R-1 of the rollout group (nothing to connect: the
        store is the rendezvous). Returns (trainer kwargs, rollout kwargs),
        lists per worker, for ``init_process_group``."""
        gen = max([m.get("generation", 0) for m in metadata if m] or [0])
        trainer = {"rank": list(range(trainer_world_size)), "world_size": [trainer_world_size] * trainer_world_size,
                   "role": ["trainer"] * trainer_world_size, "generation": [gen] * trainer_world_size}
        rollout = {"rank": list(range(rollout_world_size)), "world_size": [rollout_world_size] * rollout_world_size,
                   "role": ["rollout"] * rollout_world_size, "generation": [gen] * rollout_world_size}
        return trainer, rollout

    def init_process_group(self, rank, world_size, role="trainer", generation=None, **kwargs):
        """This worker is ``rank`` of ``world_size`` trainers (``role``
        "trainer") or rollouts ("rollout"). ``generation``: the last one
        published (from build_topology; default: the store's active one);
        trainers number the next send from it."""
        if role not in ("trainer", "rollout"):
            raise ValueError(f"role: 'trainer' or 'rollout', not {role!r}")
        self.role, self.rank, self.world_size = role, int(rank), int(world_size)
        s = self._store()
        if generation is None:
            act = _weights.active(s, self.model)
            generation = act[0] if act else 0
        if role == "trainer":
            self.generation = max(self.generation, int(generation))
            self._pub = _weights.WeightPublisher(s, self.model, self.rank, self.world_size, out_dtype=self.out_dtype,
                                                 segment=self.segment, timeout_ms=self.timeout_ms)
        elif self.group is not None and self._cg is None:
            self._cg = _weights.CompatGroup(s, self.model, self.group, self.rank, self.world_size, node=self.node,
                                            staging_bytes=self.bucket_size, timeout_ms=self.timeout_ms,
                                            local_segment=self.segment, framework="torch")

    def finalize(self):
        """After each update: a rollout group's staging is freed (the next
        ``init_process_group`` allocates it again); the store stays open."""
        if self._cg is not None:
            self._cg.close()
            self._cg = None

    def close(self):
        """finalize, and close the store if this engine opened it."""
        self.finalize()
        if self._own_store and self.store is not None:
            self.store.close()
            self.store = None

    # ---- trainer side ----

    def send_weights_sync(self, weights, generation=None):
        """Publish the next generation (or ``generation``) from the ``(name,
        tensor)`` pairs of ``weights`` — the full tensors, the same on every
        trainer rank (verl's ``get_per_tensor_param``). Every trainer rank
        calls it; returns this rank's publish stats."""
        if self.role != "trainer":
            raise RuntimeError("send_weights: this worker is not a trainer (init_process_group(role='trainer'))")
        gen = self.generation + 1 if generation is None else int(generation)
        st = self._pub.publish(gen, [(n, t) for n, t in weights])
        self.generation = gen
        return st

    async def send_weights(self, weights, generation=None):
        """:meth:`send_weights_sync` for ``await engine.send_weights(...)``:
        the tensors are gathered here, the publish runs in a thread (it
        releases the GIL), so the event loop runs on meanwhile."""
        items = [(n, t) for n, t in weights]
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, self.send_weights_sync, items, generation)

    # ---- rollout side ----

    def receive_weights_sync(self):
        """The active generation's tensors as ``(name, torch.Tensor)``,
        streamed as they arrive (:class:`ferry.torch.Weights`; names through
        ``names``); every rollout rank of a group iterates it together."""
        if self.role != "rollout":
            raise RuntimeError("receive_weights: this worker is not a rollout (init_process_group(role='rollout'))")
        w = _tw.weights(self._store(), self.model, self.names, group=self._cg, generation=self.generation)
        return _Tracking(self, w)

    async def receive_weights(self):
        """:meth:`receive_weights_sync` as an async generator (``async for
        name, tensor in engine.receive_weights()``): each tensor is awaited
        without blocking the event loop."""
        it = self.receive_weights_sync()
        loop = asyncio.get_running_loop()
        end = object()
        try:
            while True:
                item = await loop.run_in_executor(None, next, it, end)
                if item is end:
                    return
                yield item
        finally:
            it.close()


class _Tracking:
    """A Weights iterator that records the generation in its engine at the end."""

    def __init__(self, engine, w):
        self.engine, self.w = engine, w

    @property
    def generation(self):
        return self.w.generation

    @property
    def stats(self):
        return self.w.stats

    def __iter__(self):
        return self

    def __next__(self):
        try:
            return next(self.w)
        except StopIteration:
            self.engine.generation = self.w.generation
            raise

    def close(self):
        self.w.close()


class WorkerExtension:
    """A vLLM worker extension (``LLM(..., worker_extension_cls=
    "ferry.adapters.WorkerExtension")``): ``llm.collective_rpc("init_ferry",
    args=(...))`` on every worker once, then
    ``llm.collective_rpc("update_weights_from_ferry")`` after each publish.
    It uses what vLLM's worker has: ``self.model_runner.model`` and its
    ``load_weights(weights=...)``, and ``self.rank``."""

    def init_ferry(self, master=None, token_file=None, model="policy", group=None, rank=None, world_size=1,
                   names=None, node=0, staging_bytes=0, timeout_ms=0, local_segment=0, store=None):
        """Connect this worker: ``model`` the published name; ``group`` a
        rollout group name shared by ``world_size`` workers (each tensor read
        from the store once for all of them; None: this worker reads every
        tensor); ``rank`` this worker's (default ``self.rank``); ``names``
        the trainer -> checkpoint name map (dict or callable; the model's
        ``load_weights`` fuses q/k/v itself)."""
        self._ferry_store, self._ferry_own = _open_store(store, master, token_file)
        self._ferry_model, self._ferry_names = model, names
        self._ferry_generation = 0
        self._ferry_group = None
        if group is not None:
            rank = getattr(self, "rank", 0) if rank is None else rank
            self._ferry_group = _weights.CompatGroup(self._ferry_store, model, group, int(rank), int(world_size),
                                                     node=node, staging_bytes=staging_bytes, timeout_ms=timeout_ms,
                                                     local_segment=local_segment, framework="torch")

    def update_weights_from_ferry(self, generation=None, alone=False):
        """Load the active generation into the model through
        ``load_weights(weights=...)`` (tensors streamed, checksum-verified)
        and return it; nothing is loaded when the model holds it already.
        ``generation``: the one the caller expects; another active one
        raises ``ferry.StaleError`` before anything is loaded. ``alone``:
        this worker reads every tensor itself even in a group — a worker
        that restarted while the others hold the active generation (it
        rejoins the group's updates at the next one)."""
        act = _weights.active(self._ferry_store, self._ferry_model)
        if act is None:
            raise _store.NotFoundError(f"model {self._ferry_model} has no published generation yet")
        if generation is not None and act[0] != int(generation):
            raise _tw._stale(f"generation {generation} of {self._ferry_model} was asked for; the active one is "
                             f"{act[0]}")
        if act[0] == self._ferry_generation:
            return self._ferry_generation
        w = _tw.weights(self._ferry_store, self._ferry_model, self._ferry_names,
                        group=None if alone else self._ferry_group, generation=self._ferry_generation)
        try:
            self.model_runner.model.load_weights(weights=w)
            left = next(w, None)
            if left is not None:   # stopping the update stops it on every worker of the group
                raise RuntimeError(f"load_weights returned before taking every tensor (next: {left[0]}); "
                                   f"generation {act[0]} is not loaded")
        finally:
            w.close()
        self._ferry_generation = w.generation
        return self._ferry_generation

    def ferry_generation(self):
        """The generation the model holds (0: none loaded through ferry)."""
        return getattr(self, "_ferry_generation", 0)

    def close_ferry(self):
        """Free the group's staging and the store this extension opened."""
        if getattr(self, "_ferry_group", None) is not None:
            self._ferry_group.close()
            self._ferry_group = None
        if getattr(self, "_ferry_own", False):
            self._ferry_store.close()
            self._ferry_own = False
