"""The capture's failure kinds, and where in the user's code a failure points.

A leaf: it imports nothing of ortmod, so every capture module (and ORTModule) can raise these
without an import circle. Each error subclasses the builtin a caller would expect (TypeError for a
bad dtype, ...) and carries the fallback category that ORTMODULE_FALLBACK_POLICY names."""
import contextlib
import os
import re
import sys

import torch


class UnsupportedDataError(TypeError):
    """An input, parameter or output the engine cannot take (dtype, layout, output type)."""
    fallback_category = "FALLBACK_UNSUPPORTED_DATA"


class UnsupportedDeviceError(ValueError):
    """A tensor on a device the engine does not run on."""
    fallback_category = "FALLBACK_UNSUPPORTED_DEVICE"


class UnsupportedModelError(RuntimeError):
    """The module does something a traced graph cannot reproduce (e.g. mutates a buffer)."""
    fallback_category = "FALLBACK_UNSUPPORTED_TORCH_MODEL"


class ExportError(RuntimeError):
    """torch.onnx.export could not convert the module."""
    fallback_category = "FALLBACK_UNSUPPORTED_ONNX_MODEL"


class TraceHazardWarning(UserWarning):
    """The trace froze Python values computed from tensors (see ortmod.capture.tracing)."""


# ---------------------------------------------------------------------------------------------
# where a failure points: the innermost frame outside torch, ortmod and the standard library

_ORTMOD_DIR = os.path.dirname(os.path.dirname(__file__))
_OWN_DIRS = (os.path.dirname(torch.__file__), _ORTMOD_DIR, os.path.dirname(contextlib.__file__))


def user_frame(depth=2):
    """'file:line' of the innermost caller outside torch, ortmod and the standard library."""
    f = sys._getframe(depth)
    while f is not None:
        name = f.f_code.co_filename
        if not name.startswith(_OWN_DIRS) and not name.startswith("<"):
            return f"{name}:{f.f_lineno}"
        f = f.f_back
    return "<unknown>"


def _is_library(filename):
    """torch's, ortmod's or an installed package's code (transformers' mask checks, ...), not the
    user's own: what it froze is guarded just the same, but the user hears of it only when it
    changes."""
    return filename.startswith(_OWN_DIRS) or "site-packages" in filename or "dist-packages" in filename


def _user_line(stack):
    """'file:line' of the innermost frame of a node's stack trace outside torch and ortmod."""
    own = _OWN_DIRS[:2]
    frames = re.findall(r'File "([^"]+)", line (\d+)', stack)
    for name, line in reversed(frames):
        if not name.startswith(own) and not name.startswith("<"):
            return f"{name}:{line}"
    return f"{frames[-1][0]}:{frames[-1][1]}" if frames else ""
