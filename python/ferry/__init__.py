"""ferry — the data plane of RL post-training.

Submodules wrap the C library through the ``_ferry`` extension:
``ferry.reshard`` (placement manifests, layouts, presets, reshard plans) and
``ferry.store`` (the store client: ``ferry.Store``), ``ferry.weights``
(weight updates: ``ferry.WeightPublisher``, ``ferry.WeightSubscriber``,
``ferry.CompatGroup``);
``ferry.samples`` (rollout/update disaggregation: versioned records,
``ferry.PolicyRegistry``, ``ferry.SampleQueue``, ``ferry.KVCacheGate``);
``ferry.sparse`` (sparse COO weight deltas: ``ferry.put_sparse_object``,
``ferry.read_sparse_objects``, ``ferry.sparse_apply``); ``ferry.Engine`` is a
transfer engine for ``ferry.reshard.execute``.

Memory goes in as numpy arrays, buffers, torch tensors (CPU) or DLPack
objects; results are numpy unless ``framework="torch"`` is passed, or taken
through ``ferry.torch`` (imported on its own: ``import ferry`` does not
import torch). The library's log lines go to logging's ``ferry`` logger
(``ferry.set_log_level`` sets the library's threshold). See docs/python.md.
"""

from ._ferry import Error, Engine
from ._binding import lib as _lib
from ._call import strerror
from . import _log
from ._log import set_log_level, get_log_level, log_flush
from . import reshard
from . import store
from . import weights
from . import samples
from . import sparse
from .store import (Store, Watch, ReplicateConfig, NotFoundError, ExistsError, NoSpaceError, LostError, BusyError,
                    ConflictError, TimeoutError, AuthError, ConnectionError, StaleError, UnreachableError)
from .weights import WeightPublisher, WeightSubscriber, CompatGroup
from .samples import (RolloutSession, UpdateSession, PolicyVersion, PolicyRegistry, PolicyWatch, SampleQueue, Sample,
                      KVCacheGate, QueueFullError)
from .sparse import put_sparse_object, sparse_admit, read_sparse_objects, sparse_apply

VERSION_MAJOR, VERSION_MINOR, VERSION_PATCH = _lib.FERRY_VERSION_MAJOR, _lib.FERRY_VERSION_MINOR, _lib.FERRY_VERSION_PATCH
__version__ = f"{VERSION_MAJOR}.{VERSION_MINOR}.{VERSION_PATCH}"


def hex_id(n):
    """An id (segment, node, instance, record) as the CLI, the logs and the
    metrics print it: 16 hex digits. The dicts of the Python API keep ids as
    integers, for programs; this is the form to read or match by eye."""
    return f"{int(n) & 0xffffffffffffffff:016x}"

_log._install()

__all__ = ["Error", "Engine", "strerror", "reshard", "store", "Store", "Watch", "ReplicateConfig", "NotFoundError",
           "ExistsError", "NoSpaceError", "LostError", "BusyError", "ConflictError", "TimeoutError", "AuthError",
           "ConnectionError", "StaleError", "UnreachableError", "weights", "WeightPublisher", "WeightSubscriber",
           "CompatGroup", "samples", "RolloutSession", "UpdateSession", "PolicyVersion", "PolicyRegistry",
           "PolicyWatch", "SampleQueue", "Sample", "KVCacheGate", "QueueFullError", "sparse", "put_sparse_object",
           "sparse_admit", "read_sparse_objects", "sparse_apply", "set_log_level", "get_log_level", "log_flush",
           "hex_id", "__version__"]
