from typing import Union

from . import reshard as reshard
from . import samples as samples
from . import sparse as sparse
from . import store as store
from . import weights as weights
from ._call import strerror as strerror
from ._ferry import Engine as Engine
from ._ferry import Error as Error
from .samples import (KVCacheGate as KVCacheGate, PolicyRegistry as PolicyRegistry, PolicyVersion as PolicyVersion,
                      PolicyWatch as PolicyWatch, QueueFullError as QueueFullError, RolloutSession as RolloutSession,
                      Sample as Sample, SampleQueue as SampleQueue, UpdateSession as UpdateSession)
from .sparse import (put_sparse_object as put_sparse_object, read_sparse_objects as read_sparse_objects,
                     sparse_admit as sparse_admit, sparse_apply as sparse_apply)
from .store import (AuthError as AuthError, BusyError as BusyError, ConflictError as ConflictError,
                    ConnectionError as ConnectionError, ExistsError as ExistsError, LostError as LostError,
                    NoSpaceError as NoSpaceError, NotFoundError as NotFoundError, ReplicateConfig as ReplicateConfig,
                    StaleError as StaleError, Store as Store, TimeoutError as TimeoutError,
                    UnreachableError as UnreachableError, Watch as Watch)
from .weights import CompatGroup as CompatGroup, WeightPublisher as WeightPublisher, WeightSubscriber as WeightSubscriber

__version__: str
VERSION_MAJOR: int
VERSION_MINOR: int
VERSION_PATCH: int

def set_log_level(level: Union[str, int]) -> str: ...
def get_log_level() -> str: ...
def log_flush() -> None: ...
def hex_id(n: int) -> str: ...
