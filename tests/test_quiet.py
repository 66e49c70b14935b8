"""A first call prints nothing but what ortmod itself has to say.

torch's ONNX registry logs a warning per torchvision op it skips, torch.export's shape machinery
logs (and prints, with print()) a partial FX graph when a value decides control flow: all of it is
kept from stderr while ortmod captures, shown at LogLevel.VERBOSE and carried by an exception that
leaves the capture (ortmod/_quiet.py). Each case runs in a fresh process: torch's registry is built
once per process, and its warnings came with the first export.
"""
import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
import torch.nn as nn

import ortmod
from ortmod import ORTModule

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = textwrap.dedent("""
    import sys
    import torch, torch.nn as nn
    from ortmod import ORTModule

    class MLP(nn.Module):             # demo/train_mlp.py's
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(2, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 3))
            self.loss = nn.CrossEntropyLoss()
        def forward(self, x, y):
            return self.loss(self.net(x), y)

    class Branchy(MLP):               # a value read from a tensor decides the branch
        def forward(self, x, y):
            loss = super().forward(x, y)
            if loss > 0:
                return loss * 2
            return loss

    class ConvNet(nn.Module):         # the TorchScript exporter's C++ writes a note per in-place op
        def __init__(self):           # on a shape to the stderr descriptor ("In-place op on ...")
            super().__init__()
            self.conv, self.bn, self.head = nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Linear(4, 3)
        def forward(self, x, y):
            h = torch.relu_(self.bn(self.conv(x)))
            h = nn.functional.adaptive_avg_pool2d(h, 1).flatten(1)
            return nn.functional.cross_entropy(self.head(h), y)

    class LSTMNet(nn.Module):         # torch.export warns that it saw _flat_weights assigned, with a
        def __init__(self):           # stacklevel that names contextlib.py, not torch
            super().__init__()
            self.rnn, self.head = nn.LSTM(2, 8, batch_first=True), nn.Linear(8, 3)
        def forward(self, x, y):
            return nn.functional.cross_entropy(self.head(self.rnn(x.unsqueeze(1))[0][:, -1]), y)

    model = ORTModule({model}())
    x = torch.randn(8, 3, 8, 8) if {model} is ConvNet else torch.randn(8, 2)
    y = torch.randint(0, 3, (8,))
    for _ in range(2):
        model(x, y).backward()
    print("trained", model._ortmod_export_count)
""")


def first_call(tmp_path, model, capture, log_level=None):
    env = dict(os.environ, ORTMOD_CAPTURE=capture, PYTHONPATH=ROOT)
    env.pop("ORTMODULE_LOG_LEVEL", None)
    if log_level:
        env["ORTMODULE_LOG_LEVEL"] = log_level
    script = tmp_path / f"first_call_{model}.py"      # a file: warnings show their source line
    script.write_text(SCRIPT.format(model=model))
    proc = subprocess.run([sys.executable, str(script)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "trained 1", proc.stdout
    return proc.stderr


def _torchvision_missing():
    try:
        import torchvision  # noqa: F401
    except ImportError:
        return True
    return False


@pytest.mark.parametrize("model,capture", [("MLP", "auto"), ("MLP", "torchscript"), ("ConvNet", "torchscript"),
                                           ("LSTMNet", "auto")])
def test_first_call_prints_nothing(tmp_path, model, capture):
    assert first_call(tmp_path, model, capture) == ""


def test_a_frozen_branch_prints_only_ortmods_warning(tmp_path):
    """torch.export refuses the branch on a tensor value, prints its partial FX graph and logs
    that it cannot find the user's code; ortmod captures the model anyway (guarded) and says so
    in its own TraceHazardWarning, which is all that reaches stderr."""
    err = first_call(tmp_path, "Branchy", "auto")
    assert "TraceHazardWarning" in err
    assert "def forward" not in err and "symbolic_shapes" not in err and "_registration" not in err, err
    # the warning itself and the source line Python's warning format shows below it
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 2 and lines[1].strip() == "model(x, y).backward()", err


def test_verbose_shows_what_was_kept(tmp_path):
    err = first_call(tmp_path, "ConvNet", "torchscript", log_level="VERBOSE")
    assert "torch (native): In-place op on output of tensor.shape" in err
    err = first_call(tmp_path, "Branchy", "auto", log_level="VERBOSE")
    assert "while capturing Branchy, torch and the ONNX libraries said" in err
    if _torchvision_missing():
        assert "torchvision is not installed" in err


class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        y = self.lin(x)
        if y.sum() > 0:
            return y * 2
        return y


def test_a_refusal_carries_what_torch_said(capfd, ortmod_env):
    """strict_trace refuses the frozen branch: torch's graph print is in the exception, not on
    stderr."""
    model = ORTModule(Branchy(), ortmod.DebugOptions(capture="export", strict_trace=True))
    capfd.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("error")       # no warning escapes either
        with pytest.raises(ortmod.UnsupportedModelError) as info:
            model(torch.randn(2, 4))
    assert capfd.readouterr().err == ""
    log = getattr(info.value, "ortmod_capture_log", "")
    assert "def forward" in log or "symbolic_shapes" in log, log
    assert any("ortmod_capture_log" in note for note in getattr(info.value, "__notes__", []))


class Talky(nn.Module):
    """A forward that prints to stderr, through Python and through the descriptor."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        print("the user's print", file=sys.stderr)
        os.write(2, b"the user's os.write\n")
        return self.lin(x)


def test_what_the_users_forward_prints_still_shows(capfd):
    ORTModule(Talky())(torch.randn(2, 4)).sum().backward()
    err = capfd.readouterr().err
    assert "the user's print" in err and "the user's os.write" in err, err
