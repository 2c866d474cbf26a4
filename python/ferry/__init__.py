"""ferry — the data plane of RL post-training.

Submodules wrap the C library through the ``_ferry`` extension:
``ferry.reshard`` (placement manifests, layouts, presets, reshard plans).
"""

from ._ferry import Error, strerror, VERSION_MAJOR, VERSION_MINOR, VERSION_PATCH
from . import reshard

__version__ = f"{VERSION_MAJOR}.{VERSION_MINOR}.{VERSION_PATCH}"

__all__ = ["Error", "strerror", "reshard", "__version__"]
