"""The build backend of the ferry Python package (PEP 517), in the tree.

``pip install .`` and ``pip wheel .`` run it in an isolated environment with
nothing installed into it (pyproject.toml: ``requires = []``): it needs only
the standard library, CMake, a C compiler and the libraries of
scripts/deps.sh, so it works offline and for whichever CPython (>= 3.9)
runs pip. ``build_wheel`` configures the repository's CMakeLists.txt for
that interpreter (``-DPython3_EXECUTABLE=sys.executable``) in a fresh build
directory, builds the ``ferry_python`` target — libferry compiled in
statically, the ``_ferry`` extension, the modules, stubs and py.typed
assembled in ``<build>/python/ferry`` — and zips that folder into a wheel.
The extension links the system's libxxhash, libjansson and libsodium.

Config settings (``pip wheel . --config-settings build-dir=DIR``):
``build-dir`` keeps the CMake build there (reused by the next build),
``jobs`` the parallel compile jobs (default: the CPUs).
"""

import base64
import csv
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import zipfile

__all__ = ["build_wheel", "build_sdist", "get_requires_for_build_wheel", "get_requires_for_build_sdist",
           "prepare_metadata_for_build_wheel"]

ROOT = os.path.abspath(os.getcwd())   # PEP 517: hooks run in the source tree


# ---- metadata --------------------------------------------------------------------------------

def _version():
    with open(os.path.join(ROOT, "include", "ferry", "common.h")) as f:
        text = f.read()
    parts = [re.search(rf"#define FERRY_VERSION_{p} (\d+)", text).group(1) for p in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(parts)


def _project():
    """[project] of pyproject.toml: tomllib where there is one (3.11+), else
    the subset this file uses (strings and lists of strings)."""
    path = os.path.join(ROOT, "pyproject.toml")
    try:
        import tomllib
        with open(path, "rb") as f:
            return tomllib.load(f)["project"]
    except ImportError:
        pass
    proj, section, key, buf = {}, None, None, None
    with open(path) as f:
        for line in f:
            line = line.split("#", 1)[0].rstrip() if not line.lstrip().startswith(('"', "'")) else line.rstrip()
            if not line:
                continue
            if line.startswith("["):
                section = line.strip("[] ")
                continue
            if section == "project.optional-dependencies":
                k, v = line.split("=", 1)
                proj.setdefault("optional-dependencies", {})[k.strip()] = re.findall(r'"([^"]*)"', v)
                continue
            if section != "project":
                continue
            if buf is not None:
                buf += line
                if "]" in line:
                    proj[key] = re.findall(r'"([^"]*)"', buf)
                    buf = None
                continue
            k, v = (s.strip() for s in line.split("=", 1))
            if v.startswith("["):
                if "]" in v:
                    proj[k] = re.findall(r'"([^"]*)"', v)
                else:
                    key, buf = k, v
            elif v.startswith("{"):
                proj[k] = dict(re.findall(r'(\w+)\s*=\s*"([^"]*)"', v))
            else:
                proj[k] = v.strip('"')
    return proj


def _metadata():
    p = _project()
    lines = ["Metadata-Version: 2.1", f"Name: {p['name']}", f"Version: {_version()}",
             f"Summary: {p.get('description', '')}", f"Requires-Python: {p.get('requires-python', '>=3.9')}"]
    lic = p.get("license")
    if isinstance(lic, dict) and lic.get("text"):
        lines.append(f"License: {lic['text']}")
    for d in p.get("dependencies", []):
        lines.append(f"Requires-Dist: {d}")
    for extra, deps in p.get("optional-dependencies", {}).items():
        lines.append(f"Provides-Extra: {extra}")
        for d in deps:
            lines.append(f'Requires-Dist: {d}; extra == "{extra}"')
    readme = os.path.join(ROOT, "README.md")
    if os.path.exists(readme):
        lines.append("Description-Content-Type: text/markdown")
        with open(readme, encoding="utf-8") as f:
            body = f.read()
        return "\n".join(lines) + "\n\n" + body
    return "\n".join(lines) + "\n"


def _tag():
    """cpXY-cpXY-<platform> of the running interpreter."""
    impl = "cp" if sys.implementation.name == "cpython" else sys.implementation.name[:2]
    ver = f"{sys.version_info[0]}{sys.version_info[1]}"
    soabi = sysconfig.get_config_var("SOABI") or ""
    abi = impl + ver + ("d" if "cpython" in soabi and soabi.split("-")[1].endswith("d") else "")
    plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return f"{impl}{ver}-{abi}-{plat}"


def _dist_info_name():
    return f"{_project()['name']}-{_version()}.dist-info"


def _write_dist_info(directory):
    d = os.path.join(directory, _dist_info_name())
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "METADATA"), "w", encoding="utf-8") as f:
        f.write(_metadata())
    with open(os.path.join(d, "WHEEL"), "w") as f:
        f.write(f"Wheel-Version: 1.0\nGenerator: ferry_build\nRoot-Is-Purelib: false\nTag: {_tag()}\n")
    with open(os.path.join(d, "top_level.txt"), "w") as f:
        f.write("ferry\n")
    return os.path.basename(d)


# ---- hooks -----------------------------------------------------------------------------------

def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    return _write_dist_info(metadata_directory)


def _run(cmd, **kw):
    print("ferry_build:", " ".join(cmd), file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True, stdout=sys.stderr, **kw)


def _build_package(build_dir, jobs):
    """Configure and build the ferry_python target for this interpreter;
    returns the assembled package folder."""
    cmake = shutil.which("cmake")
    if not cmake:
        raise RuntimeError("ferry_build: cmake is needed (scripts/deps.sh installs it)")
    # -U first: a kept build-dir may have been configured for another
    # interpreter, whose cached headers and library FindPython would keep.
    _run([cmake, "-S", ROOT, "-B", build_dir, "-U", "Python3_*", "-U", "_Python3_*",
          "-DCMAKE_BUILD_TYPE=Release",
          f"-DPython3_EXECUTABLE={sys.executable}", "-DPython3_FIND_STRATEGY=LOCATION"])
    _run([cmake, "--build", build_dir, "--target", "ferry_python", "-j", str(jobs)])
    pkg = os.path.join(build_dir, "python", "ferry")
    ext = [n for n in os.listdir(pkg) if n.startswith("_ferry.") and n.endswith(".so")]
    want = sysconfig.get_config_var("EXT_SUFFIX")
    if not any(n == "_ferry" + want for n in ext):
        raise RuntimeError(f"ferry_build: built {ext}, not _ferry{want} for {sys.executable}: CMake found another "
                           f"Python (are this interpreter's headers installed: python3-dev?)")
    return pkg


def _record_line(arcname, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return [arcname, f"sha256={digest}", str(len(data))]


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    cs = config_settings or {}
    jobs = int(cs.get("jobs") or os.cpu_count() or 2)
    keep = cs.get("build-dir")
    build_dir = os.path.abspath(keep) if keep else tempfile.mkdtemp(prefix="ferry-wheel-")
    try:
        pkg = _build_package(build_dir, jobs)
        with tempfile.TemporaryDirectory() as meta:
            info = _write_dist_info(meta)
            name = f"{_project()['name']}-{_version()}-{_tag()}.whl"
            rows = []
            path = os.path.join(wheel_directory, name)
            with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
                for fn in sorted(os.listdir(pkg)):
                    full = os.path.join(pkg, fn)
                    if not os.path.isfile(full) or fn.endswith(".pyc"):
                        continue
                    with open(full, "rb") as f:
                        data = f.read()
                    arc = f"ferry/{fn}"
                    zi = zipfile.ZipInfo(arc, date_time=(2020, 1, 1, 0, 0, 0))
                    zi.external_attr = (0o755 if fn.endswith(".so") else 0o644) << 16
                    zi.compress_type = zipfile.ZIP_DEFLATED
                    z.writestr(zi, data)
                    rows.append(_record_line(arc, data))
                for fn in sorted(os.listdir(os.path.join(meta, info))):
                    with open(os.path.join(meta, info, fn), "rb") as f:
                        data = f.read()
                    z.writestr(f"{info}/{fn}", data)
                    rows.append(_record_line(f"{info}/{fn}", data))
                rec = io.StringIO()
                w = csv.writer(rec, lineterminator="\n")
                w.writerows(rows)
                w.writerow([f"{info}/RECORD", "", ""])
                z.writestr(f"{info}/RECORD", rec.getvalue())
        return name
    finally:
        if not keep:
            shutil.rmtree(build_dir, ignore_errors=True)


def _source_files():
    """The tracked files (git ls-files when this is a checkout), else every
    file but build outputs."""
    try:
        out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                             capture_output=True).stdout
        return [p for p in out.decode().split("\0") if p and os.path.isfile(os.path.join(ROOT, p))]
    except (OSError, subprocess.CalledProcessError):
        files = []
        for d, dirs, names in os.walk(ROOT):
            dirs[:] = [x for x in dirs if not (x.startswith("build") or x.startswith(".") or x == "__pycache__")]
            files += [os.path.relpath(os.path.join(d, n), ROOT) for n in names]
        return files


def build_sdist(sdist_directory, config_settings=None):
    base = f"{_project()['name']}-{_version()}"
    name = base + ".tar.gz"
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz", format=tarfile.PAX_FORMAT) as t:
        for rel in sorted(_source_files()):
            t.add(os.path.join(ROOT, rel), arcname=f"{base}/{rel}", recursive=False)
        data = _metadata().encode()
        ti = tarfile.TarInfo(f"{base}/PKG-INFO")
        ti.size = len(data)
        ti.mtime = 0
        t.addfile(ti, io.BytesIO(data))
    return name
