"""The library's log lines in Python's logging.

``import ferry`` installs the bridge that queues every line the C library
logs (python/ferry/_cffi_bridge.c: lines are queued by the logging thread
and delivered on the main thread at its next bytecode, never under a lock
the caller may hold); :func:`log_flush` hands them to :func:`emit`. Each
line becomes a record of logger ``ferry.<tag>`` (a child of ``ferry``:
configure that one) at the matching level, with the time and thread id of
the line's origin. The library's own threshold (FERRY_LOG, default warn)
decides which lines exist at all: :func:`set_log_level`.
"""

import atexit
import logging

from ._binding import ffi, lib
from ._call import str_of

__all__ = ["set_log_level", "get_log_level", "log_flush"]

# ferry_log_level -> logging level
_LEVELS = {lib.FERRY_LOG_DEBUG: logging.DEBUG, lib.FERRY_LOG_INFO: logging.INFO, lib.FERRY_LOG_WARN: logging.WARNING,
           lib.FERRY_LOG_ERROR: logging.ERROR}
_NAMES = {"debug": 0, "info": 1, "warn": 2, "warning": 2, "error": 3, "critical": 3, "off": 4, "none": 4}
_BATCH = 16
_installed = False


def emit(lines):
    """Make a logging record of each (level, tag, msg, time, thread) line."""
    for level, tag, msg, created, thread in lines:
        logger = logging.getLogger(f"ferry.{tag}" if tag.isidentifier() else "ferry")
        lvl = _LEVELS.get(level, logging.WARNING)
        if not logger.isEnabledFor(lvl):
            continue
        rec = logger.makeRecord(logger.name, lvl, "(ferry)", 0, msg, None, None)
        if created:
            rec.created = created
            rec.msecs = (created - int(created)) * 1000
            rec.relativeCreated = (created - logging._startTime) * 1000
        if thread:
            rec.thread = thread
            rec.threadName = "ferry"
        rec.ferry_tag = tag
        logger.handle(rec)


def log_flush():
    """Deliver the queued log lines now (they are also delivered at the
    main thread's next bytecode, and at exit)."""
    buf = ffi.new("fp_log_line[]", _BATCH)
    dropped = ffi.new("unsigned long long *")
    while True:
        n = lib.fp_log_take(buf, _BATCH, dropped)
        if n == 0 and dropped[0] == 0:
            return
        if not _installed:
            continue   # not installed: lines are discarded
        lines = [(ln.level, str_of(ln.tag), str_of(ln.msg), ln.time, ln.thread) for ln in buf[0:n]]
        if dropped[0]:
            lines.append((lib.FERRY_LOG_WARN, "log",
                          f"{dropped[0]} log lines were dropped: Python did not take them fast enough", 0.0, 0))
        emit(lines)


@ffi.def_extern()
def fp_log_deliver():
    """The bridge's pending call: the main thread, at its next bytecode."""
    log_flush()


def set_log_level(level):
    """The level below which the library drops lines before they reach
    logging: "debug", "info", "warn", "error", "off", or a logging level
    (logging.DEBUG, ...). Process-wide; the default comes from FERRY_LOG
    (warn). Returns the previous level's name."""
    prev = get_log_level()
    if isinstance(level, str):
        try:
            n = _NAMES[level.lower()]
        except KeyError:
            raise ValueError(f"log level must be one of {sorted(_NAMES)} or a logging level, not {level!r}") \
                from None
    elif isinstance(level, int):
        n = 0 if level <= logging.DEBUG else 1 if level <= logging.INFO else 2 if level <= logging.WARNING \
            else 3 if level <= logging.CRITICAL else 4
    else:
        raise TypeError(f"log level must be a name or an int, not {type(level).__name__}")
    lib.ferry_log_set_level(n)
    return prev


def get_log_level():
    """The library's current level name ("debug", "info", "warn", "error", "off")."""
    return ("debug", "info", "warn", "error", "off")[lib.ferry_log_get_level()]


def _uninstall():
    """At exit: lines go to stderr again, the queued ones to logging first."""
    global _installed
    lib.fp_log_uninstall()
    try:
        log_flush()
    finally:
        _installed = False


def _install():
    global _installed
    if lib.fp_log_install() < 0:
        raise MemoryError("the log queue")
    _installed = True
    atexit.register(_uninstall)   # before the interpreter goes: stderr again
