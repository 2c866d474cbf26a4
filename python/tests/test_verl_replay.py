"""ferry's verl backend driven the way verl's CheckpointEngineManager
drives a backend (docs/adapters.md, "verl"), in separate processes: two
trainer ranks (the actor worker group) and two rollout replicas of one
worker each (the rollout worker group), for six steps (global_steps 0, the
initial sync, then 1..5).

Every step, as verl's manager does it: ``prepare`` on every worker,
``build_topology(2, 2, metadata)`` on the class the registry returns,
``init_process_group`` on every worker with its slice; then every
rollout's update — ``weights = engine.receive_weights(global_steps=step)``
handed to a server adapter that loads each tensor as it comes, as verl's
CheckpointEngineWorker.update_weights does — and every trainer's ``await
engine.send_weights(generator, global_steps=step)`` started together (the
receives first), and ``finalize`` on every worker. The engines are made as
verl makes them: the backend module imported by name
(``custom_backend_module``), then ``registry.new("ferry",
bucket_size=2048 MiB, **engine_kwargs)`` with ``is_master`` on trainer
rank 0. Every rollout tensor must equal that step's trainer tensor bit for
bit: a receive that took the weights of the step before fails it."""

import hashlib
import importlib
import multiprocessing

import pytest

torch = pytest.importorskip("torch")

from conftest import cluster_fixture      # noqa: E402
from jobs import Job, Registry            # noqa: E402

cluster = cluster_fixture(1, "verl_replay")
TRAINERS, ROLLOUTS, STEPS = 2, 2, 6
SHAPES = {"embed.weight": (512, 64), "layers.0.mlp.up.weight": (256, 64), "layers.0.mlp.down.weight": (64, 256),
          "layers.0.norm.weight": (64,), "head.weight": (512, 64)}
BUCKET = 2048 << 20    # verl's default update_weights_bucket_megabytes


def weights_of(step, only=None):
    """The trainers' full tensors at a step: the same on every rank, new each step (only: just that one,
    the same values)."""
    g = torch.Generator().manual_seed(1000 + step)
    out = {}
    for n, s in SHAPES.items():
        t = (torch.randn(s, generator=g) * 0.02).to(torch.bfloat16)
        if only is None or n == only:
            out[n] = t
    return out


def digest(t):
    return hashlib.blake2b(t.contiguous().view(-1).view(torch.int16).numpy().tobytes(), digest_size=16).hexdigest()


def make_engine(addr, token_file, role, rank):
    """What verl does in each worker: import the configured module, then
    registry.new(backend, bucket_size=..., **engine_kwargs)."""
    mod = importlib.import_module("ferry.verl")            # checkpoint_engine.custom_backend_module
    if "ferry" not in Registry._registry:
        mod.register(Registry)                              # what importing it does where verl is installed
    engine_kwargs = {"master": addr, "token_file": token_file, "model": "policy", "group": "rollout",
                     "out_dtype": "bf16", "timeout_ms": 120000}
    if role == "trainer" and rank == 0:
        engine_kwargs["is_master"] = True
    return Registry.new("ferry", bucket_size=BUCKET, **engine_kwargs)


class ServerAdapter:
    """The rollout server's side of verl's update_weights(weights): load
    each (name, tensor) into the model as it arrives."""

    def __init__(self):
        self.model = {n: torch.zeros(s, dtype=torch.bfloat16) for n, s in SHAPES.items()}

    async def update_weights(self, weights, **kwargs):
        n = 0
        async for name, t in weights:
            self.model[name].copy_(t)
            n += 1
        return n


def _worker(addr, token_file, rank, role, cmd, out):
    import asyncio
    torch.set_num_threads(1)
    who = (role, rank)
    try:
        eng = make_engine(addr, token_file, role, rank)
        server = ServerAdapter() if role == "rollout" else None
        while True:
            c = cmd.get()
            if c[0] == "exit":
                break
            if c[0] == "prepare":
                out.put((who, eng.prepare()))
            elif c[0] == "init":
                eng.init_process_group(**c[1])
                out.put((who, None))
            elif c[0] == "update" and role == "trainer":
                step = c[1]

                alive = []

                def per_tensor(step=step):          # verl's get_per_tensor_param: a generator
                    import weakref
                    refs = []
                    for name in list(SHAPES):       # each tensor made as it is asked for
                        t = weights_of(step, only=name)[name]
                        refs.append(weakref.ref(t))
                        alive.append(sum(r() is not None for r in refs))
                        yield name, t
                        del t
                st = asyncio.run(eng.send_weights(per_tensor(), global_steps=step))
                out.put((who, {"stats": st, "generation": eng.generation, "alive": max(alive)}))
            elif c[0] == "update":
                step = c[1]

                async def update(step=step):        # verl's CheckpointEngineWorker.update_weights
                    weights = eng.receive_weights(global_steps=step)
                    return await server.update_weights(weights, global_steps=step)
                n = asyncio.run(update())
                out.put((who, {"tensors": n, "generation": eng.generation,
                               "digests": {k: digest(t) for k, t in server.model.items()}}))
            elif c[0] == "finalize":
                eng.finalize()
                out.put((who, None))
        eng.close()
    except BaseException as e:   # noqa: B902 - the parent reports it
        import traceback
        out.put((who, "ERROR " + "".join(traceback.format_exception(type(e), e, e.__traceback__))[-3000:]))


def test_verl_manager_replayed(cluster):
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "ferry", "ferry.adapters", "ferry.verl", __name__])
    job = Job(ctx, cluster)
    trainers = [("trainer", r) for r in range(TRAINERS)]
    rollouts = [("rollout", r) for r in range(ROLLOUTS)]
    everyone = trainers + rollouts
    try:
        for w in everyone:
            job.start(w, _worker, w[0])
        cls = None
        for step in range(STEPS):
            # 1. prepare on every worker, 2. the topology, 3. init_process_group with each one's slice
            meta = job.ask(everyone, ("prepare",))
            if cls is None:
                make_engine(cluster.addr, cluster.token_file, "manager", 0).close()   # registers the class here
                cls = Registry.get("ferry")
            tk, rk = cls.build_topology(TRAINERS, ROLLOUTS, [meta[w] for w in everyone])
            assert all(len(v) == TRAINERS for v in tk.values()) and all(len(v) == ROLLOUTS for v in rk.values())
            for i, w in enumerate(trainers):
                job.send([w], ("init", {k: v[i] for k, v in tk.items()}))
            for i, w in enumerate(rollouts):
                job.send([w], ("init", {k: v[i] for k, v in rk.items()}))
            job.replies(everyone)
            # 4. the rollouts' receive and the trainers' send, started together
            job.send(rollouts, ("update", step))
            job.send(trainers, ("update", step))
            got = job.replies(everyone)
            want = {n: digest(t) for n, t in weights_of(step).items()}
            for w in trainers:
                assert got[w]["generation"] == step + 1
                assert all(k.startswith("ferry/") for k in got[w]["stats"])
            assert sum(got[w]["stats"]["ferry/tensors"] for w in trainers) == len(SHAPES)   # each stored once
            # streamed: the send asks for a tensor only once it is nearly done with the last (the one
            # being stored, one handed over, the one just made), never the whole model
            assert all(got[w]["alive"] <= 3 for w in trainers), [got[w]["alive"] for w in trainers]
            for w in rollouts:
                assert got[w]["generation"] == step + 1, (w, got[w]["generation"], step)
                assert got[w]["tensors"] == len(SHAPES)
                stale = [n for n in SHAPES if got[w]["digests"][n] != want[n]]
                assert not stale, f"step {step}: {w} holds other weights than the step's in {stale}"
            # 5. finalize on every worker
            job.ask(everyone, ("finalize",))
    finally:
        job.stop(exit_roles=("trainer", "rollout"))
