"""ferry under verl's own checkpoint-engine package (verl-project/verl): the
unmodified verl/checkpoint_engine (CheckpointEngineManager,
CheckpointEngineWorker, CheckpointEngineRegistry, import_external_libs for
custom_backend_module) with verl's Worker, dispatch decorator and
RayWorkerGroup binding; Ray, the inference server, the trainer's model
engine and config objects stood in (fakeray/, roles.py)."""
import json
import os
import subprocess
import sys
import time
import types

def main():
    global STEPS
    STEPS = int(os.environ.get("STEPS", "10"))
    out_dir = os.environ.get("VERL_RUN_OUT", "/tmp/verlrun/out")
    os.makedirs(out_dir, exist_ok=True)
    for f in os.listdir(out_dir):
        os.unlink(os.path.join(out_dir, f))

    import ray                                                   # the stand-in
    from verl.checkpoint_engine import CheckpointEngineManager   # verl's own
    from verl.checkpoint_engine.base import _worker_cls
    from verl.single_controller.ray import RayClassWithInitArgs, RayWorkerGroup

    import roles

    master, token = os.environ["FERRY_MASTER"], os.environ["FERRY_TOKEN_FILE"]
    engine_kwargs = {"ferry": {"master": master, "token_file": token, "model": "policy", "group": "rollout",
                               "out_dtype": "bf16", "timeout_ms": 120000}}
    ce_cfg = types.SimpleNamespace(backend="ferry", update_weights_bucket_megabytes=2048, engine_kwargs=engine_kwargs,
                                   custom_backend_module="ferry.verl")

    TRAINERS, ROLLOUTS = 2, 2
    trainers = []
    for r in range(TRAINERS):
        env = {"WORLD_SIZE": str(TRAINERS), "RANK": str(r), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29611"}
        kw = {"ferry": dict(engine_kwargs["ferry"], is_master=r == 0)}
        trainers.append(ray.remote(roles.TrainerWorker).options(runtime_env={"env_vars": env}).remote(
            "ferry", 2048, kw, "ferry.verl"))
    actor_wg = RayWorkerGroup(worker_handles=trainers,
                              ray_cls_with_init=RayClassWithInitArgs(cls=ray.remote(roles.TrainerWorker)))

    replicas = []
    for q in range(ROLLOUTS):   # one worker per replica (TP1), as many replicas as rollouts
        env = {"WORLD_SIZE": "1", "RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(29621 + q)}
        rollout_cfg = types.SimpleNamespace(checkpoint_engine=ce_cfg, name="vllm", mode="async")
        w = _worker_cls.options(runtime_env={"env_vars": env}).remote(
            rollout_cfg, types.SimpleNamespace(), roles.ServerAdapter(q, out_dir))
        replicas.append(roles.Replica([w]))

    manager = CheckpointEngineManager(ce_cfg, actor_wg, replicas)
    ok = True
    for step in range(1, STEPS + 1):
        t0 = time.monotonic()
        metrics = manager.update_weights(global_steps=step)
        dt = time.monotonic() - t0
        want = {n: roles.digest(t) for n, t in roles.weights_of(step).items()}
        got = []
        for q in range(ROLLOUTS):
            with open(os.path.join(out_dir, f"replica{q}-step{step}.json")) as f:
                got.append(json.load(f))
        same = all(g == want for g in got)
        ok &= same
        print(f"step {step}: {dt:.3f} s, {'every tensor bit-equal on both replicas' if same else 'WRONG'}, "
              f"metrics {sorted(metrics)[:4]}..., replica calls {replicas[0].calls[-4:]}", flush=True)
    print("ALL OK" if ok else "FAILED")
    for h in trainers + [r.workers[0] for r in replicas]:
        h.kill()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
