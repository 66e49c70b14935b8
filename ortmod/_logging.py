"""Logging for ortmod: one ``logging`` logger named "ortmod".

The engine's own log lines arrive through a callback and are forwarded here, so
users configure everything with the standard ``logging`` module.
"""
import enum
import logging

logger = logging.getLogger("ortmod")


class LogLevel(enum.IntEnum):
    """Severity levels, numbered as the engine numbers them (and as ORT does)."""

    VERBOSE = 0
    INFO = 1
    WARNING = 2
    ERROR = 3
    FATAL = 4


_TO_PYTHON = {
    LogLevel.VERBOSE: logging.DEBUG,
    LogLevel.INFO: logging.INFO,
    LogLevel.WARNING: logging.WARNING,
    LogLevel.ERROR: logging.ERROR,
    LogLevel.FATAL: logging.CRITICAL,
}


def python_level(level):
    """Map an engine/LogLevel integer to a ``logging`` level."""
    try:
        return _TO_PYTHON[LogLevel(int(level))]
    except ValueError:
        return logging.CRITICAL if int(level) > LogLevel.FATAL else logging.DEBUG


def configure(log_level):
    """Make the "ortmod" logger follow ``log_level``.

    If the user asked for more than warnings and nobody configured logging at all,
    attach a stderr handler so the requested lines are actually seen (Python's
    last-resort handler only prints warnings and above).
    """
    logger.setLevel(python_level(log_level))
    if (python_level(log_level) < logging.WARNING and not logger.handlers
            and not logging.getLogger().handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[ortmod %(levelname)s] %(message)s"))
        logger.addHandler(handler)


def engine_log_callback(level, msg):
    """The ``log`` callable handed to ``ortmod._C.Engine``."""
    logger.log(python_level(level), "%s", msg)
