"""ORTModule behaviour: cache, train/eval, no_grad, state_dict, errors, debug output."""
import copy
import logging
import os

import onnx
import pytest
import torch
import torch.nn as nn

import ortmod
from ortmod import DebugOptions, LogLevel, ORTModule

RTOL, ATOL = 1e-4, 1e-5


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32),
                                 nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 5))
        self.loss = nn.CrossEntropyLoss()

    def forward(self, x, y):
        return self.loss(self.net(x), y)


class Logits(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 5))

    def forward(self, x):
        return self.net(x)


def data(n=8):
    return torch.randn(n, 16), torch.randint(0, 5, (n,))


def close(a, b):
    torch.testing.assert_close(a.detach(), b.detach(), rtol=RTOL, atol=ATOL)


def exports_for_new_sizes():
    """Exports of one entry across batch sizes: the TorchScript path's one export has every dim
    dynamic; the torch.export path's first is static and the second, for the first new size,
    has the varied dims symbolic for every later size."""
    return 2 if DebugOptions().capture == "export" else 1


# --------------------------------------------------------------------------- cache

def test_second_call_and_new_batch_size_do_not_reexport():
    model = ORTModule(MLP())
    assert model._ortmod_export_count == 0
    model(*data(8)).backward()
    assert model._ortmod_export_count == 1
    model(*data(8)).backward()
    assert model._ortmod_export_count == 1
    for n in (3, 1, 64):
        eager = copy.deepcopy(model._original_module)
        x, y = data(n)
        loss = model(x, y)
        close(loss, eager(x, y))
    assert model._ortmod_export_count == exports_for_new_sizes()
    assert len(model._ortmod_cache) == 1


def test_eval_builds_its_own_entry_once():
    inner = Logits()
    model = ORTModule(inner)
    x = torch.randn(4, 16)
    model(x)
    assert model._ortmod_export_count == 1
    model.eval()
    assert not inner.training
    out = model(x)
    assert model._ortmod_export_count == 2
    # eval with grad enabled is differentiated, as eager (saliency, adversarial inputs)
    assert out.requires_grad
    close(out, inner(x))
    xr, xe = x.clone().requires_grad_(), x.clone().requires_grad_()
    model(xr).sum().backward()
    inner(xe).sum().backward()
    close(xr.grad, xe.grad)
    with torch.no_grad():
        out2 = model(torch.randn(9, 16))
    assert not out2.requires_grad and out2.shape == (9, 5)
    assert model._ortmod_export_count == 3
    # toggling back and forth reuses the entries
    for _ in range(3):
        model.train()
        assert inner.training and model.training
        assert model(x).requires_grad
        model.eval()
        assert not inner.training and not model.training
        assert model(x).requires_grad
    assert model._ortmod_export_count == 3


def test_no_grad_builds_its_own_entry_once():
    inner = Logits()
    model = ORTModule(inner)
    x = torch.randn(4, 16)
    assert model(x).requires_grad
    with torch.no_grad():
        out = model(x)
        assert model._ortmod_export_count == 2
        model(torch.randn(7, 16))
    exports = 1 + exports_for_new_sizes()       # the no-grad entry's new size: its own matter
    assert model._ortmod_export_count == exports
    assert not out.requires_grad and out.grad_fn is None
    close(out, inner(x))
    assert model(x).requires_grad          # back with grad: the first entry again
    assert model._ortmod_export_count == exports


def test_dtype_and_rank_changes_reexport():
    inner = Logits()
    model = ORTModule(inner)
    model(torch.randn(4, 16))
    assert model._ortmod_export_count == 1
    x3 = torch.randn(2, 3, 16)                # rank 3: a new schema
    out3 = model(x3)
    assert model._ortmod_export_count == 2
    close(out3, inner(x3))
    model.double()                            # parameter and input dtype change
    xd = torch.randn(4, 16, dtype=torch.float64)
    out = model(xd)
    assert model._ortmod_export_count == 3
    assert out.dtype == torch.float64
    torch.testing.assert_close(out.detach(), inner(xd).detach(), rtol=1e-10, atol=1e-12)


def test_requires_grad_of_input_selects_an_engine_without_reexport():
    inner = Logits()
    model = ORTModule(inner)
    x = torch.randn(4, 16)
    model(x).sum().backward()
    xr = x.clone().requires_grad_(True)
    model(xr).sum().backward()
    assert model._ortmod_export_count == 1         # same ONNX graph ...
    assert model._ortmod_engine_count == 2         # ... another backward graph
    xe = x.clone().requires_grad_(True)
    inner(xe).sum().backward()
    close(xr.grad, xe.grad)


def test_non_tensor_arguments_are_constants_in_the_schema():
    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(16, 5)

        def forward(self, x, scale=1.0, *, shift=0.0):
            return self.lin(x) * scale + shift

    inner = Scaled()
    model = ORTModule(inner)
    x = torch.randn(4, 16)
    close(model(x, 2.0), inner(x, 2.0))
    close(model(x, 2.0), inner(x, 2.0))
    assert model._ortmod_export_count == 1
    close(model(x, 3.0), inner(x, 3.0))
    assert model._ortmod_export_count == 2
    close(model(x, 3.0, shift=1.5), inner(x, 3.0, shift=1.5))
    assert model._ortmod_export_count == 3


def test_nested_inputs_kwargs_and_structured_outputs():
    class Structured(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(16, 8)
            self.b = nn.Linear(8, 3)

        def forward(self, batch, *, unused=None, mask):
            h = torch.relu(self.a(batch["x"]))
            return {"logits": self.b(h) * mask, "hidden": (h, [h * 2]), "tag": "ok",
                    "ids": batch["ids"] + 1}

    inner = Structured()
    model = ORTModule(copy.deepcopy(inner))
    x, ids, mask = torch.randn(5, 16), torch.arange(5), torch.ones(5, 3)
    out = model({"x": x, "ids": ids}, unused=torch.zeros(2), mask=mask)
    ref = inner({"x": x, "ids": ids}, unused=torch.zeros(2), mask=mask)
    assert set(out) == set(ref) and out["tag"] == "ok"
    assert isinstance(out["hidden"], tuple) and isinstance(out["hidden"][1], list)
    close(out["logits"], ref["logits"])
    close(out["hidden"][0], ref["hidden"][0])
    close(out["hidden"][1][0], ref["hidden"][1][0])
    assert out["ids"].dtype == torch.int64 and torch.equal(out["ids"], ref["ids"])
    assert not out["ids"].requires_grad
    # backward through one output only: the others' grads are None (zeros) for the engine
    out["logits"].sum().backward()
    ref["logits"].sum().backward()
    for (name, pe), po in zip(inner.named_parameters(), model.parameters()):
        close(po.grad, pe.grad)


def test_non_contiguous_input():
    inner = Logits()
    model = ORTModule(inner)
    base = torch.randn(16, 6)
    x = base.t()                              # (6, 16), not contiguous
    assert not x.is_contiguous()
    close(model(x), inner(x))


def test_params_updated_in_place_are_seen_without_reexport():
    inner = Logits()
    model = ORTModule(inner)
    x = torch.randn(4, 16)
    before = model(x).detach().clone()
    with torch.no_grad():
        inner.net[2].bias.add_(1.0)
    after = model(x)
    close(after, before + 1.0)
    assert model._ortmod_export_count == 1


def test_frozen_parameters_get_no_grad():
    inner = Logits()
    inner.net[0].weight.requires_grad_(False)
    eager = copy.deepcopy(inner)
    model = ORTModule(inner)
    x = torch.randn(4, 16)
    model(x).sum().backward()
    eager(x).sum().backward()
    assert inner.net[0].weight.grad is None
    for (name, pe), po in zip(eager.named_parameters(), model.parameters()):
        if pe.requires_grad:
            close(po.grad, pe.grad)


def test_tied_parameters():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.l1 = nn.Linear(8, 8)
            self.l2 = nn.Linear(8, 8)
            self.l2.weight = self.l1.weight

        def forward(self, x):
            return self.l2(torch.tanh(self.l1(x)))

    inner = Tied()
    eager = copy.deepcopy(inner)
    model = ORTModule(inner)
    x = torch.randn(5, 8)
    close(model(x), eager(x))
    model(x).sum().backward()
    eager(x).sum().backward()
    close(inner.l1.weight.grad, eager.l1.weight.grad)
    close(inner.l2.bias.grad, eager.l2.bias.grad)


def test_buffers_are_inputs_read_in_place():
    class WithBuffer(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)
            self.register_buffer("scale", torch.full((4,), 2.0))

        def forward(self, x):
            return self.lin(x) * self.scale

    inner = WithBuffer()
    model = ORTModule(inner)
    x = torch.randn(3, 4)
    close(model(x), inner(x))
    inner.scale.fill_(3.0)
    close(model(x), inner(x))
    assert model._ortmod_export_count == 1
    assert "scale" in model.state_dict()


def test_dropout_train_and_eval():
    class Drop(nn.Module):
        def __init__(self, p):
            super().__init__()
            self.drop = nn.Dropout(p)

        def forward(self, x):
            return self.drop(x)

    x = torch.ones(200, 50)
    model = ORTModule(Drop(0.5))
    xr = x.clone().requires_grad_(True)
    y = model(xr)
    kept = y != 0
    frac = kept.float().mean().item()
    assert 0.45 < frac < 0.55, f"dropout kept {frac:.3f} of the elements with p=0.5"
    close(y[kept], torch.full_like(y[kept], 2.0))          # kept elements scaled by 1/(1-p)
    y.sum().backward()
    close(xr.grad, kept.float() * 2.0)                     # backward uses the same mask
    y2 = model(x.clone().requires_grad_(True))
    assert not torch.equal(y2 != 0, kept), "two training steps drew the same dropout mask"
    with torch.no_grad():                                  # train mode without grad: still drops, as eager
        y3 = model(x)
    assert 0.45 < (y3 != 0).float().mean().item() < 0.55
    model.eval()
    close(model(x), x)
    p0 = ORTModule(Drop(0.0))
    xr = x.clone().requires_grad_(True)
    out = p0(xr)
    close(out, x)
    out.sum().backward()
    close(xr.grad, torch.ones_like(x))


def test_export_leaves_torch_rng_untouched():
    model = ORTModule(MLP())
    x, y = data(4)
    state = torch.get_rng_state()
    model(x, y).backward()
    assert torch.equal(torch.get_rng_state(), state)


@pytest.mark.parametrize("user_disabled", [False, True])
def test_capture_pauses_the_garbage_collector_and_restores_it(user_disabled):
    """The collector is paused while the forward is captured (its collections were 0.4-0.5 s of
    a first call) and left as the user had it afterwards, after a failed capture too."""
    import gc
    seen = []

    class Probe(nn.Module):
        def __init__(self, fail=False):
            super().__init__()
            self.lin, self.fail = nn.Linear(4, 2), fail

        def forward(self, x):
            seen.append(gc.isenabled())
            if self.fail:
                raise ValueError("forward failed")
            return self.lin(x)

    was = gc.isenabled()
    try:
        if user_disabled:
            gc.disable()
        ORTModule(Probe())(torch.randn(3, 4)).sum().backward()
        assert seen and not any(seen)
        assert gc.isenabled() is not user_disabled
        with pytest.raises(Exception, match="forward failed"):
            ORTModule(Probe(fail=True))(torch.randn(3, 4))
        assert gc.isenabled() is not user_disabled
    finally:
        (gc.enable if was else gc.disable)()


# --------------------------------------------------------------------------- passthrough

def test_state_dict_and_parameter_names_match_inner_module():
    inner = MLP()
    model = ORTModule(inner)
    assert list(model.state_dict()) == list(inner.state_dict())
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in inner.named_parameters()]
    assert [n for n, _ in model.named_buffers()] == [n for n, _ in inner.named_buffers()]
    assert all(a is b for a, b in zip(model.parameters(), inner.parameters()))
    other = MLP()
    model.load_state_dict(other.state_dict())
    for a, b in zip(inner.parameters(), other.parameters()):
        assert torch.equal(a, b)
    # an ORTModule inside another module saves and loads without an extra prefix
    outer = nn.ModuleDict({"m": ORTModule(MLP())})
    keys = list(outer.state_dict())
    assert keys == ["m." + k for k in inner.state_dict()]
    outer.load_state_dict({"m." + k: v for k, v in other.state_dict().items()})
    for a, b in zip(outer["m"].parameters(), other.parameters()):
        assert torch.equal(a, b)


def test_attribute_passthrough_and_train_eval():
    inner = MLP()
    model = ORTModule(inner)
    assert model.net is inner.net
    assert model.eval() is model
    assert not model.training and not inner.training and not inner.net[0].training
    model.train()
    assert model.training and inner.training and inner.net[0].training


def test_wraps_only_modules():
    with pytest.raises(TypeError):
        ORTModule(lambda x: x)


# --------------------------------------------------------------------------- errors

class DetModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return torch.linalg.det(self.lin(x).reshape(-1, 2, 2))   # ONNX Det: not in the engine


def test_unsupported_op_raises_naming_the_op():
    model = ORTModule(DetModel())
    if ortmod.DebugOptions().capture == "export":      # the audit names it before any engine is built
        with pytest.raises(ortmod.UnsupportedModelError, match="aten::linalg_det"):
            model(torch.randn(2, 4))
        assert len(model._ortmod_cache) == 0
        return
    with pytest.raises(ortmod.UnsupportedOpError, match="Det") as info:
        model(torch.randn(2, 4))
    assert isinstance(info.value, ortmod.EngineError)
    assert isinstance(info.value, RuntimeError)
    assert len(model._ortmod_cache) == 0


def test_unsupported_dtype_raises_type_error_naming_the_argument():
    model = ORTModule(MLP())
    x, y = data(4)
    with pytest.raises(TypeError, match=r"input 'x' \(argument 0\) has dtype complex64"):
        model(x.to(torch.complex64), y)
    with pytest.raises(TypeError, match=r"input 'y'.*complex128"):
        model(x, y=y.to(torch.complex128))
    assert model._ortmod_export_count == 0
    model(x, y)                                # still usable
    assert model._ortmod_export_count == 1


def test_unsupported_device_raises_value_error_naming_the_argument():
    model = ORTModule(MLP())
    x, y = data(4)
    with pytest.raises(ValueError, match=r"input 'y' \(argument 1\).*meta"):
        model(x, y.to("meta"))


# --------------------------------------------------------------------------- debug options

def test_save_onnx_writes_three_valid_files(tmp_path):
    opts = DebugOptions(save_onnx=True, onnx_prefix="mlp", save_path=str(tmp_path))
    model = ORTModule(MLP(), opts)
    model(*data(4)).backward()
    model.eval()
    model(*data(4))
    for mode in ("training", "inference"):
        for stem in ("torch_exported", "optimized", "execution_model"):
            path = tmp_path / f"mlp_{stem}_{mode}.onnx"
            assert path.is_file(), f"missing {path.name}; have {sorted(os.listdir(tmp_path))}"
            proto = onnx.load(str(path))
            onnx.checker.check_model(proto)
            assert len(proto.graph.node) > 0
    assert len(os.listdir(tmp_path)) == 6
    # the forward graph's inputs are the call inputs and the parameters by name
    exported = onnx.load(str(tmp_path / "mlp_torch_exported_training.onnx"))
    names = [i.name for i in exported.graph.input]
    assert "input_0" in names and any(n.endswith("net.0.weight") for n in names)


def test_log_level_info_logs_export(caplog):
    caplog.set_level(logging.INFO, logger="ortmod")
    model = ORTModule(Logits(), DebugOptions(log_level=LogLevel.INFO))
    assert logging.getLogger("ortmod").getEffectiveLevel() <= logging.INFO
    model(torch.randn(2, 16))
    assert any("exporting" in r.getMessage() for r in caplog.records if r.name == "ortmod")


def test_log_levels():
    assert [int(v) for v in LogLevel] == [0, 1, 2, 3, 4]
    assert [v.name for v in LogLevel] == ["VERBOSE", "INFO", "WARNING", "ERROR", "FATAL"]
    opts = DebugOptions()
    assert opts.log_level == LogLevel.WARNING and not opts.save_onnx
    assert opts.onnx_prefix == "" and opts.save_path == ""
