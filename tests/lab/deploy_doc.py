#!/usr/bin/env python3
"""ctest test_lab_deploy: every shell block of docs/deploy.md, run as written
on a lab of four bare machines (``ferry-lab cluster up --bare --net
10.0.0``: hosts 10.0.0.1-4, links shaped, no master or node of the lab's
own), in order, each on the machines its marker names.

Markers (HTML comments right above a block, docs/deploy.md):
  <!-- lab: m0 m1 -->                         run it on m0, then on m1; each must exit 0
  <!-- lab: m0 background, job J, ready F --> start it on each machine and go on; F
                                              ($ADDR: the machine's address) must appear
  <!-- lab: wait J K -->                      the background jobs J and K must exit 0
  <!-- lab: m3 kill J -->                     stop job J on m3 (SIGTERM to its group)
A shell block without a marker fails the test. The blocks run with a
HOME of their own, the built `ferry` first on PATH and the built package
on PYTHONPATH, in one directory (the lab's machines share the file
system; `python3` is the interpreter that runs this script, the one
the package was built for). Everything is stopped and the lab taken down at the end, also
on a failure; nothing of it may be left.

Usage: deploy_doc.py BUILD_DIR SOURCE_DIR   (exit 77: skipped, not root)
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

SKIP = 77
LAB_UP_S = 300      # the lab's setup on a loaded machine
READY_S = 120       # a daemon's ready file
BLOCK_S = 300       # a block or a job, a backstop far above what it takes


def blocks(path):
    """(line, markers, text) for every sh block, markers: the lab comments above it."""
    out, markers, inb, buf, start = [], [], False, [], 0
    for n, line in enumerate(open(path, encoding="utf-8"), 1):
        if not inb and line.startswith("<!-- lab:"):
            markers.append(line.strip()[len("<!-- lab:"):-len("-->")].strip())
        elif not inb and line.startswith("```"):
            inb, buf, start = True, [], n
            lang = line[3:].strip()
        elif inb and line.startswith("```"):
            inb = False
            if lang in ("sh", "bash"):
                out.append((start, markers, "".join(buf)))
                markers = []
            elif lang:
                markers = []
        elif inb:
            buf.append(line)
    return out, markers


class Lab:
    def __init__(self, build, tmp, env):
        self.build, self.tmp = build, tmp
        self.jobs = {}   # (name, machine) -> Popen
        ready = os.path.join(tmp, "lab.ready")
        self.log = open(os.path.join(tmp, "lab.log"), "w")
        self.proc = subprocess.Popen(
            [os.path.join(build, "ferry-lab"), "cluster", "up", "--hosts", "4", "--rate", "1gbit",
             "--bare", "--net", "10.0.0", "--check-seconds", "0.3", "--ready-file", ready],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        end = time.monotonic() + LAB_UP_S
        while not os.path.exists(ready):
            if self.proc.poll() is not None or time.monotonic() > end:
                raise RuntimeError("the lab did not come up:\n" + open(self.log.name).read()[-3000:])
            time.sleep(0.05)
        self.prefix = re.search(r"^prefix (\S+)", open(ready).read(), re.M).group(1)

    def argv(self, machine, text):
        return ["ip", "netns", "exec", f"{self.prefix}-h{machine}", "sh", "-ec", text]

    def stop(self):
        for p in self.jobs.values():
            stop_group(p)
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
                subprocess.run([os.path.join(self.build, "ferry-lab"), "cluster", "clean", "--prefix",
                                self.prefix], check=False)
                raise RuntimeError("the lab did not stop on SIGTERM")
        left = [n for n in os.listdir("/var/run/netns") if n.startswith(self.prefix + "-")] \
            if os.path.isdir("/var/run/netns") else []
        if left:
            raise RuntimeError(f"the lab left namespaces: {left}")


def group_alive(p):
    """Whether a process of the job's group still runs (zombies excluded:
    they hold no socket, and an orphan's may wait for its reaper)."""
    p.poll()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = open(f"/proc/{pid}/stat").read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[2]) == p.pid and fields[0] != "Z":
            return True
    return False


def signal_group(p, sig, wait_s):
    """sig to the job's group, then wait (at most wait_s) until none of its
    processes runs; whether they all ended."""
    try:
        os.killpg(p.pid, sig)
    except ProcessLookupError:
        pass
    end = time.monotonic() + wait_s
    while group_alive(p) and time.monotonic() < end:
        time.sleep(0.05)
    return not group_alive(p)


def stop_group(p):
    """SIGTERM to the job's process group, then wait until every process of
    the group is gone, not just the shell the job ran in: a `ferry node`
    still closing holds its port, and the next step may bind it."""
    if (p.poll() is None or group_alive(p)) and not signal_group(p, signal.SIGTERM, 30):
        signal_group(p, signal.SIGKILL, 30)
    p.wait()


def machines(words):
    return [int(w[1:]) for w in words if re.fullmatch(r"m\d", w)]


def run(lab, work, env, line, marker, text):
    parts = [p.strip() for p in marker.split(",")]
    head = parts[0].split()
    opts = dict(p.split(None, 1) for p in parts[1:] if " " in p)
    if head[0] == "wait":
        for name in head[1:]:
            for (job, m), p in sorted(lab.jobs.items()):
                if job == name:
                    try:
                        rc = p.wait(BLOCK_S)
                    except subprocess.TimeoutExpired:
                        raise RuntimeError(f"job {name} on m{m} did not end in {BLOCK_S} s")
                    print(f"deploy_doc: job {name} on m{m} exited {rc}:\n{open(p.logname).read()}")
                    if rc != 0:
                        raise RuntimeError(f"job {name} on m{m} failed ({rc})")
        return
    if "kill" in head:
        name = head[head.index("kill") + 1]
        for m in machines(head):
            stop_group(lab.jobs.pop((name, m)))
            print(f"deploy_doc: job {name} on m{m} stopped")
        return
    background = "background" in head
    name = opts.get("job", f"line{line}")
    for m in machines(head):
        addr = f"10.0.0.{m + 1}"
        print(f"deploy_doc: docs/deploy.md line {line} on m{m} ({addr}){' in the background' if background else ''}")
        if not background:
            r = subprocess.run(lab.argv(m, text), cwd=work, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, timeout=BLOCK_S)
            print(r.stdout)
            if r.returncode != 0:
                raise RuntimeError(f"line {line} on m{m} exited {r.returncode}")
            continue
        logname = os.path.join(lab.tmp, f"{name}-m{m}.log")
        p = subprocess.Popen(lab.argv(m, text), cwd=work, env=env, stdout=open(logname, "w"),
                             stderr=subprocess.STDOUT, start_new_session=True)
        p.logname = logname
        lab.jobs[(name, m)] = p
        if "ready" in opts:
            ready = os.path.join(work, opts["ready"].replace("$ADDR", addr))
            end = time.monotonic() + READY_S
            while not os.path.exists(ready):
                if p.poll() is not None or time.monotonic() > end:
                    raise RuntimeError(f"line {line} on m{m}: {ready} did not appear:\n"
                                       + open(logname).read()[-2000:])
                time.sleep(0.05)


def main():
    build, src = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    if os.geteuid() != 0 or shutil.which("ip") is None:
        print("skipped: the lab needs root and iproute2 to create network namespaces")
        return SKIP
    doc = os.path.join(src, "docs", "deploy.md")
    steps, trailing = blocks(doc)
    for line, markers, _ in steps:
        if not markers:
            print(f"deploy_doc: docs/deploy.md line {line}: a block without a lab marker")
            return 1
    tmp = tempfile.mkdtemp(prefix="ferry-deploy-doc-")
    work, home = os.path.join(tmp, "work"), os.path.join(tmp, "home")
    os.makedirs(work)
    os.makedirs(home)
    # `python3` is the interpreter the package was built for (this one):
    # the first one on PATH may be another build, without numpy
    pybin = os.path.join(tmp, "bin")
    os.makedirs(pybin)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("FERRY_") and k not in ("LD_PRELOAD", "ASAN_OPTIONS")}
    preload = os.environ.get("LD_PRELOAD")
    if preload:
        # The sanitizer build: its extension needs the ASan runtime first in
        # the interpreter, and only there (curl, for one, hangs with it).
        wrapper = os.path.join(pybin, "python3")
        with open(wrapper, "w") as f:
            f.write(f"#!/bin/sh\nLD_PRELOAD='{preload}' ASAN_OPTIONS='{os.environ.get('ASAN_OPTIONS', '')}' "
                    f"exec '{sys.executable}' \"$@\"\n")
        os.chmod(wrapper, 0o755)
    else:
        os.symlink(sys.executable, os.path.join(pybin, "python3"))
    env.update(HOME=home, PATH=os.pathsep.join([build, pybin, env.get("PATH", "/usr/bin:/bin")]),
               PYTHONPATH=os.path.join(build, "python"))
    lab, rc = None, 1
    try:
        lab = Lab(build, tmp, env)
        for line, markers, text in steps:
            for marker in markers[:-1]:   # pseudo-steps before the block's own marker
                run(lab, work, env, line, marker, "")
            run(lab, work, env, line, markers[-1], text)
        for marker in trailing:
            run(lab, work, env, 0, marker, "")
        print(f"deploy_doc: {len(steps)} blocks of docs/deploy.md ran on the lab")
        rc = 0
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        print(f"deploy_doc: FAILED: {e}")
        for p in lab.jobs.values() if lab else ():
            print(f"--- {p.logname}:\n{open(p.logname).read()[-2000:]}")
    finally:
        if lab:
            try:
                lab.stop()
            except RuntimeError as e:
                print(f"deploy_doc: FAILED: {e}")
                rc = 1
        shutil.rmtree(tmp, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
