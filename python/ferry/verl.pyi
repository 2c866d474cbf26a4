from typing import Any, Optional, Type

from .adapters import CheckpointEngine

BACKEND: str
FerryCheckpointEngine: Optional[Type[CheckpointEngine]]

def register(registry: Any, base: Optional[type] = ..., backend: str = ...) -> Type[CheckpointEngine]: ...
