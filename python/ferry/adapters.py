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
import queue

from . import _torch_weights as _tw
from . import store as _store
from . import weights as _weights

__all__ = ["CheckpointEngine", "WorkerExtension"]


def _open_store(store, master, token_file):
    if store is not None:
        return store, False
    return _store.Store(master=master, token_file=token_file, framework="torch"), True


STATS_PREFIX = "ferry/"           # every key of send_weights' stats, as verl merges them into its metrics
DEFAULT_STAGING = 256 << 20        # a rollout group's staging when bucket_size asks for more (see below)


class CheckpointEngine:
    """ferry as verl's checkpoint engine (``verl.checkpoint_engine.CheckpointEngine``:
    ``prepare``, ``build_topology``, ``init_process_group``, ``send_weights``,
    ``receive_weights``, ``finalize``). Trainer ranks publish a generation
    into the store (each tensor stored once, by the rank ``assign`` picks);
    rollout ranks take it (every full tensor, streamed; with a group each
    published byte is read from the store once). verl starts every
    trainer's ``send_weights(weights, global_steps=step)`` and every
    rollout's ``receive_weights(global_steps=step)`` at once: the step is the
    generation, and a receive waits for it (docs/adapters.md).

    verl constructs it as ``CheckpointEngine(bucket_size=..., **engine_kwargs)``
    (plus ``is_master`` on trainers); ``engine_kwargs`` is the
    ``checkpoint_engine.engine_kwargs.ferry`` dict of its config:
    ``master``/``token_file`` (or ``store``) the cluster; ``model`` the
    published model's name; ``out_dtype`` the rollout dtype ("bf16", ...;
    None keeps each tensor's); ``group`` the rollout group's name (None:
    each rollout rank reads every tensor itself); ``names`` the trainer ->
    rollout name map (:class:`ferry.torch.NameMap`, dict or callable);
    ``staging_bytes`` a rollout group's staging (default: ``bucket_size``,
    at most 256 MiB); ``timeout_ms`` how long a receive waits for its
    generation and a group for its members."""

    def __init__(self, bucket_size=0, *, master=None, token_file=None, store=None, model="policy", out_dtype=None,
                 group=None, names=None, node=0, segment=0, timeout_ms=60000, is_master=False, staging_bytes=None):
        self.bucket_size, self.model, self.out_dtype, self.group = int(bucket_size), model, out_dtype, group
        self.names, self.node, self.segment, self.timeout_ms = names, node, segment, int(timeout_ms)
        self.is_master = is_master
        self.staging_bytes = self.staging_of(self.bucket_size, staging_bytes)
        self._master, self._token_file = master, token_file
        self.store, self._own_store = (store, False) if store is not None else (None, True)
        self.role = self.rank = self.world_size = None
        self.generation = 0        # the last one sent (trainer) or received (rollout); kept across steps
        self.last_held = []        # trainer: the most bytes the last send's stream held at once
        self._pub = self._cg = None

    @staticmethod
    def staging_of(bucket_size, staging_bytes=None):
        """A rollout group's staging buffer: ``staging_bytes`` when given
        (0: ferry's default), else ``bucket_size`` capped at 256 MiB (verl's
        default bucket is 2 GiB, and every rollout rank would hold one),
        else 256 MiB. It must hold the largest tensor; larger ones fail the
        group's update with a message saying so."""
        if staging_bytes is not None:
            return int(staging_bytes)
        return min(int(bucket_size), DEFAULT_STAGING) if bucket_size else DEFAULT_STAGING

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
        a trainer with no ``global_steps`` numbers its next send after it.
        The generation a rollout holds stays what it received, across
        ``finalize`` and ``init_process_group``."""
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
                                            staging_bytes=self.staging_bytes, timeout_ms=self.timeout_ms,
                                            local_segment=self.segment, framework="torch")

    def finalize(self):
        """After each update: a rollout group's staging is freed (the next
        ``init_process_group`` allocates it again); the store stays open and
        the generation held is kept."""
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

    @staticmethod
    def generation_of(global_steps):
        """The generation of verl's step: ``global_steps + 1`` (verl ships the
        initial or resumed weights with step 0; a generation is at least 1)."""
        steps = int(global_steps)
        if steps < 0:
            raise ValueError(f"global_steps: a step of at least 0, not {global_steps!r}")
        return steps + 1

    def _next_generation(self, global_steps, generation=None):
        if global_steps is not None:
            return self.generation_of(global_steps)
        return self.generation + 1 if generation is None else int(generation)

    def send_weights_sync(self, weights, global_steps=None, generation=None):
        """Publish the generation of verl's step ``global_steps``
        (:meth:`generation_of`: step + 1; default: the one after the last
        sent) from the ``(name, tensor)`` pairs of ``weights``
        — the full tensors, the same on every trainer rank (verl's
        ``get_per_tensor_param``). Every trainer rank calls it; returns this
        rank's publish stats, each key prefixed ``ferry/`` (verl merges the
        senders' dicts into its metrics). ``generation`` is an older name of
        ``global_steps``, a generation number itself."""
        if self.role != "trainer":
            raise RuntimeError("send_weights: this worker is not a trainer (init_process_group(role='trainer'))")
        gen = self._next_generation(global_steps, generation)
        try:   # streamed: each tensor stored (or dropped) as it comes, no list of the model
            self.last_held = []
            st = self._pub.publish_stream(gen, _contiguous_pairs(weights), held=self.last_held)
        except _store.Error as e:
            act = _weights.active(self._store(), self.model)
            if act is not None and act[0] >= gen:
                said = type(e)(f"{e} (generation {gen} is global_steps {gen - 1} + 1; this store holds "
                               f"generation {act[0]} of {self.model} already: a resumed job needs a fresh store or "
                               f"another model name)")
                said.code = getattr(e, "code", None)
                raise said from e
            raise
        self.generation = gen
        return {STATS_PREFIX + k: v for k, v in st.items()}

    async def send_weights(self, weights, global_steps=None, generation=None):
        """:meth:`send_weights_sync` for ``await engine.send_weights(weights,
        global_steps=step)``, streamed: the publish runs in a thread (it
        releases the GIL) and takes each tensor from the generator, a
        generator or an async one, as it comes — handed over through a
        queue of one, so at most two tensors (the one being stored, the
        next) and the rank's current object (at most 256 MiB) are held,
        never the model. The event loop runs on meanwhile."""
        loop = asyncio.get_running_loop()
        q = queue.Queue(maxsize=1)
        done = object()

        def items():
            while True:
                it = q.get()
                if it is done:
                    return
                if isinstance(it, BaseException):
                    raise it
                yield it
                del it   # before the next get: the one stored is let go before the next is taken

        task = loop.run_in_executor(None, lambda: self.send_weights_sync(items(), global_steps, generation))

        def drain(_):   # the publish ended (a failure: it takes no more): free a feeder blocked on put
            while True:
                try:
                    q.get_nowait()
                except queue.Empty:
                    return

        task.add_done_callback(drain)
        try:
            async for item in _aiter(weights):
                if task.done():   # the publish stopped taking tensors (it failed): no more to give
                    break
                await loop.run_in_executor(None, q.put, item)
            else:
                await loop.run_in_executor(None, q.put, done)
        except Exception as e:   # noqa: B902 - the generator failed: the publish fails on every rank
            if not task.done():
                await loop.run_in_executor(None, q.put, e)
        return await task

    # ---- rollout side ----

    def _wanted(self, global_steps):
        """The generation a receive waits for: ``global_steps`` when given,
        else the one after the generation held; never one received before."""
        want = self.generation + 1 if global_steps is None else self.generation_of(global_steps)
        if want <= self.generation:
            raise _tw._stale(f"generation {want} of {self.model} (global_steps {want - 1}) was asked for; this "
                             f"worker already received generation {self.generation}")
        return want

    def receive_weights_sync(self, global_steps=None):
        """Wait, at most ``timeout_ms``, until the generation of step
        ``global_steps`` (:meth:`generation_of`; default: one newer than the
        generation held) is announced, then
        the active generation's tensors as ``(name, torch.Tensor)``, streamed
        as they arrive (:class:`ferry.torch.Weights`; names through
        ``names``); every rollout rank of a group iterates it together.
        Raises ``ferry.TimeoutError`` naming the generation it waited for,
        and ``ferry.StaleError`` when asked for a generation it received
        before."""
        if self.role != "rollout":
            raise RuntimeError("receive_weights: this worker is not a rollout (init_process_group(role='rollout'))")
        want = self._wanted(global_steps)
        _weights.wait_active(self._store(), self.model, want, self.timeout_ms)
        w = _tw.weights(self._store(), self.model, self.names, group=self._cg, generation=self.generation)
        return _Tracking(self, w, want)

    async def receive_weights(self, global_steps=None):
        """:meth:`receive_weights_sync` as an async generator (``async for
        name, tensor in engine.receive_weights(global_steps=step)``): the
        wait and each tensor are awaited without blocking the event loop."""
        loop = asyncio.get_running_loop()
        it = await loop.run_in_executor(None, self.receive_weights_sync, global_steps)
        end = object()
        try:
            while True:
                item = await loop.run_in_executor(None, next, it, end)
                if item is end:
                    return
                yield item
        finally:
            it.close()


def _process_weights_after_loading():
    """vLLM's post-load hook (``vllm.model_executor.model_loader.utils``), or None without vLLM."""
    try:
        from vllm.model_executor.model_loader.utils import process_weights_after_loading   # type: ignore
        return process_weights_after_loading
    except Exception:   # noqa: B902 - vLLM absent
        return None


def _contiguous_pairs(weights):
    """(name, contiguous tensor) of each pair, holding none of them while
    the next is asked for (a generator's loop names would)."""
    for n, t in weights:
        item = (n, _contiguous(t))
        del t
        yield item
        del item


def _contiguous(t):
    """A tensor the publish can read as it is (verl's generator may yield views)."""
    return t.contiguous() if hasattr(t, "is_contiguous") and not t.is_contiguous() else t


async def _aiter(weights):
    """A generator or an async generator, as verl hands either."""
    if hasattr(weights, "__aiter__"):
        async for item in weights:
            yield item
    else:
        for item in weights:
            yield item


class _Tracking:
    """A Weights iterator that records the generation in its engine at the end
    (at least ``want``: the group or the worker took the active one, newer
    than the one held)."""

    def __init__(self, engine, w, want=0):
        self.engine, self.w, self.want = engine, w, want

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
            if self.w.generation < self.want:
                raise RuntimeError(f"generation {self.w.generation} of {self.engine.model} was loaded, not "
                                   f"{self.want} or newer") from None
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
        runner = self.model_runner
        # speculative decoding: the drafter (MTP) takes the same tensors, as in checkpoint-engine's
        # VllmColocateWorkerExtension (vLLM's model_runner.drafter.model)
        drafter = getattr(runner, "drafter", None) if getattr(runner, "speculative_config", None) is not None \
            else None
        try:
            if drafter is None:
                runner.model.load_weights(weights=w)
            else:
                for item in w:
                    runner.model.load_weights(weights=[item])
                    drafter.model.load_weights(weights=[item])
            left = next(w, None)
            if left is not None:   # stopping the update stops it on every worker of the group
                raise RuntimeError(f"load_weights returned before taking every tensor (next: {left[0]}); "
                                   f"generation {act[0]} is not loaded")
        finally:
            w.close()
        # quantized layers (FP8 and the like) repack what was loaded: vLLM's
        # process_weights_after_loading, as its own loaders and checkpoint-engine call it
        post = _process_weights_after_loading()
        if post is not None:
            post(runner.model, getattr(self, "model_config", None), getattr(self, "device", None))
            if drafter is not None:
                post(drafter.model, getattr(self, "model_config", None), getattr(self, "device", None))
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
