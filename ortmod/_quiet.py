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
trace's partial FX graph with print()), and what torch's C++ code writes to the stderr descriptor
in the known shapes of its notes (the TorchScript exporter's "In-place op on output of
tensor.shape", once per such op: 52 lines for MobileNetV2). To see them, LogLevel.VERBOSE (ORTMODULE_LOG_LEVEL=VERBOSE)
logs them after each capture, TORCH_LOGS' included.
"""
import contextlib
import logging
import io
import os
import re
import sys
import tempfile
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
    """sys.stderr while a capture runs: what torch's or the ONNX libraries' code writes on the
    capturing thread is kept (torch.export prints a failed trace's partial FX graph there with
    print()); the rest (the user's forward printing, other threads) writes through."""

    def __init__(self, stream):
        self._stream = stream
        self._thread = threading.get_ident()
        self.kept = io.StringIO()

    def write(self, text):
        if threading.get_ident() == self._thread and _written_by_noisy_code():
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


# what torch's C++ code writes to the stderr file descriptor itself while it exports (the
# TorchScript exporter's std::cerr notes, c10's printed warnings): lines of these shapes go to the
# capture's log; any other line written to the descriptor meanwhile is written back after it
_NATIVE_NOISE = re.compile(r"^(In-place op on output of tensor\.shape\b|\[W\d{4} |Warning: )")


@contextlib.contextmanager
def _native_stderr(log):
    """File descriptor 2 goes to a temporary file for the duration; afterwards the lines that
    _NATIVE_NOISE matches go to ``log``, the rest back to stderr."""
    try:
        fd = sys.__stderr__.fileno() if sys.__stderr__ is not None else 2
        saved = os.dup(fd)
    except (OSError, ValueError, AttributeError):
        yield            # no descriptor to redirect (an embedded interpreter, a closed stderr)
        return
    with tempfile.TemporaryFile() as tmp:
        _flush_stderr()
        os.dup2(tmp.fileno(), fd)
        try:
            yield
        finally:
            _flush_stderr()
            os.dup2(saved, fd)
            os.close(saved)
            tmp.seek(0)
            text = tmp.read().decode("utf-8", "replace")
            passed = []
            for line in text.splitlines(keepends=True):
                if _NATIVE_NOISE.match(line):
                    log.lines.append("torch (native): " + line.rstrip("\n"))
                else:
                    passed.append(line)
            if passed:
                os.write(fd, "".join(passed).encode("utf-8", "replace"))


def _flush_stderr():
    for stream in (sys.stderr, sys.__stderr__):
        try:
            stream.flush()
        except (AttributeError, ValueError, OSError):
            pass


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


def _noisy_file(filename):
    global _NOISY_DIRS
    if _NOISY_DIRS is None:
        _NOISY_DIRS = _noisy_dirs()
    return str(filename).startswith(_NOISY_DIRS)


def _written_by_noisy_code():
    """Whether the Python code writing to sys.stderr now (print() or a write, two frames up) is
    torch's or the ONNX libraries'."""
    frame = sys._getframe(2)
    return frame is not None and _noisy_file(frame.f_code.co_filename)


_STDLIB_DIR = os.path.dirname(os.path.abspath(contextlib.__file__)) + os.sep
_WARNINGS_FILE = os.path.abspath(warnings.__file__)


def _warning_origin():
    """The file of the code that called warnings.warn, seen from inside the warnings machinery
    (the frames of warnings.py skipped)."""
    frame = sys._getframe(2)
    while frame is not None and os.path.abspath(frame.f_code.co_filename) == _WARNINGS_FILE:
        frame = frame.f_back
    return frame.f_code.co_filename if frame is not None else ""


def _is_noisy_warning(msg, origin=""):
    if issubclass(msg.category, torch.jit.TracerWarning):
        return True          # ortmod's own trace-hazard warnings say what matters of these
    if _noisy_file(msg.filename):
        return True
    # a stacklevel that lands in the standard library (torch.export's "tensor attributes ... were
    # assigned during export" names contextlib.py) says nothing of whose it is: who called warn does
    return str(msg.filename).startswith(_STDLIB_DIR) and _noisy_file(origin)


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
        with _native_stderr(log), warnings.catch_warnings(record=True) as caught:
            origins = {}   # id(msg) -> the file that called warn

            def record(msg):
                origins[id(msg)] = _warning_origin()
                caught.append(msg)
            warnings._showwarnmsg_impl = record   # what record=True installed, plus the origin
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
                    if _is_noisy_warning(msg, origins.get(id(msg), "")):
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
