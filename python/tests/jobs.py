"""Worker processes for the multi-process Python tests: a Job starts each
worker as ``target(addr, token_file, rank, *args, cmd, out)`` through a
multiprocessing context (forkserver with torch preloaded, in practice),
sends it commands on its own queue, and collects the replies every worker
puts on one queue as ``(who, value)``; a value "ERROR ..." fails the test.
Also a registry shaped like verl's ``CheckpointEngineRegistry``."""

import queue
import time

import pytest

RUN_S = 240.0          # deadline for every reply of a worker (a generous bound, not a measure)


class Job:
    def __init__(self, ctx, cluster, run_s=RUN_S):
        self.ctx, self.cluster, self.run_s = ctx, cluster, run_s
        self.out = ctx.Queue()
        self.procs, self.cmds = {}, {}

    def start(self, who, target, *args):
        """who: (role, rank); the worker gets rank = who[1]."""
        q = self.ctx.Queue()
        p = self.ctx.Process(target=target, args=(self.cluster.addr, self.cluster.token_file, who[1], *args, q,
                                                 self.out), daemon=True)
        p.start()
        self.procs[who], self.cmds[who] = p, q

    def send(self, whos, c):
        for w in whos:
            self.cmds[w].put(c)

    def replies(self, whos):
        got, deadline = {}, time.monotonic() + self.run_s
        while len(got) < len(whos):
            try:
                who, v = self.out.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                dead = {w: p.exitcode for w, p in self.procs.items() if p.exitcode is not None}
                pytest.fail(f"no reply from {sorted(set(whos) - set(got))} in {self.run_s} s (exited: {dead})")
            if isinstance(v, str) and v.startswith("ERROR"):
                pytest.fail(f"{who}: {v}")
            got[who] = v
        return got

    def ask(self, whos, c):
        self.send(whos, c)
        return self.replies(whos)

    def stop(self, exit_roles=("rollout",)):
        """("exit",) to the live workers of those roles, then join all (kill
        what is left after 30 s)."""
        for w, p in self.procs.items():
            if p.is_alive() and w[0] in exit_roles:
                self.cmds[w].put(("exit",))
        for p in self.procs.values():
            p.join(30)
            if p.is_alive():
                p.kill()
                p.join(5)


class Registry:
    """verl's CheckpointEngineRegistry, in its shape (``register`` is called
    on the class: a plain function in its body)."""
    _registry = {}

    def register(backend):
        def wrapper(cls):
            Registry._registry[backend] = cls
            return cls
        return wrapper

    @classmethod
    def get(cls, backend):
        return cls._registry[backend]

    @classmethod
    def new(cls, backend, *args, **kwargs):
        if backend not in cls._registry:
            raise ValueError(f"Checkpoint engine {backend} not registered")
        return cls._registry[backend](*args, **kwargs)
