import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import torch  # noqa: E402

# The suite runs on one capture path at a time: TorchScript unless the run names one
# (`make test-export` runs it all with ORTMOD_CAPTURE=export, the default "auto" path's first
# choice; the tests of the torch.export path and of "auto" itself set their own). Set before
# ortmod reads its options, and inherited by the subprocesses tests start.
os.environ.setdefault("ORTMOD_CAPTURE", "torchscript")


@pytest.fixture(autouse=True)
def seeded():
    """Every test starts from the same torch RNG state (and leaves grad mode as it found it)."""
    torch.manual_seed(0)
    grad = torch.is_grad_enabled()
    yield 0
    torch.set_grad_enabled(grad)


class _OrtmodEnv:
    """monkeypatch.setenv/delenv for the variables ortmod reads: ortmod reads them once
    (ortmod/_options.py), so each change is followed by ortmod.options.reload()."""

    def __init__(self, monkeypatch):
        self.monkeypatch = monkeypatch

    def setenv(self, name, value):
        self.monkeypatch.setenv(name, value)
        _reload_options()

    def delenv(self, name, raising=True):
        self.monkeypatch.delenv(name, raising=raising)
        _reload_options()

    def __getattr__(self, name):      # setattr, setitem, ...: monkeypatch's own
        return getattr(self.monkeypatch, name)


def _reload_options():
    from ortmod import options
    options.reload()


@pytest.fixture
def ortmod_env(monkeypatch):
    """Sets ortmod's environment variables for one test; afterwards the environment and
    ortmod.options are as they were."""
    yield _OrtmodEnv(monkeypatch)
    monkeypatch.undo()
    _reload_options()


@pytest.fixture
def without_torchscript_exporter(ortmod_env):
    """The TorchScript exporter made unavailable, as on a torch that removed it: importing it (or
    any of its modules) raises ImportError; ORTMOD_CAPTURE is unset (auto: ORTModule falls back to
    the torch.export path). Returns ortmod_env."""
    ortmod_env.delenv("ORTMOD_CAPTURE", raising=False)
    # torch.onnx itself imports parts of this torch's TorchScript exporter; a torch without one
    # would not: torch.onnx and the torch.export translator are imported first
    import torch.onnx  # noqa: F401
    from torch.onnx._internal.exporter import _core  # noqa: F401
    for name in [n for n in sys.modules if n.startswith("torch.onnx._internal.torchscript_exporter")]:
        ortmod_env.setitem(sys.modules, name, None)
    ortmod_env.setitem(sys.modules, "torch.onnx._internal.torchscript_exporter", None)
    return ortmod_env
