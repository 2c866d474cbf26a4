"""The library's log lines in Python's logging (docs/python.md, "Logging"):
loggers ``ferry.<tag>`` under ``ferry``, from the calling thread and from
library threads, without taking the GIL on the logging thread."""

import logging
import os
import secrets
import subprocess
import sys
import threading
import time

import pytest

import ferry
from conftest import require_ferry_bin, running_cluster


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append(record)


@pytest.fixture
def records():
    h = Records()
    log = logging.getLogger("ferry")
    old = log.level
    log.addHandler(h)
    log.setLevel(logging.DEBUG)
    prev = ferry.set_log_level("info")
    yield h.records
    ferry.set_log_level(prev)
    log.removeHandler(h)
    log.setLevel(old)


def wait_for(cond, what, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.01)   # the main thread runs bytecode: queued lines are delivered


def test_set_log_level_round_trip():
    prev = ferry.set_log_level("debug")
    try:
        assert ferry.get_log_level() == "debug"
        assert ferry.set_log_level(logging.ERROR) == "debug" and ferry.get_log_level() == "error"
        with pytest.raises(ValueError, match="log level"):
            ferry.set_log_level("loud")
    finally:
        ferry.set_log_level(prev)


def test_line_from_the_calling_thread(records, monkeypatch):
    monkeypatch.setenv("FERRY_TOKEN", secrets.token_hex(32))
    e = ferry.Engine()
    try:
        wait_for(lambda: any(r.name == "ferry.engine" and "open:" in r.getMessage() for r in records),
                 "engine open line")
    finally:
        e.close()
    r = next(r for r in records if r.name == "ferry.engine")
    assert r.levelno == logging.INFO and r.ferry_tag == "engine" and r.thread == threading.get_ident()
    assert not r.getMessage().startswith("ferry[")            # the message, without the stderr head


def test_line_from_a_library_thread(records, tmp_path):
    """The master dies: the client's connection thread logs that it lost it,
    while the main thread holds the GIL in a loop of its own; the line
    waits in the queue and arrives after, from that thread's id."""
    require_ferry_bin()
    with running_cluster(tmp_path, 1) as c:
        with c.store() as s:
            s.put("log/a", b"1")
            c.procs[0].kill()
            c.procs[0].wait()
            end = time.monotonic() + 0.5
            n = 0
            while time.monotonic() < end:                  # holds the GIL most of the time
                n += 1
            wait_for(lambda: any(r.name == "ferry.mconn" and "lost" in r.getMessage() for r in records),
                     "connection-lost line")
    r = next(r for r in records if r.name == "ferry.mconn" and "lost" in r.getMessage())
    assert r.levelno == logging.WARNING and r.thread != threading.main_thread().ident
    assert "reconnecting" in r.getMessage() and n > 1000


def test_lines_reach_logging_in_a_fresh_interpreter():
    """import ferry is enough; the last lines are delivered at exit."""
    code = ("import logging, ferry\n"
            "logging.basicConfig(level=logging.INFO, format='%(levelname)s %(name)s %(message)s')\n"
            "ferry.set_log_level('info')\n"
            "e = ferry.Engine(); e.close()\n")
    env = dict(os.environ, FERRY_TOKEN=secrets.token_hex(32))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "INFO ferry.engine open: " in p.stderr, p.stderr
    assert "ferry[" not in p.stderr, p.stderr                 # nothing bypassed logging
