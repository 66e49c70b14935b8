"""What torch and the ONNX libraries print while ortmod captures a forward, kept from the user's stderr.

A first call exports the module: torch's ONNX registry logs a warning per torchvision op it
skips, torch.export's shape machinery logs a whole FX graph when a value decides control flow,
the tracers warn about each shape they freeze. None of it is something the user did or can act
on: ortmod turns what matters (a value the trace froze) into its own warnings and errors. Within
``quiet_capture`` the records of those libraries' loggers and their warnings are collected instead
of printed; at LogLevel.VERBOSE they go to the "ortmod" logger afterwards, and an exception
leaving the capture carries them (a note says how many, ``exc.ortmod_capture_log`` holds the
text). Other warnings (ortmod's own, the user's, the model library's) are shown as they were.
What the capturing thread prints to sys.stderr is kept the same way (torch.export prints a failed
trace's partial FX graph with print()). To see them, LogLevel.VERBOSE (ORTMODULE_LOG_LEVEL=VERBOSE)
logs them after each capture, TORCH_LOGS' included.
"""
import contextlib
import logging
import io
import os
import sys
import threading
import warnings

import torch

from ._logging import logger

# loggers whose records during a capture are the capture machinery's (each with its children)
NOISY_LOGGERS = ("torch", "onnxscript", "onnx_ir", "onnx")


def _package_dir(name):
    try:
        module = __import__(name)
    except ImportError:
        return None
    return os.path.dirname(os.path.abspath(module.__file__)) + os.sep


def _noisy_dirs():
    return tuple(d for d in map(_package_dir, ("torch", "onnxscript", "onnx_ir", "onnx")) if d)


_NOISY_DIRS = None


def _is_noisy_logger(name):
    return any(name == p or name.startswith(p + ".") for p in NOISY_LOGGERS)


class _Collector(logging.Filter):
    """A handler filter: records of the noisy loggers made on this thread are kept, not emitted
    (a record reaching several handlers is kept once)."""

    def __init__(self):
        super().__init__()
        self.thread = threading.get_ident()
        self.records = []
        self._seen = set()

    def filter(self, record):
        if record.thread != self.thread or not _is_noisy_logger(record.name):
            return True
        if id(record) not in self._seen:
            self._seen.add(id(record))
            self.records.append(record)
        return False


class _ThreadStderr:
    """sys.stderr while a capture runs: what the capturing thread writes is kept (torch.export
    prints a failed trace's partial FX graph there with print()), other threads write through."""

    def __init__(self, stream):
        self._stream = stream
        self._thread = threading.get_ident()
        self.kept = io.StringIO()

    def write(self, text):
        if threading.get_ident() == self._thread:
            return self.kept.write(text)
        return self._stream.write(text)

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def flush(self):
        if threading.get_ident() != self._thread:
            self._stream.flush()

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _handlers():
    """Every handler a record of the noisy loggers can reach now: theirs, the root logger's and
    logging's last resort."""
    found = []
    loggers = [lg for name, lg in list(logging.Logger.manager.loggerDict.items())
               if isinstance(lg, logging.Logger) and _is_noisy_logger(name)]
    for lg in loggers + [logging.getLogger()]:
        for h in lg.handlers:
            if h not in found:
                found.append(h)
    if logging.lastResort is not None and logging.lastResort not in found:
        found.append(logging.lastResort)
    return found


def _is_noisy_warning(msg):
    global _NOISY_DIRS
    if issubclass(msg.category, torch.jit.TracerWarning):
        return True          # ortmod's own trace-hazard warnings say what matters of these
    if _NOISY_DIRS is None:
        _NOISY_DIRS = _noisy_dirs()
    return str(msg.filename).startswith(_NOISY_DIRS)


class CaptureLog:
    """What quiet_capture kept: ``lines``, one per log record or warning."""

    def __init__(self):
        self.lines = []

    def text(self):
        return "\n".join(self.lines)


@contextlib.contextmanager
def quiet_capture(what):
    """Collects the noisy libraries' log records and warnings for the duration (see the module's
    docstring); ``what`` names the capture in the VERBOSE log. Yields a CaptureLog."""
    log = CaptureLog()
    collector = _Collector()
    handlers = _handlers()
    for h in handlers:
        h.addFilter(collector)
    shown = []
    stderr = sys.stderr
    proxy = sys.stderr = _ThreadStderr(stderr)
    try:
        with warnings.catch_warnings(record=True) as caught:
            try:
                yield log
            finally:
                for h in handlers:
                    h.removeFilter(collector)
                if sys.stderr is proxy:
                    sys.stderr = stderr
                printed = proxy.kept.getvalue().strip("\n")
                if printed:
                    log.lines.append("printed to stderr: " + printed)
                for record in collector.records:
                    log.lines.append(f"{record.levelname} {record.name}: {record.getMessage()}")
                for msg in caught:
                    if _is_noisy_warning(msg):
                        log.lines.append(f"{msg.category.__name__} {msg.filename}:{msg.lineno}: {msg.message}")
                    else:
                        shown.append(msg)
    except BaseException as e:
        if log.lines and isinstance(e, Exception):
            e.ortmod_capture_log = log.text()
            e.add_note(f"ortmod: torch and the ONNX libraries logged {len(log.lines)} message(s) during the "
                       "capture (in this exception's ortmod_capture_log; DebugOptions(log_level=LogLevel.VERBOSE) "
                       "logs them); the first: " + log.lines[0].split("\n", 1)[0][:300])
        raise
    finally:
        # the warnings that are not the capture's own noise, shown as they would have been (the
        # filters already let them through)
        for msg in shown:
            warnings.showwarning(msg.message, msg.category, msg.filename, msg.lineno, msg.file, msg.line)
        if log.lines and logger.isEnabledFor(logging.DEBUG):
            logger.debug("while capturing %s, torch and the ONNX libraries said:\n%s", what, log.text())
