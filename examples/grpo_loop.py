#!/usr/bin/env python3
"""A GRPO-style loop on ferry: rollout -> queue -> update -> new policy -> rollouts move on.

    PYTHONPATH=build/python python3 examples/grpo_loop.py [--steps 12]

(from the repository root, after a build). It starts a master and a node with
`ferry up` (FERRY_BIN, default build/ferry), or uses the cluster FERRY_MASTER
and FERRY_TOKEN_FILE name. The policy is a toy softmax over VOCAB token ids.
A rollout process samples groups of completions, rewarded by a hidden score
per token; an update process takes a GRPO step (advantage: reward minus the
group mean, over its spread; ratio to the behaviour logprobs, clipped) and
publishes the next policy version, which the rollout process learns of through
a PolicyWatch, loads, and moves on with. The queue drops samples more than
MAX_LAG versions behind."""
import argparse
import contextlib
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

import ferry
from ferry import weights

VOCAB, LEN, GROUP, BATCH, MAX_LAG, LR = 16, 12, 4, 16, 1, 8.0   # BATCH: samples per step, GROUP per prompt
SCORE = np.linspace(-1.0, 1.0, VOCAB)   # the hidden reward of each token id


def softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum()


def connect(master, token_file):
    kw = {"token_file": token_file} if token_file else {}
    return ferry.Store(master=master, lease_ms=1, **kw)   # short read leases: acked payloads go at once


def rollout(master, token_file, model, stop, out):
    rng = np.random.default_rng(os.getpid())
    logits, version, episode = np.zeros(VOCAB, np.float32), 0, 0
    with connect(master, token_file) as s, ferry.PolicyRegistry(s, model).watch() as watch, \
            ferry.SampleQueue(s, model, bound=2 * BATCH, push_timeout_ms=500) as q:
        while not stop.is_set():
            pv = watch.next(timeout_ms=0 if version else 30000)   # a newer version? (never waits once running)
            if pv is not None:
                version = weights.update_direct(s, model, [("logits", None, logits)], version)["generation"]
            p, episode = softmax(logits.astype(np.float64)), episode + 1
            prompt = rng.integers(0, VOCAB, 4, dtype=np.int32)
            for k in range(GROUP):
                tokens = rng.choice(VOCAB, LEN, p=p).astype(np.int32)
                rs = ferry.RolloutSession(session_id=f"e{episode}-{k}", episode_id=f"e{episode}",
                                          request_id=f"r{episode}", policy_version=version)
                try:
                    q.push(rs, tokens, np.log(p[tokens]), [SCORE[tokens].mean()], prompt=prompt)
                except ferry.TimeoutError:   # the queue stayed full: look at stop and the policy again
                    break
        out.put(("rollout", q.stats()))


def update(master, token_file, model, steps, out):
    logits, version = np.zeros(VOCAB, np.float32), 1
    with connect(master, token_file) as s, ferry.SampleQueue(s, model, input_version=version, max_policy_lag=MAX_LAG,
                                                             stale_policy="drop", lease_ms=10000) as q:
        reg = ferry.PolicyRegistry(s, model)
        for step in range(1, steps + 1):
            batch, deadline = [], time.monotonic() + 60
            while len(batch) < BATCH:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"step {step}: no samples for 60 s")
                batch += q.pop(BATCH - len(batch), timeout_ms=1000)
            data = [q.read(smp) for smp in batch]
            rewards = {}   # episode -> its group's rewards
            for smp, d in zip(batch, data):
                rewards.setdefault(smp.session.episode_id, []).append(float(d["rewards"][0]))
            p, grad = softmax(logits.astype(np.float64)), np.zeros(VOCAB)
            for smp, d in zip(batch, data):
                g = rewards[smp.session.episode_id]
                adv = (d["rewards"][0] - np.mean(g)) / (np.std(g) + 1e-4)      # GRPO: relative to the group
                ratio = np.exp(np.log(p[d["tokens"]]) - d["logprobs"])          # new / behaviour policy
                keep = np.clip(ratio, 0.8, 1.2) == ratio                          # PPO-style clip
                onehot = np.eye(VOCAB)[d["tokens"]]
                grad += adv * ((ratio * keep)[:, None] * (onehot - p)).sum(0) / LEN
            logits = (logits + LR * grad / len(batch)).astype(np.float32)    # the "optimizer step"
            ok, version = q.ack(batch), version + 1
            mean_r = float(np.mean([d["rewards"][0] for d in data]))
            lag = np.mean([version - 1 - smp.session.policy_version for smp in batch])
            reg.publish(version, [("logits", logits)], parent=version - 1, created_at_step=step,
                        metadata={"reward_mean": round(mean_r, 4)})
            q.set_version(version)
            st = q.stats()
            print(f"step {step}: trained {sum(ok)} samples (mean lag {lag:.2f}), reward {mean_r:+.3f}, "
                  f"stale so far {st['stale']} -> published version {version}", flush=True)
        out.put(("update", dict(q.stats(), versions=len(reg.history()), current=reg.current().version_id)))


@contextlib.contextmanager
def cluster():
    if os.environ.get("FERRY_MASTER"):
        yield os.environ["FERRY_MASTER"], os.environ.get("FERRY_TOKEN_FILE")
        return
    binary = os.environ.get("FERRY_BIN") or os.path.join(os.path.dirname(__file__), "..", "build", "ferry")
    with tempfile.TemporaryDirectory() as d:
        up = subprocess.Popen([binary, "up", "--dir", d, "--size", "128M"], stdout=subprocess.PIPE, text=True)
        try:
            line = next((x for x in up.stdout if x.startswith("export FERRY_MASTER=")), None)   # both are up
            if line is None:
                raise SystemExit(f"`{binary} up` failed (exit {up.wait()})")
            master, token_file = (w.split("=", 1)[1] for w in line.split()[1:3])
            threading.Thread(target=lambda: [None for _ in up.stdout], daemon=True).start()
            yield master, token_file
        finally:
            up.terminate()   # stops the master and the node
            up.wait(30)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12)
    steps = ap.parse_args().steps
    model = f"grpo{os.getpid()}"   # the model's name is also the queue's
    with cluster() as (master, token_file):
        with connect(master, token_file) as s:   # version 1: the initial policy
            ferry.PolicyRegistry(s, model).publish(1, [("logits", np.zeros(VOCAB, np.float32))])
        ctx = mp.get_context("spawn")
        stop, out = ctx.Event(), ctx.Queue()
        procs = [ctx.Process(target=rollout, args=(master, token_file, model, stop, out), daemon=True),
                 ctx.Process(target=update, args=(master, token_file, model, steps, out), daemon=True)]
        for p in procs:
            p.start()
        procs[1].join(300)
        stop.set()
        procs[0].join(60)
        res = dict(out.get(timeout=30) for _ in procs if all(p.exitcode == 0 for p in procs))
        if set(res) != {"rollout", "update"}:
            print(f"a process failed: exit codes {[p.exitcode for p in procs]}", file=sys.stderr)
            return 1
        r, u = res["rollout"], res["update"]
        print(f"summary: steps={steps} pushed={r['pushed']} trained={u['acked']} stale={u['stale']} dropped="
              f"{u['dropped']} push_waits={r['push_waits']} versions={u['versions']} current={u['current']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
