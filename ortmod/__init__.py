"""ortmod: run a PyTorch module's forward and backward on ortmod's own C engine.

    from ortmod import ORTModule
    model = ORTModule(model)

On the first call the module is exported to ONNX and compiled (graph optimization,
backward-graph generation, memory planning); later calls run on the engine.
"""
from ._logging import LogLevel
from .capture.errors import ExportError, UnsupportedDataError, UnsupportedDeviceError, UnsupportedModelError
from ._module import DebugOptions, ORTModule
from ._options import options
from ._explain import explain

try:
    from ._C import EngineError, InvalidInputError, UnsupportedOpError
except ImportError as _e:  # pragma: no cover - only without a built extension
    _C_IMPORT_ERROR = _e

    def __getattr__(name):
        if name in ("EngineError", "InvalidInputError", "UnsupportedOpError"):
            raise ImportError(
                f"ortmod.{name} comes from the C extension ortmod._C, which is not built or failed "
                f"to load ({_C_IMPORT_ERROR}). Build it with `make setup` "
                "(or `pip install .`).") from _C_IMPORT_ERROR
        raise AttributeError(f"module 'ortmod' has no attribute {name!r}")

__all__ = ["ORTModule", "DebugOptions", "LogLevel", "options", "EngineError", "InvalidInputError", "UnsupportedOpError",
           "ExportError", "UnsupportedModelError", "UnsupportedDataError", "UnsupportedDeviceError", "explain"]
