"""A stand-in for Ray, enough for verl's checkpoint-engine manager: actors are
spawned processes (one per actor, calls run one after another, async methods
awaited), ObjectRefs are futures of their results, ray.get waits for them.
Importing it also installs the stand-ins for the third-party packages verl
imports but the checkpoint-engine path does not use (FAKE_RAY_STUBS)."""
import asyncio
import importlib.abc
import importlib.machinery
import inspect
import itertools
import multiprocessing
import os
import sys
import threading
import traceback
import types

_STUBS = set(filter(None, os.environ.get("FAKE_RAY_STUBS", "").split(",")))


class _Stub(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        v = type(name, (), {"__init__": lambda self, *a, **k: None, "__call__": lambda self, *a, **k: None,
                            "__class_getitem__": classmethod(lambda cls, *a: cls)})
        setattr(self, name, v)
        return v


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if not any(name == s or name.startswith(s + ".") for s in _STUBS):
            return None
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec):
        return _Stub(spec.name)

    def exec_module(self, m):
        m.__path__ = []


if _STUBS and not any(isinstance(f, _StubFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _StubFinder())

_ctx = multiprocessing.get_context("spawn")


class ObjectRef:
    def __init__(self, handle, i):
        self._h, self._i = handle, i


def get(refs, timeout=None):
    if isinstance(refs, (list, tuple)):
        return [get(r, timeout) for r in refs]
    if not isinstance(refs, ObjectRef):
        return refs
    return refs._h._wait(refs._i, timeout)


def put(x):
    return x


def wait(refs, num_returns=1, timeout=None):
    return list(refs), []


def is_initialized():
    return True


def init(*a, **k):
    pass


def get_runtime_context():
    return types.SimpleNamespace(get_accelerator_ids=lambda: {"GPU": ["0"]}, get_node_id=lambda: "node0")


class _Method:
    def __init__(self, h, name):
        self._h, self._name = h, name

    def remote(self, *a, **k):
        return self._h._call(self._name, a, k)

    def options(self, **kw):
        return self


def _actor_main(conn, module, qualname, args, kwargs, env):
    os.environ.update(env)
    try:
        cls = importlib.import_module(module)
        for part in qualname.split("."):
            cls = getattr(cls, part)
        cls = getattr(cls, "_fake_ray_cls", cls)
        obj = cls(*args, **kwargs)
        conn.send((-1, True, None))
    except BaseException:   # noqa: B902
        conn.send((-1, False, traceback.format_exc()))
        return
    loop = asyncio.new_event_loop()
    while True:
        msg = conn.recv()
        if msg is None:
            break
        i, name, a, k = msg
        try:
            r = getattr(obj, name)(*a, **k)
            if inspect.isawaitable(r):
                r = loop.run_until_complete(r)
            conn.send((i, True, r))
        except BaseException:   # noqa: B902
            conn.send((i, False, traceback.format_exc()))


class ActorHandle:
    def __init__(self, module, qualname, args, kwargs, env):
        parent, child = _ctx.Pipe()
        self._proc = _ctx.Process(target=_actor_main, args=(child, module, qualname, args, kwargs, env),
                                  daemon=True)
        self._proc.start()
        self._conn = parent
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._cv = threading.Condition()
        self._results = {}
        self._actor_id = types.SimpleNamespace(hex=lambda: str(self._proc.pid))
        threading.Thread(target=self._recv, daemon=True).start()
        self._wait(-1, None)   # constructed (or raise its error)

    def _recv(self):
        while True:
            try:
                i, ok, r = self._conn.recv()
            except (EOFError, OSError):
                with self._cv:
                    self._results["dead"] = True
                    self._cv.notify_all()
                return
            with self._cv:
                self._results[i] = (ok, r)
                self._cv.notify_all()

    def _call(self, name, a, k):
        with self._lock:
            i = next(self._ids)
            self._conn.send((i, name, a, k))
        return ObjectRef(self, i)

    def _wait(self, i, timeout):
        with self._cv:
            while i not in self._results:
                if self._results.get("dead"):
                    raise RuntimeError(f"actor {self._proc.pid} died")
                if not self._cv.wait(timeout if timeout else 600):
                    raise TimeoutError(f"actor {self._proc.pid}: no result in time")
            ok, r = self._results.pop(i)
        if not ok:
            raise RuntimeError(f"actor {self._proc.pid} raised:\n{r}")
        return r

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return _Method(self, name)

    def kill(self):
        try:
            self._conn.send(None)
        except OSError:
            pass
        self._proc.join(10)


class ActorClass:
    def __init__(self, cls, opts=None):
        self._cls, self._opts = cls, opts or {}
        self.__ray_actor_class__ = cls

    def options(self, **kw):
        return ActorClass(self._cls, {**self._opts, **kw})

    def remote(self, *a, **k):
        env = dict(self._opts.get("runtime_env", {}).get("env_vars", {}))
        return ActorHandle(self._cls.__module__, self._cls.__qualname__, a, k, env)

    def __call__(self, *a, **k):
        return self._cls(*a, **k)

    # as Ray's ActorClass (a subclass of the user's class): its methods, with their attributes
    def __dir__(self):
        return sorted(set(dir(self._cls)) | set(object.__dir__(self)))

    def __getattr__(self, name):
        if name in ("_cls", "_opts"):
            raise AttributeError(name)
        return getattr(self._cls, name)


class RemoteFunction:
    def __init__(self, fn):
        self._fn = fn

    def options(self, **kw):
        return self

    def remote(self, *a, **k):
        return self._fn(*a, **k)


def remote(*args, **kwargs):
    def wrap(obj):
        return ActorClass(obj) if inspect.isclass(obj) else RemoteFunction(obj)
    if len(args) == 1 and callable(args[0]) and not kwargs:
        return wrap(args[0])
    return wrap


def get_actor(name=None, namespace=None):
    raise ValueError(f"no actor named {name}")


def kill(handle, no_restart=True):
    handle.kill()


actor = types.ModuleType("ray.actor")
actor.ActorHandle = ActorHandle
actor.ActorClass = ActorClass
sys.modules["ray.actor"] = actor
util = types.ModuleType("ray.util")
util.get_node_ip_address = lambda: "127.0.0.1"
util.list_named_actors = lambda *a, **k: []
sys.modules["ray.util"] = util
for _n in ("ray.util.placement_group", "ray.util.scheduling_strategies", "ray.experimental",
           "ray.experimental.state", "ray.experimental.state.api", "ray.util.state", "ray._private",
           "ray._private.utils", "ray.runtime_env", "ray.exceptions", "ray._raylet", "ray.dag"):
    _m = _Stub(_n)
    _m.__path__ = []
    sys.modules[_n] = _m
util.placement_group = sys.modules["ray.util.placement_group"]
util.scheduling_strategies = sys.modules["ray.util.scheduling_strategies"]
ObjectRefGenerator = ObjectRef

if os.environ.get("FAKE_RAY_TORCH_COMPAT"):
    # Debian's torch 1.13 refuses init_process_group(timeout=None), which torch 2 (verl's) takes
    import torch.distributed as _td
    _orig_init = _td.init_process_group

    def _init_process_group(*a, timeout=None, **k):
        if timeout is None:
            import datetime
            timeout = datetime.timedelta(minutes=30)
        if k.get("backend") == "cpu:gloo":
            k["backend"] = "gloo"
        return _orig_init(*a, timeout=timeout, **k)
    _td.init_process_group = _init_process_group
