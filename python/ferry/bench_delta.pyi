# ferry.bench_delta: `ferry-lab bench weights --torch --delta` (docs/sparse.md, "Deltas from a trainer")
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import torch

from .bench_torch import Layout

MODEL_S: str
MODEL_D: str
MODEL_SOLO: str
FRACTIONS: Tuple[float, ...]
SIDES: Tuple[str, ...]

class Shard:
    rank: int
    flat: torch.Tensor
    master: torch.nn.Parameter
    opt: Optional[torch.optim.Optimizer]
    def __init__(self, L: Layout, rank: int) -> None: ...
    def real(self, rnd: int, steps: int, lr: float) -> None: ...
    def frac(self, rnd: int, f: float) -> None: ...
    def step(self, rnd: int, case: str, a: Mapping[str, Any]) -> None: ...

def expected(L: Layout, shards: Sequence[Shard]) -> List[List[str]]: ...
def run(cfg: Mapping[str, int], a_opts: Mapping[str, Any], log: Optional[Callable[[str], None]] = ...) -> Dict[str, Any]: ...
def human(res: Mapping[str, Any]) -> str: ...
def main(argv: Optional[Sequence[str]] = ...) -> int: ...
