"""Stand-ins for what is not verl's checkpoint-engine code: the trainer's
model engine (get_per_tensor_param), the inference server (the rollout's
server adapter and replica), imported by the actor processes."""
import asyncio
import hashlib
import json
import os

import torch

from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import Dispatch, register
from verl.checkpoint_engine import CheckpointEngineRegistry
from verl.utils.import_utils import import_external_libs

SHAPES = {"model.embed_tokens.weight": (512, 64), "model.layers.0.mlp.up_proj.weight": (256, 64),
          "model.layers.0.mlp.down_proj.weight": (64, 256), "model.layers.0.input_layernorm.weight": (64,),
          "lm_head.weight": (512, 64)}


def weights_of(step):
    g = torch.Generator().manual_seed(1000 + step)
    return {n: (torch.randn(s, generator=g) * 0.02).to(torch.bfloat16) for n, s in SHAPES.items()}


def digest(t):
    return hashlib.blake2b(t.contiguous().view(-1).view(torch.int16).numpy().tobytes(), digest_size=16).hexdigest()


class TrainerWorker(Worker):
    """The actor worker's checkpoint-engine half, as verl's engine_workers.ActorRolloutRefWorker has it:
    update_weights(global_steps, mode) sends get_per_tensor_param's generator through the checkpoint engine;
    execute_checkpoint_engine(method, ...) forwards (DP_COMPUTE)."""

    def __init__(self, backend, bucket_mb, engine_kwargs, custom_backend_module):
        super().__init__()
        import_external_libs(custom_backend_module)
        self.checkpoint_engine = CheckpointEngineRegistry.new(backend, bucket_size=bucket_mb << 20,
                                                              **engine_kwargs.get(backend, {}))

    def get_per_tensor_param(self, step):
        # the model engine's generator: one full tensor at a time
        for name in SHAPES:
            yield name, weights_of(step)[name]

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    async def update_weights(self, global_steps: int = None, mode: str = "auto"):
        metrics = await self.checkpoint_engine.send_weights(self.get_per_tensor_param(global_steps),
                                                            global_steps=global_steps)
        return metrics or {}

    @register(dispatch_mode=Dispatch.DP_COMPUTE, blocking=False)
    def execute_checkpoint_engine(self, method: str, *args, **kwargs):
        return getattr(self.checkpoint_engine, method)(*args, **kwargs)


class ServerAdapter:
    """The inference server's adapter (BaseRollout's update_weights): takes the generator, records each
    tensor's digest for the step (a file the harness reads)."""

    def __init__(self, replica_rank, out_dir):
        self.replica_rank, self.is_leader_rank, self.out_dir = replica_rank, True, out_dir

    async def update_weights(self, weights, global_steps=None, wire_format="named_tensors", **kwargs):
        got = {}
        if hasattr(weights, "__aiter__"):
            async for name, t in weights:
                got[name] = digest(t)
        else:
            for name, t in weights:
                got[name] = digest(t)
        path = os.path.join(self.out_dir, f"replica{self.replica_rank}-step{global_steps}.json")
        with open(path, "w") as f:
            json.dump(got, f)


class Replica:
    """A rollout replica as the manager sees it: its workers and the server calls around an update."""

    def __init__(self, workers):
        self.workers = workers
        self.calls = []

    async def abort_all_requests(self):
        self.calls.append("abort")

    async def resume_generation(self):
        self.calls.append("resume_generation")

    async def release_kv_cache(self):
        self.calls.append("release_kv_cache")

    async def resume_kv_cache(self):
        self.calls.append("resume_kv_cache")
