"""ferry as a vLLM weight-transfer engine (docs/adapters.md, "vLLM").

vLLM's weight-transfer interface (``vllm/distributed/weight_transfer``:
``WeightTransferConfig(backend=...)``, ``WeightTransferEngineFactory``,
``WeightTransferEngine``) moves a trainer's weights into running inference
workers in four calls, each a ``collective_rpc`` on every worker:
``init_weight_transfer_engine(init_info)`` once, then per update
``start_weight_update()``, ``update_weights(update_info)`` (one or more
times) and ``finish_weight_update()``. The engines are pluggable:
:func:`register` adds ``"ferry"`` to vLLM's factory (importing this module
does it where vLLM is installed), so ``WeightTransferConfig(backend="ferry")``
selects :class:`FerryWeightTransferEngine`.

- worker side: ``init_info`` names the store and the model (and a rollout
  group, whose workers then read each byte from the store once between
  them); ``update_info`` is ``{"generation": G}``; ``update_weights`` waits
  (a watch, bounded by ``timeout_ms``) until G is announced and streams
  its tensors, checksum-verified, into ``model.load_weights(weights)``.
  ``start``/``finish`` bracket the update with vLLM's layerwise reload
  (``initialize_layerwise_reload(model)`` /
  ``finalize_layerwise_reload(model, model_config)``, which run the
  post-load processing of quantized layers), as vLLM's own engines do.
- trainer side: :meth:`FerryWeightTransferEngine.trainer_send_weights`
  publishes ``(name, tensor)`` pairs as generation G, streamed (each
  tensor stored as it comes; :meth:`ferry.WeightPublisher.publish_stream`),
  on every trainer rank; the rollouts' ``update_weights`` may be called at
  the same time (it waits for the announcement).

vLLM is not imported to use this module: without it the engine has the
same constructor and methods on a small base of its own, and the layerwise
reload is skipped.
"""

import dataclasses
from typing import Any, Dict, Iterator, Optional, Tuple

from . import _torch_weights as _tw
from . import store as _store
from . import weights as _weights

__all__ = ["FerryInitInfo", "FerryUpdateInfo", "FerryWeightTransferEngine", "register"]

try:   # vLLM's base classes where vLLM is installed
    from vllm.distributed.weight_transfer.base import (   # type: ignore
        WeightTransferEngine as _Base, WeightTransferInitInfo as _InitBase,
        WeightTransferUpdateInfo as _UpdateBase)
    HAVE_VLLM = True
except Exception:   # noqa: B902 - vLLM absent or of another shape: our own base
    HAVE_VLLM = False

    class _InitBase:   # noqa: D101
        pass

    class _UpdateBase:   # noqa: D101
        pass

    class _Base:
        """The part of vLLM's ``WeightTransferEngine`` ferry relies on: the
        constructor's arguments and ``update_weights`` parsing the dict."""

        init_info_cls: Any = None
        update_info_cls: Any = None

        def __init__(self, config, vllm_config, device, model):
            self.config, self.vllm_config, self.device, self.model = config, vllm_config, device, model
            self.model_config = getattr(vllm_config, "model_config", None)

        def parse_init_info(self, init_dict):
            try:
                return self.init_info_cls(**init_dict)
            except TypeError as e:
                raise ValueError(f"Invalid init_info for {type(self).__name__}: {e}") from e

        def parse_update_info(self, update_dict):
            try:
                return self.update_info_cls(**update_dict)
            except TypeError as e:
                raise ValueError(f"Invalid update_info for {type(self).__name__}: {e}") from e

        def update_weights(self, update_info):
            self.receive_weights(self.parse_update_info(update_info))


@dataclasses.dataclass
class FerryInitInfo(_InitBase):
    """``init_weight_transfer_engine``'s ``init_info`` for ``backend="ferry"``."""

    master: Optional[str] = None        # the store's master ("host:port"; None: $FERRY_MASTER)
    token_file: Optional[str] = None    # the cluster token (None: $FERRY_TOKEN_FILE)
    model: str = "policy"               # the published model's name
    group: Optional[str] = None         # a rollout group of world_size workers (None: each reads alone)
    rank: Optional[int] = None          # this worker's rank in the group (None: vLLM's worker rank)
    world_size: int = 1
    timeout_ms: int = 60000             # the wait for a generation's announcement, the group's barriers
    node: int = 0                       # this worker's node (the group balances each node's NIC)
    staging_bytes: int = 0              # the group's staging buffer (0: ferry's default)


@dataclasses.dataclass
class FerryUpdateInfo(_UpdateBase):
    """``update_weights``' ``update_info``: the generation to load."""

    generation: int = 0


def _reload_hooks():
    """vLLM's layerwise reload (initialize, finalize), or None without vLLM."""
    try:
        from vllm.model_executor.model_loader.reload import (   # type: ignore
            finalize_layerwise_reload, initialize_layerwise_reload)
        return initialize_layerwise_reload, finalize_layerwise_reload
    except Exception:   # noqa: B902 - vLLM absent: nothing to bracket
        return None


class FerryWeightTransferEngine(_Base):
    """vLLM's weight-transfer engine backed by ferry's store (see the module
    docstring). One per vLLM worker, built by vLLM's factory with
    ``(config, vllm_config, device, model)``."""

    init_info_cls = FerryInitInfo
    update_info_cls = FerryUpdateInfo

    def __init__(self, config, vllm_config, device, model):
        super().__init__(config, vllm_config, device, model)
        self.store = None
        self.generation = 0          # the generation the model holds (0: none through ferry)
        self._own = False
        self._group = None
        self._info = None
        self._in_update = False

    def init_transfer_engine(self, init_info):
        """Connect to the store (once; ``init_info`` a :class:`FerryInitInfo`)."""
        if isinstance(init_info, dict):
            init_info = self.parse_init_info(init_info)
        self._info = init_info
        self.store, self._own = _store.Store(master=init_info.master, token_file=init_info.token_file,
                                             framework="torch"), True
        if init_info.group is not None:
            rank = init_info.rank
            if rank is None:
                rank = getattr(getattr(self.vllm_config, "parallel_config", None), "rank", 0) or 0
            self._group = _weights.CompatGroup(self.store, init_info.model, init_info.group, int(rank),
                                               int(init_info.world_size), node=init_info.node,
                                               staging_bytes=init_info.staging_bytes,
                                               timeout_ms=init_info.timeout_ms, framework="torch")

    def start_weight_update(self):
        """Open the update: vLLM's layerwise reload starts (where vLLM is)."""
        if self.store is None:
            raise RuntimeError("ferry weight transfer: init_weight_transfer_engine was not called")
        hooks = _reload_hooks()
        if hooks is not None:
            hooks[0](self.model)
        self._in_update = True

    def receive_weights(self, update_info):
        """Wait until ``update_info.generation`` is announced, then stream
        its tensors into ``model.load_weights``. A generation this worker
        holds already raises ``ferry.StaleError``; one never announced
        ``ferry.TimeoutError`` after ``timeout_ms``."""
        if self.store is None:
            raise RuntimeError("ferry weight transfer: init_weight_transfer_engine was not called")
        gen = int(update_info.generation)
        if gen <= self.generation:
            raise _tw._stale(f"generation {gen} of {self._info.model} was asked for; this worker holds "
                             f"generation {self.generation} already")
        _weights.wait_active(self.store, self._info.model, gen, self._info.timeout_ms)
        act = _weights.active(self.store, self._info.model)
        if act is None or act[0] != gen:
            raise _tw._stale(f"generation {gen} of {self._info.model} was asked for; the active one is "
                             f"{act[0] if act else 'none'}")
        w = _tw.weights(self.store, self._info.model, None, group=self._group, generation=self.generation)
        try:
            self.model.load_weights(w)
            left = next(w, None)
            if left is not None:
                raise RuntimeError(f"load_weights returned before taking every tensor (next: {left[0]}); "
                                   f"generation {gen} is not loaded")
        finally:
            w.close()
        self.generation = w.generation

    def finish_weight_update(self):
        """Close the update: vLLM's layerwise reload finalizes (the
        post-load processing of quantized layers)."""
        hooks = _reload_hooks()
        if hooks is not None and self._in_update:
            hooks[1](self.model, self.model_config)
        self._in_update = False

    def shutdown(self):
        """Free the group's staging and the store."""
        if self._group is not None:
            self._group.close()
            self._group = None
        if self._own and self.store is not None:
            self.store.close()
        self.store = None

    @staticmethod
    def trainer_send_weights(iterator: Iterator[Tuple[str, Any]], trainer_args: Dict[str, Any]) -> None:
        """Publish ``iterator``'s ``(name, tensor)`` pairs as generation
        ``trainer_args["generation"]`` from this trainer rank (every rank
        calls it with the same pairs), streamed. ``trainer_args``:
        ``generation``, ``master``, ``token_file``, ``model`` ("policy"),
        ``rank`` (0), ``world`` (1), ``out_dtype`` (None), ``timeout_ms``
        (60000), or ``store`` (an open ferry.Store) instead of master and
        token_file. Returns nothing, as vLLM's engines; raises the
        publish's error (the same on every rank)."""
        args = dict(trainer_args)
        store = args.get("store")
        own = store is None
        if own:
            store = _store.Store(master=args.get("master"), token_file=args.get("token_file"), framework="torch")
        try:
            pub = _weights.WeightPublisher(store, args.get("model", "policy"), int(args.get("rank", 0)),
                                           int(args.get("world", 1)), out_dtype=args.get("out_dtype"),
                                           timeout_ms=int(args.get("timeout_ms", 60000)))
            pub.publish_stream(int(args["generation"]), iterator)
        finally:
            if own:
                store.close()


def register(factory=None):
    """Add ``"ferry"`` to vLLM's ``WeightTransferEngineFactory`` (or to
    ``factory``, anything with ``register_engine(name, module, class)``);
    once is enough, a second call does nothing. False when vLLM is absent
    and no factory is given."""
    if factory is None:
        try:
            from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory as factory  # type: ignore # noqa: N813,E501
        except Exception:   # noqa: B902 - vLLM absent
            return False
    if "ferry" in getattr(factory, "_registry", {}):
        return True
    factory.register_engine("ferry", __name__, "FerryWeightTransferEngine")
    return True


register()
