from typing import Any, Dict, Iterator, List, Literal, Optional, Sequence, Union

from . import _samples
from ._ferry import Buffer, QueueFullError
from .store import Store

Framework = Literal["numpy", "torch"]

class _Record:
    def to_json(self) -> str: ...
    @classmethod
    def from_json(cls, text: Union[str, bytes]) -> Any: ...

class RolloutSession(_Record):
    session_id: str
    episode_id: str
    request_id: str
    policy_version: int
    prompt_ref: str
    output_ref: str
    logprob_ref: str
    reward_ref: str
    kv_ref: str
    status: str
    metadata: Dict[str, Any]
    def __init__(self, session_id: str = ..., episode_id: str = ..., request_id: str = ..., policy_version: int = ...,
                 prompt_ref: str = ..., output_ref: str = ..., logprob_ref: str = ..., reward_ref: str = ...,
                 kv_ref: str = ..., status: str = ..., metadata: Dict[str, Any] = ...) -> None: ...

class UpdateSession(_Record):
    update_id: str
    input_policy_version: int
    output_policy_version: int
    trajectory_refs: List[str]
    reward_refs: List[str]
    logprob_refs: List[str]
    status: str
    metadata: Dict[str, Any]
    def __init__(self, update_id: str = ..., input_policy_version: int = ..., output_policy_version: int = ...,
                 trajectory_refs: List[str] = ..., reward_refs: List[str] = ..., logprob_refs: List[str] = ...,
                 status: str = ..., metadata: Dict[str, Any] = ...) -> None: ...

class PolicyVersion(_Record):
    version_id: int
    parent_version_id: int
    created_at_step: int
    weight_generation: int
    model: str
    metadata: Dict[str, Any]
    def __init__(self, version_id: int = ..., parent_version_id: int = ..., created_at_step: int = ...,
                 weight_generation: int = ..., model: str = ..., metadata: Dict[str, Any] = ...) -> None: ...

def admit(sample_version: int, input_version: int, max_policy_lag: int = ...) -> str: ...

class PolicyWatch(_samples.PolicyWatch):
    def next(self, timeout_ms: int = ...) -> Optional[PolicyVersion]: ...  # type: ignore[override]
    def __iter__(self) -> Iterator[PolicyVersion]: ...
    def __next__(self) -> PolicyVersion: ...

class PolicyRegistry:
    store: Store
    model: str
    def __init__(self, store: Store, model: str) -> None: ...
    def current(self) -> Optional[PolicyVersion]: ...
    def history(self) -> List[PolicyVersion]: ...
    def watch(self) -> PolicyWatch: ...
    def publish(self, version: Union[int, PolicyVersion], tensors: Sequence[Any], *, parent: int = ...,
                created_at_step: int = ..., metadata: Optional[Dict[str, Any]] = ..., rank: int = ..., world: int = ...,
                rank_node: Optional[Sequence[int]] = ..., out_dtype: Optional[str] = ..., segment: int = ...,
                keep: int = ..., timeout_ms: int = ...) -> Dict[str, Any]: ...

class Sample:
    session: RolloutSession
    id: int
    token: int
    uid: str
    pushed_at_ms: int
    popped_at_ms: int
    prompt_len: int
    ntokens: int
    nrewards: int
    payload: str
    def __init__(self, c: _samples.Sample) -> None: ...

class SampleQueue(_samples.SampleQueue):
    def push(self, session: Union[RolloutSession, Dict[str, Any]], tokens: Buffer, logprobs: Buffer,  # type: ignore[override]
             rewards: Buffer, prompt: Optional[Buffer] = ...) -> int: ...
    def pop(self, max: int = ..., timeout_ms: int = ...) -> List[Sample]: ...  # type: ignore[override]
    def pop_recompute(self, max: int = ...) -> List[Sample]: ...  # type: ignore[override]
    def read(self, sample: Sample, framework: Framework = ...) -> Dict[str, Any]: ...  # type: ignore[override]
    def ack(self, samples: Sequence[Sample]) -> List[bool]: ...  # type: ignore[override]
    def release(self, samples: Sequence[Sample]) -> List[bool]: ...  # type: ignore[override]
    def set_version(self, input_version: int) -> None: ...  # type: ignore[override]

class KVCacheGate(_samples.KVCacheGate):
    @staticmethod
    def ref_version(ref: str) -> int: ...
