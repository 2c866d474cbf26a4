# ferry.bench_fp8: `ferry-lab bench weights --torch --fp8` (docs/weights.md, "FP8 rollouts")
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy
import torch

from .bench_torch import Layout

MODEL_B: str
MODEL_F: str
SIDES: Tuple[str, ...]
RULES: Dict[str, Any]

def ref_quantize(x: numpy.ndarray, block: Tuple[int, int]) -> Tuple[numpy.ndarray, numpy.ndarray]: ...
def digest(t: Union[torch.Tensor, numpy.ndarray]) -> str: ...

class QLayout:
    tensors: List[Tuple[str, Tuple[int, ...], str]]
    names: List[str]
    dst: List[Dict[int, Tuple[Tuple[int, ...], Tuple[int, ...]]]]
    quant: List[Optional[Dict[str, Any]]]
    block: Tuple[int, int]
    def __init__(self, L: Layout, rules: Mapping[str, Any]) -> None: ...
    def fp8_bytes(self, L: Layout) -> Tuple[int, int]: ...

def expected(L: Layout, Q: QLayout, rnd: int) -> Dict[str, List[List[str]]]: ...
def quant_bench() -> Dict[str, Any]: ...
def run(cfg: Mapping[str, int], opts: Mapping[str, Any], log: Optional[Callable[[str], None]] = ...) -> Dict[str, Any]: ...
def human(res: Mapping[str, Any]) -> str: ...
def main(argv: Optional[Sequence[str]] = ...) -> int: ...
