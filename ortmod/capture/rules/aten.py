"""The rules written once for both capture paths (``emitter.aten_rule``), one module per family,
each named ``aten_<family>.py`` in this folder: importing a family registers its rules, and
``load`` imports every such file, so a new family is its one file. Both paths' registries
(torchscript_registry, export_registry) and the torch.export audit read the rules through the
functions below."""
import importlib
import os
import pkgutil

from . import emitter

_FOLDER = os.path.dirname(os.path.abspath(__file__))


def families():
    """The family modules' names (``aten_*.py`` beside this file), sorted."""
    return sorted(m.name for m in pkgutil.iter_modules([_FOLDER]) if m.name.startswith("aten_"))


def load():
    """Import every family (once: Python's module cache); the rules they registered."""
    for name in families():
        importlib.import_module(f"{__package__}.{name}")
    return emitter.RULES


def torchscript_symbolics():
    load()
    return emitter.torchscript_symbolics()


def export_translations(op, ir, stop_gradient):
    load()
    return emitter.export_translations(op, ir, stop_gradient)


def reviewed():
    load()
    return emitter.reviewed()


def audit_checks():
    load()
    return emitter.audit_checks()
