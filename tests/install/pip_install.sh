#!/usr/bin/env bash
# ctest pip_install: the Python package installs as README.md ("Python
# package") says, from a fresh copy of the tree, offline: a venv of Debian's
# python3 with its packages, `pip install .`, then `python3 -c 'import
# ferry'` from elsewhere with no PYTHONPATH. Then `pip wheel .` with another
# CPython (>= 3.9) when one is installed: the extension builds for whichever
# interpreter runs pip. Both pass the backend's documented `--config-settings
# build-dir=DIR` (docs/python.md), the same DIR: the wheel's build then
# reconfigures for the other interpreter and recompiles only the extension,
# not libferry a second time (that second library build was half of the
# suite's compute). PIP_NO_INDEX=1: any attempt to reach an index fails.
# Usage: pip_install.sh SOURCE_DIR [OTHER_PYTHON]
set -euo pipefail
src=$1 other=${2:-}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1
unset PYTHONPATH

# a fresh clone of the working tree: the files git would check out, no build
mkdir "$tmp/src"
(cd "$src" && git ls-files -co --exclude-standard -z | xargs -0 cp --parents -t "$tmp/src")
[ ! -e "$tmp/src/build" ] || { echo "a build directory travelled with the copy"; exit 1; }

wheel() {
if [ -z "$other" ] || ! [ -x "$other" ]; then
  echo "pip wheel with another interpreter: none given or found ($other); only $(/usr/bin/python3 -V) was tried"
  return 0
fi
cd "$tmp/src"
start=$(date +%s)
"$other" -m pip wheel --no-deps --config-settings build-dir="$tmp/pbuild" . -w "$tmp/wheels" > "$tmp/wheel.log" 2>&1 || { tail -n 60 "$tmp/wheel.log"; exit 1; }
whl=$(ls "$tmp"/wheels/ferry-*.whl)
echo "pip wheel --config-settings build-dir=DIR . with $("$other" -V) ($(( $(date +%s) - start )) s): $(basename "$whl")"
# that interpreter may lack numpy and cffi (import ferry needs both): load the
# extension alone, and the cffi binding compiled into it where cffi's backend is
"$other" - "$whl" <<'PY'
import importlib.machinery, importlib.util, sys, sysconfig, tempfile, types, zipfile
whl = sys.argv[1]
d = tempfile.mkdtemp()
zipfile.ZipFile(whl).extractall(d)
so = f"{d}/ferry/_ferry{sysconfig.get_config_var('EXT_SUFFIX')}"
pkg = types.ModuleType("ferry"); pkg.__path__ = [f"{d}/ferry"]; sys.modules["ferry"] = pkg
spec = importlib.util.spec_from_file_location("ferry._ferry", so)
m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
mem = m.memory(bytearray(8), "probe")
assert mem.nbytes == 8
print("extension loads in", sys.version.split()[0], "->", so.rsplit("/", 1)[1])
try:
    c = m._cffi()
except ImportError as e:
    assert "_cffi_backend" in str(e), e
    print("the cffi binding is compiled in; this interpreter has no cffi backend:", e)
else:
    print("cffi binding loads | ferry_strerror(-2):", c.ffi.string(c.lib.ferry_strerror(-2)).decode())
PY
}

install() {
/usr/bin/python3 -m venv --system-site-packages "$tmp/venv"
# shellcheck disable=SC1091
. "$tmp/venv/bin/activate"
cd "$tmp/src"
start=$(date +%s)
pip install --config-settings build-dir="$tmp/pbuild" . > "$tmp/pip.log" 2>&1 || { tail -n 60 "$tmp/pip.log"; exit 1; }
echo "pip install --config-settings build-dir=DIR . ($(( $(date +%s) - start )) s): $(grep -E '^Successfully installed' "$tmp/pip.log")"
cd /
python3 -c 'import ferry; print("import ferry:", ferry.__version__, ferry.__file__)'
python3 - <<'PY'
import inspect, os, sys
import ferry
pkg = os.path.dirname(ferry.__file__)
assert pkg.startswith(sys.prefix), (pkg, sys.prefix)          # installed, not from a source tree
for f in ("py.typed", "_ferry.pyi", "store.pyi", "torch.pyi"):
    assert os.path.isfile(os.path.join(pkg, f)), f
assert "torch" not in sys.modules
print("installed with stubs:", sorted(f for f in os.listdir(pkg) if f.endswith((".pyi", ".typed"))))
print("signature of Store.put_from:", inspect.signature(ferry.Store.put_from))
PY
[ -z "$(ls -A "$tmp/src/build" 2>/dev/null)" ] || { echo "pip install . left a build directory in the tree"; exit 1; }
deactivate
}

install
wheel
