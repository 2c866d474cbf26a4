"""Type stubs and signatures (docs/python.md, "Types"): every public module
has a .pyi next to it and the package a py.typed; every public class and
function has a real signature for inspect.signature (C functions too, from
their text signatures), and the stub declares the same parameters."""

import ast
import importlib
import inspect
import os

import pytest

import ferry

MODULES = ["ferry", "ferry.store", "ferry.weights", "ferry.samples", "ferry.sparse", "ferry.reshard", "ferry.torch", "ferry.adapters",
           "ferry.verl"]
PKG = os.path.dirname(ferry.__file__)


def stub_path(modname):
    parts = modname.split(".")
    return os.path.join(PKG, "__init__.pyi" if len(parts) == 1 else parts[1] + ".pyi")


def parse_stub(modname):
    with open(stub_path(modname)) as f:
        return ast.parse(f.read(), stub_path(modname))


class Stub:
    """The top-level definitions of one .pyi, and where its imports lead."""

    def __init__(self, modname):
        self.mod = modname
        self.defs, self.imports = {}, {}
        pkg = "ferry"
        for node in parse_stub(modname).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.defs[node.name] = node
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                for t in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                    if isinstance(t, ast.Name):
                        self.defs[t.id] = node
            elif isinstance(node, ast.ImportFrom) and node.level == 1:
                src = pkg + ("." + node.module if node.module else "")
                for a in node.names:
                    self.imports[a.asname or a.name] = (src, a.name)


STUBS = {}


def stub(modname):
    if modname not in STUBS:
        STUBS[modname] = Stub(modname)
    return STUBS[modname]


def resolve(modname, name):
    """The stub definition of name as seen from module modname's stub."""
    for _ in range(5):
        s = stub(modname)
        if name in s.defs:
            return s.defs[name]
        if name not in s.imports:
            return None
        modname, name = s.imports[name]
        if modname == "ferry." + name or modname == "ferry" and name in MODULES:
            return None       # a submodule
    return None


def params_of(fn):
    a = fn.args
    names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
    if a.vararg:
        names.append("*" + a.vararg.arg)
    if a.kwarg:
        names.append("**" + a.kwarg.arg)
    return [n for n in names if n not in ("self", "cls")]


def runtime_params(obj):
    sig = inspect.signature(obj)
    out = []
    for p in sig.parameters.values():
        if p.name in ("self", "cls", "type"):
            continue
        out.append(("*" if p.kind == p.VAR_POSITIONAL else "**" if p.kind == p.VAR_KEYWORD else "") + p.name)
    return out


def public_objects():
    importlib.import_module("ferry.torch")
    for mn in MODULES:
        m = importlib.import_module(mn)
        for name in m.__all__:
            obj = getattr(m, name)
            if inspect.ismodule(obj) or name.startswith("__"):
                continue
            yield mn, name, obj


def test_every_module_has_a_stub_and_the_package_is_typed():
    assert os.path.isfile(os.path.join(PKG, "py.typed"))
    assert os.path.isfile(os.path.join(PKG, "_ferry.pyi"))
    for mn in MODULES:
        assert os.path.isfile(stub_path(mn)), mn
        names = set(stub(mn).defs) | set(stub(mn).imports)
        missing = [n for n in importlib.import_module(mn).__all__ if n not in names]
        assert not missing, f"{mn}.pyi lacks {missing}"


def test_signatures_are_real_and_match_the_stubs():
    checked, problems = 0, []
    for mn, name, obj in public_objects():
        if not callable(obj) or (inspect.isclass(obj) and issubclass(obj, BaseException)):
            continue
        node = resolve(mn, name)
        if node is None:
            problems.append(f"{mn}.{name}: no stub")
            continue
        try:
            rt = runtime_params(obj)
        except (ValueError, TypeError) as e:
            problems.append(f"{mn}.{name}: no signature ({e})")
            continue
        if rt in (["*args", "**kwargs"],):
            problems.append(f"{mn}.{name}: signature is (*args, **kwargs)")
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if params_of(node) != rt:
                problems.append(f"{mn}.{name}: stub {params_of(node)} != runtime {rt}")
            checked += 1
            continue
        if not isinstance(node, ast.ClassDef):
            continue
        methods = {n.name: n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        if "__init__" in methods and obj.__init__ is not object.__init__:
            if params_of(methods["__init__"]) != rt:
                problems.append(f"{mn}.{name}(): stub {params_of(methods['__init__'])} != runtime {rt}")
            checked += 1
        for an, av in vars(obj).items():
            if an.startswith("_") or not callable(av) or inspect.isclass(av):
                continue
            fn = getattr(obj, an)
            if an not in methods:
                problems.append(f"{mn}.{name}.{an}: not in the stub")
                continue
            try:
                rtm = runtime_params(fn)
            except (ValueError, TypeError) as e:
                problems.append(f"{mn}.{name}.{an}: no signature ({e})")
                continue
            if params_of(methods[an]) != rtm:
                problems.append(f"{mn}.{name}.{an}: stub {params_of(methods[an])} != runtime {rtm}")
            checked += 1
    assert not problems, "\n".join(problems)
    assert checked > 150, checked


def test_a_few_signatures_a_user_sees():
    sig = inspect.signature
    assert list(sig(ferry.Store.put_from).parameters) == ["self", "key", "buffer", "size", "config"]
    assert list(sig(ferry.Store.get_into).parameters) == ["self", "key", "buffer", "size"]
    assert list(sig(ferry.Store.register_buffer).parameters) == ["self", "buffer", "size"]
    assert list(sig(ferry.Store.get_tensor).parameters) == ["self", "key", "framework"]
    assert list(sig(ferry.Engine).parameters) == ["transport", "token", "listen"]
    assert list(sig(ferry.SampleQueue).parameters)[:3] == ["store", "queue", "bound"]
    assert list(sig(ferry.reshard.build).parameters) == ["model", "layout", "gpus_per_node"]
    assert sig(ferry.Store.list).parameters["limit"].default == 1000
    assert list(sig(ferry.strerror).parameters) == ["code"]


@pytest.mark.parametrize("mn", MODULES + ["ferry._ferry"])
def test_stubs_parse(mn):
    path = stub_path(mn) if mn != "ferry._ferry" else os.path.join(PKG, "_ferry.pyi")
    with open(path) as f:
        ast.parse(f.read(), path)
