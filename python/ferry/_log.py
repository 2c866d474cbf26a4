"""The library's log lines in Python's logging.

``import ferry`` installs :func:`emit` as the receiver of every line the C
library logs (see _ferry_log.c: lines are queued by the logging thread and
delivered on the main thread at its next bytecode, never under a lock the
caller may hold). Each line becomes a record of logger ``ferry.<tag>`` (a
child of ``ferry``: configure that one) at the matching level, with the time
and thread id of the line's origin. The library's own threshold (FERRY_LOG,
default warn) decides which lines exist at all: :func:`set_log_level`.
"""

import atexit
import logging

from . import _ferry

__all__ = ["set_log_level", "get_log_level", "log_flush"]

# ferry_log_level -> logging level
_LEVELS = {0: logging.DEBUG, 1: logging.INFO, 2: logging.WARNING, 3: logging.ERROR}
_NAMES = {"debug": 0, "info": 1, "warn": 2, "warning": 2, "error": 3, "critical": 3, "off": 4, "none": 4}

log_flush = _ferry.log_flush


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
    _ferry._log_set_level(n)
    return prev


def get_log_level():
    """The library's current level name ("debug", "info", "warn", "error", "off")."""
    return ("debug", "info", "warn", "error", "off")[_ferry._log_get_level()]


def _install():
    _ferry._log_install(emit)
    atexit.register(_ferry._log_uninstall)   # before the interpreter goes: stderr again
