"""ferry as a verl checkpoint-engine backend, selected the way verl selects
backends (docs/adapters.md, "verl: selecting the backend").

Name this module in verl's config and ferry registers itself as backend
``"ferry"`` in ``verl.checkpoint_engine.base.CheckpointEngineRegistry``
when verl imports it (verl's ``import_external_libs`` of
``checkpoint_engine.custom_backend_module``)::

    actor_rollout_ref:
      rollout:
        checkpoint_engine:
          backend: ferry
          custom_backend_module: ferry.verl
          update_weights_bucket_megabytes: 2048   # a rollout group's staging: at most 256 MiB of it
          engine_kwargs:
            ferry:
              master: "10.0.0.1:7700"     # or FERRY_MASTER
              token_file: /etc/ferry/token
              model: policy
              group: rollout              # every rollout worker of every replica: one group
              out_dtype: bf16
              timeout_ms: 600000

The class is :class:`ferry.adapters.CheckpointEngine` with verl's
``CheckpointEngine`` as a second base, so verl's registry and its
``isinstance`` checks take it. Where verl is not installed, importing this
module registers nothing; :func:`register` does it for a registry given.
"""

from .adapters import CheckpointEngine

__all__ = ["BACKEND", "register", "FerryCheckpointEngine"]

BACKEND = "ferry"


def register(registry, base=None, backend=BACKEND):
    """Register ferry's checkpoint engine in ``registry`` (verl's
    ``CheckpointEngineRegistry``, or anything with its ``register(name)``
    decorator) under ``backend``, as a subclass of ``base`` too (verl's
    abstract ``CheckpointEngine``) when given. Returns the class."""
    bases = (CheckpointEngine,) if base is None else (CheckpointEngine, base)
    cls = type("FerryCheckpointEngine", bases, {"__doc__": CheckpointEngine.__doc__,
                                                "__module__": __name__})
    return registry.register(backend)(cls)


def _verl():
    """verl's registry and base class, or (None, None) without verl."""
    try:
        from verl.checkpoint_engine.base import CheckpointEngine as base, CheckpointEngineRegistry as registry
    except ImportError:
        return None, None
    return registry, base


_registry, _base = _verl()
FerryCheckpointEngine = register(_registry, _base) if _registry is not None else None
