from typing import Any, Dict, List, Literal, Optional, Sequence, Tuple, Union

from ._ferry import Buffer
from .store import Store

Framework = Literal["numpy", "torch"]
COUNTERS: Tuple[str, ...]

class Target:
    tensor_id: str
    node: int
    axis_index: int
    offset: Tuple[int, ...]
    shape: Tuple[int, ...]
    def __init__(self, tensor_id: str, node: int, axis_index: int, offset: Sequence[int], shape: Sequence[int]) -> None: ...

class SparseResult:
    target: int
    tensor_id: str
    shape: Tuple[int, ...]
    base_generation: int
    delta_generation: int
    apply: str
    value_dtype: str
    indices: Any   # numpy.ndarray or torch.Tensor, int64 [nnz, ndim]
    values: Any    # numpy.ndarray or torch.Tensor, [nnz]
    def __init__(self, target: int, tensor_id: str, shape: Tuple[int, ...], base_generation: int,
                 delta_generation: int, apply: str, value_dtype: str, indices: Any, values: Any) -> None: ...
    @property
    def nnz(self) -> int: ...

def put_sparse_object(store: Store, tensor_id: str, global_shape: Sequence[int], indices: Buffer, values: Buffer,
                      generation: Tuple[int, int], source_placement: Tuple[Any, ...], tile_shape: Optional[Sequence[int]] = ...,
                      apply: str = ..., value_dtype: Optional[str] = ...) -> Tuple[str, Dict[str, Any]]: ...
def sparse_admit(store: Store, tensor_id: str, global_shape: Sequence[int], generation: Tuple[int, int],
                 source_placement: Tuple[Any, ...], rank: int, apply: str = ..., index_dtype: str = ...,
                 value_dtype: str = ...) -> bool: ...
def read_sparse_objects(store: Store, keys: Union[str, Sequence[str]], targets: Sequence[Union[Target, Dict[str, Any]]],
                        publish_prefix: Optional[str] = ..., framework: Framework = ...
                        ) -> Tuple[List[SparseResult], Dict[str, Any]]: ...
def sparse_apply(result: SparseResult, dense: Buffer, current_generation: int, dense_dtype: Optional[str] = ...) -> int: ...
def announce(store: Store, model: str, base: int, generation: int, keys: Union[str, Sequence[str]],
             keep: int = ...) -> Dict[str, Any]: ...
def chain(store: Store, model: str, generation: int = ...) -> Dict[str, Any]: ...
def update(store: Store, model: str, shards: Sequence[Tuple[str, Optional[Sequence[int]], Buffer]],
           generation: int = ..., axis_index: int = ..., no_dense: bool = ...) -> Dict[str, Any]: ...
