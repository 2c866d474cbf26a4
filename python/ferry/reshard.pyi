from typing import Any, Dict, Iterator, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

from ._ferry import (AttestedPlan, Binding, Engine, Error, Executor, Manifest, Model, build, dtype_size,
                     parse_layout, preset, presets)

LAYER_FIRST: int
LAYER_LAST: int

class Region(NamedTuple):
    tensor: int
    src_tensor: int
    src_fragment: int
    dst_fragment: int
    src_rank: int
    dst_rank: int
    offset: Tuple[int, ...]
    shape: Tuple[int, ...]
    bytes: int

class Loop(NamedTuple):
    count: int
    src_stride: int
    dst_stride: int

class Run(NamedTuple):
    tensor: int
    src_fragment: int
    dst_fragment: int
    src_rank: int
    dst_rank: int
    src_object: Optional[str]
    src_offset: int
    dst_offset: int
    len: int
    loops: Tuple[Loop, ...]
    bytes: int

class Plan:
    src: Manifest
    dst: Manifest
    def __init__(self, src: Manifest, dst: Manifest, **limits: int) -> None: ...
    def stats(self) -> Dict[str, Any]: ...
    def regions(self, tensor: int = ..., src_rank: int = ..., dst_rank: int = ...) -> Iterator[Region]: ...
    def runs(self, tensor: int = ..., src_rank: int = ..., dst_rank: int = ...) -> Iterator[Run]: ...

class PlanCache:
    def __init__(self, capacity: int = ...) -> None: ...
    def get(self, src: Manifest, dst: Manifest, **limits: int) -> Plan: ...
    def __len__(self) -> int: ...

def attest(plan: Plan, src: Binding, dst: Binding, generation: Optional[int] = ...) -> AttestedPlan: ...
def peers_of(binding: Binding, workers: Optional[Sequence[int]] = ...) -> Dict[int, bytes]: ...
def execute(plan: Union[Plan, AttestedPlan], src_binding: Binding, dst_binding: Binding, mode: str = ..., *,
            engine: Engine, workers: Optional[Sequence[int]] = ..., peers: Optional[Mapping[int, bytes]] = ...,
            generation: Optional[int] = ..., window: int = ..., notify_tag: int = ..., guards: Optional[Sequence[Any]] = ...,
            timeout_ms: int = ..., max_ops: int = ..., max_bytes: int = ...) -> Dict[str, Any]: ...
