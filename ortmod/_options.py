"""ortmod's configuration: every environment variable ortmod reads, read once, in one place.

    import ortmod
    ortmod.options.max_cached_plans            # 32, or ORTMOD_MAX_CACHED_PLANS
    ortmod.options.disable_passes = "cse"      # validated: a ValueError names the field
    with ortmod.options.overridden(capture="export", memory_opt_level=1):
        ...                                    # set for a block, then put back

``ortmod.options`` holds two kinds of field. The Python package's own (log level, fallback
policy, capture path, ...) are read from the environment here, on the first use of any of them.
The engine's (csrc/include/ortmod_options.h: plan cache, recompute level, passes, threads, CUDA)
are the C options struct, read once by the engine and reached through ``ortmod._C``
(get_options/set_options), so that ORTModule, ``_C.Engine`` and ``ortmod-train`` agree.

A variable set to a value its field does not take is a ValueError naming the variable, raised
where the value is first needed (DebugOptions, ORTModule, an engine), never a silent default.
Changing ``os.environ`` after the first read changes nothing until ``ortmod.options.reload()``.
Where a DebugOptions field or an API argument exists, it wins over the variable, except
ORTMODULE_LOG_LEVEL, which (as in ONNX Runtime) overrides DebugOptions.log_level.

Threads (three knobs; the precedence is documented here and in docs/options.md): the engine's
pool runs torch.get_num_threads() threads under ORTModule (set before each call, so torch,
BLAS and the engine share one count; torch itself reads OMP_NUM_THREADS); elsewhere (``_C``
alone, ``ortmod-train``) it runs ``num_threads`` (OMP_NUM_THREADS), else one per CPU.
``optim_num_threads`` (ORTMOD_NUM_THREADS) only caps the optimizer kernels below that, and
``threads`` (ORTMOD_THREADS=torch) runs the same work on torch's OpenMP team instead.

docs/options.md's table and tests/test_options.py check this file, the engine's and the docs agree.
"""
import contextlib
import os
import threading
from typing import NamedTuple

from ._logging import LogLevel


class Variable(NamedTuple):
    """One environment variable: its name, the ``ortmod.options`` field it sets, the field's
    default, who reads it ("python" or "engine") and what it does."""
    name: str
    field: str
    default: object
    reader: str
    doc: str


FALLBACK_POLICIES = (
    "FALLBACK_DISABLE",                  # never fall back (the default)
    "FALLBACK_FORCE_TORCH_FORWARD",      # always run the module in PyTorch
    "FALLBACK_UNSUPPORTED_DEVICE",       # a tensor on a device the engine does not run on
    "FALLBACK_UNSUPPORTED_DATA",         # an input/output/parameter type or dtype it cannot take
    "FALLBACK_UNSUPPORTED_TORCH_MODEL",  # the module does what a traced graph cannot reproduce
    "FALLBACK_UNSUPPORTED_ONNX_MODEL",   # export failed, or the engine cannot build/run the graph
    "FALLBACK_BAD_INITIALIZATION",       # the C extension failed to load
)
CAPTURE_PATHS = ("auto", "torchscript", "export")
THREAD_TEAMS = ("own", "torch")
DEFAULT_MAX_CACHED_GRAPHS = 16
DEFAULT_MAX_CACHED_PLANS = 32     # the engine's default (csrc/core/options.c) too
MAX_CACHE_LIMIT = 1 << 20
_ON, _OFF = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")

VARIABLES = (
    Variable("ORTMODULE_LOG_LEVEL", "log_level", None, "python",
             "VERBOSE/INFO/WARNING/ERROR/FATAL or 0-4; overrides DebugOptions.log_level"),
    Variable("ORTMODULE_FALLBACK_POLICY", "fallback_policy", frozenset(), "python",
             "ORT's policy names joined by '|': run PyTorch instead for those kinds of failure"),
    Variable("ORTMOD_CAPTURE", "capture", "auto", "python",
             "export, torchscript or auto (torch.export, TorchScript where it cannot capture; DebugOptions.capture)"),
    Variable("ORTMOD_STRICT_TRACE", "strict_trace", False, "python",
             "a value the trace froze in user code is an error (DebugOptions.strict_trace)"),
    Variable("ORTMOD_INLINE_AUTOGRAD_FUNCTIONS", "inline_autograd_functions", False, "python",
             "custom autograd.Functions are inlined (DebugOptions.inline_autograd_functions)"),
    Variable("ORTMOD_MAX_CACHED_GRAPHS", "max_cached_graphs", DEFAULT_MAX_CACHED_GRAPHS, "python",
             "exports and engines one ORTModule keeps (DebugOptions.max_cached_graphs)"),
    Variable("ORTMOD_THREADS", "threads", "own", "python", "torch: run the engine's kernels on torch's OpenMP team"),
    Variable("ORTMOD_TRAIN_BINARY", "train_binary", None, "python", "the runner binary the ortmod-train script runs"),
    Variable("ORTMOD_UNTESTED_TORCH", "untested_torch", False, "python",
             "import with a torch release outside the tested range (pyproject.toml), untested"),
    Variable("ORTMOD_MAX_CACHED_PLANS", "max_cached_plans", DEFAULT_MAX_CACHED_PLANS, "engine",
             "plans one engine keeps (DebugOptions.max_cached_plans, Engine(max_plans=))"),
    Variable("ORTMODULE_MEMORY_OPT_LEVEL", "memory_opt_level", 0, "engine",
             "0 stash all, 1 recompute cheap activations, 2 recompute layer by layer"),
    Variable("ORTMOD_PROFILE", "profile", False, "engine", "per-op kernel times in the engine's report"),
    Variable("ORTMOD_DISABLE_PASSES", "disable_passes", "", "engine", "pass names (or all) that compiles skip"),
    Variable("ORTMOD_NUM_THREADS", "optim_num_threads", 0, "engine", "cap on the optimizer kernels' threads (0: none)"),
    Variable("OMP_NUM_THREADS", "num_threads", 0, "engine",
             "the engine pool's size where nothing set one (0: the CPUs)"),
    Variable("ORTMOD_CUDA_LIBRARY", "cuda_library", "", "engine", "the CUDA provider to load ('': the packaged one)"),
    Variable("ORTMOD_CUDA_ATTENTION", "cuda_attention", "flash", "engine",
             "materialized: attention on CUDA through cuBLAS, never the flash kernels"),
)
_BY_FIELD = {v.field: v for v in VARIABLES}
_PYTHON_FIELDS = tuple(v.field for v in VARIABLES if v.reader == "python")
_ENGINE_FIELDS = tuple(v.field for v in VARIABLES if v.reader == "engine")


# --------------------------------------------------------------------------- the Python fields
#
# Each takes (value, where): the environment's text (where: the variable) or a value set in
# Python (where: "options.<field>"), and returns the field's value or raises ValueError(where: ...).

def _log_level(value, where):
    if value is None:
        return None
    text = str(value).strip()
    try:
        if isinstance(value, int) or text.lstrip("-").isdigit():
            return LogLevel(int(text))
        return LogLevel[text.upper()]
    except (KeyError, ValueError):
        raise ValueError(f"{where}: unknown level {text!r}; valid: "
                         f"{', '.join(v.name for v in LogLevel)} or 0-4") from None


def _fallback_policy(value, where):
    parts = value.split("|") if isinstance(value, str) else list(value)
    names = set()
    for part in (str(p).strip() for p in parts):
        if not part:
            continue
        name = part.rpartition(".")[2].upper()     # also "_FallbackPolicy.FALLBACK_..."
        if name not in FALLBACK_POLICIES:
            raise ValueError(f"{where}: unknown policy {part!r}; valid names: {', '.join(FALLBACK_POLICIES)} "
                             "(combine with '|')")
        names.add(name)
    return frozenset() if "FALLBACK_DISABLE" in names else frozenset(names)


def _capture(value, where):
    text = str(value).strip().lower() or "auto"
    if text not in CAPTURE_PATHS:
        raise ValueError(f"{where}: unknown capture path {text!r}; valid: {', '.join(CAPTURE_PATHS)}")
    return text


def _flag(value, where):
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _ON or text in _OFF:
        return text in _ON
    raise ValueError(f"{where}: {value!r} is not on or off (1/true/yes/on, 0/false/no/off)")


def _cache_limit(value, where, from_env=False):
    if from_env:                      # only the environment's text is a number written out
        text = value.strip()
        n = int(text) if text.isdigit() else 0
        if not 1 <= n <= MAX_CACHE_LIMIT:
            raise ValueError(f"{where}: {text!r} is not a whole number in 1..{MAX_CACHE_LIMIT}")
        return n
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_CACHE_LIMIT:
        raise ValueError(f"{where}: {value!r} is not a whole number in 1..{MAX_CACHE_LIMIT}")
    return value


def _threads(value, where):
    text = str(value).strip().lower() or "own"
    if text not in THREAD_TEAMS:
        raise ValueError(f"{where}: {value!r} is not own or torch")
    return text


def _path(value, where):
    if value is None or value == "":
        return None
    if not isinstance(value, (str, os.PathLike)):
        raise ValueError(f"{where}: {value!r} is not a path")
    return os.fspath(value)


_PARSE = {
    "log_level": _log_level, "fallback_policy": _fallback_policy, "capture": _capture,
    "strict_trace": _flag, "inline_autograd_functions": _flag, "max_cached_graphs": _cache_limit,
    "threads": _threads, "train_binary": _path, "untested_torch": _flag,
}
_PARSE_ENV = dict(_PARSE, max_cached_graphs=lambda text, where: _cache_limit(text, where, from_env=True))


def _engine():
    from . import _C     # here, not at import: ortmod imports without a built extension
    return _C


class Options:
    """The one options object (``ortmod.options``); see the module's docstring."""

    def __init__(self):
        object.__setattr__(self, "_lock", threading.RLock())
        object.__setattr__(self, "_values", None)     # field -> value; None until first read
        object.__setattr__(self, "_errors", {})       # field -> message of the environment's bad value

    variables = VARIABLES

    def _load(self):
        values, errors = {}, {}
        for field in _PYTHON_FIELDS:
            var = _BY_FIELD[field]
            text = os.environ.get(var.name, "")
            values[field] = var.default
            if text.strip():
                try:
                    values[field] = _PARSE_ENV[field](text, var.name)
                except ValueError as e:
                    errors[field] = str(e)
        object.__setattr__(self, "_errors", errors)
        object.__setattr__(self, "_values", values)

    def _python(self):
        if self._values is None:
            with self._lock:
                if self._values is None:
                    self._load()
        return self._values

    def __getattr__(self, field):
        if field in _PYTHON_FIELDS:
            values = self._python()
            if field in self._errors:
                raise ValueError(self._errors[field])
            return values[field]
        if field in _ENGINE_FIELDS:
            return _engine().get_options(field)[field]     # only this field's variable must be good
        raise AttributeError(f"ortmod.options has no field {field!r}; fields: {', '.join(_BY_FIELD)}")

    def __setattr__(self, field, value):
        self.set(**{field: value})

    def set(self, **fields):
        """Sets fields, each validated first (a ValueError names it); nothing changes on an error."""
        unknown = [f for f in fields if f not in _BY_FIELD]
        if unknown:
            raise AttributeError(f"ortmod.options has no field {unknown[0]!r}; fields: {', '.join(_BY_FIELD)}")
        python = {f: _PARSE[f](v, f"options.{f}") for f, v in fields.items() if f in _PYTHON_FIELDS}
        engine = {f: v for f, v in fields.items() if f in _ENGINE_FIELDS}
        if "disable_passes" in engine and not isinstance(engine["disable_passes"], str):
            engine["disable_passes"] = ",".join(engine["disable_passes"])
        with self._lock:
            values = self._python()
            if engine:
                _engine().set_options(**engine)
            values.update(python)
            for f in python:
                self._errors.pop(f, None)

    @contextlib.contextmanager
    def overridden(self, **fields):
        """Sets fields for the duration of a ``with`` block, then puts back what was there."""
        with self._lock:
            values = self._python()
            saved_python = {f: (values[f], self._errors.get(f)) for f in fields if f in _PYTHON_FIELDS}
            engine = [f for f in fields if f in _ENGINE_FIELDS]
            saved_engine = {f: v for f, v in _engine().get_options().items() if f in engine} if engine else {}
        self.set(**fields)
        try:
            yield self
        finally:
            with self._lock:
                if saved_engine:
                    _engine().set_options(**saved_engine)
                for f, (value, error) in saved_python.items():
                    values[f] = value
                    if error is None:
                        self._errors.pop(f, None)
                    else:
                        self._errors[f] = error

    def reload(self):
        """Reads every variable again (after os.environ changed), replacing what was set. Bad values
        raise where they are used, as on the first read."""
        with self._lock:
            self._load()
            try:
                engine = _engine()
            except ImportError:
                return
            engine.reload_options()

    def as_dict(self):
        """Every field's value (a bad variable raises, naming it)."""
        out = {f: getattr(self, f) for f in _PYTHON_FIELDS}
        out.update(_engine().get_options())
        return out

    def __repr__(self):
        try:
            return f"ortmod.options({self.as_dict()})"
        except (ValueError, ImportError) as e:
            return f"ortmod.options(<{e}>)"


options = Options()
