"""The rules written once for both capture paths (ortmod/capture/rules/emitter.py, issue 36): each
registered on the TorchScript path and on the torch.export path from one function, its review
mark in the audit's REVIEWED and its checks in _CHECKS; the twins left (an aten op with a rule of
each path's own form) only get fewer. Values against eager: each family's own tests
(tests/test_export_losses.py on both paths for rules/aten_losses.py)."""
import pytest
import torch

from ortmod.capture import audit, export_registry, torchscript_registry
from ortmod.capture.onnx_util import ONNX_OPSET
from ortmod.capture.rules import aten as aten_rules, emitter

# aten ops that still have a rule of each path's own form, a g.op symbolic and an onnxscript
# translation (issue 36): port a family to rules/aten_<family>.py, then delete its names here.
# The list only shrinks (test_twins_only_shrink).
TWINS_LEFT = {
    "_upsample_nearest_exact1d", "_upsample_nearest_exact2d", "_upsample_nearest_exact3d", "adaptive_avg_pool1d",
    "adaptive_avg_pool2d", "adaptive_avg_pool3d", "adaptive_max_pool2d", "adaptive_max_pool3d", "avg_pool2d",
    "avg_pool3d", "cdist", "cross_entropy_loss",
    "fractional_max_pool2d", "fractional_max_pool3d", "index_put",
    "linalg_vector_norm", "lstm", "max", "min", "pad",
    "sort", "upsample_bilinear2d", "upsample_linear1d", "upsample_nearest1d",
    "upsample_nearest2d", "upsample_nearest3d", "upsample_trilinear3d",
}


@pytest.fixture(scope="module")
def torchscript_rules():
    """{aten name: symbolic} as semantic_export registers them."""
    seen = {}
    register = torch.onnx.register_custom_op_symbolic

    def spy(name, fn, opset):
        seen[name.split("::", 1)[1]] = fn
        return register(name, fn, opset)
    torch.onnx.register_custom_op_symbolic = spy
    try:
        with torchscript_registry.semantic_export(ONNX_OPSET):
            pass
    finally:
        torch.onnx.register_custom_op_symbolic = register
    return seen


@pytest.fixture(scope="module")
def export_rules():
    """{aten name: [translation, ...]} of ortmod's torch.export rules."""
    out = {}
    for target, fn in export_registry._translations().items():
        name = str(target)
        if name.startswith("aten."):
            out.setdefault(name.split(".")[1], []).append(fn)
    return out


def _written_once(fn):
    return fn.__module__ == emitter.__name__


def test_each_rule_is_registered_on_both_paths(torchscript_rules, export_rules):
    assert emitter.RULES, "no rule registered: rules/aten.py imports no family"
    for rule in emitter.RULES:
        for target in rule.targets:
            if not target.startswith("aten::"):
                continue
            name = target.split("::", 1)[1].split(".", 1)[0]
            assert _written_once(torchscript_rules[name]), f"{name}: the TorchScript path has another rule"
            assert all(_written_once(fn) and fn.__name__ == rule.what for fn in export_rules[name]), \
                f"{name}: the torch.export path has another rule"
            assert target in audit.REVIEWED, f"{target}: no review mark"
            if rule.checks:
                assert audit._CHECKS[target.split(".", 1)[0]] == rule.audit_check


def test_twins_only_shrink(torchscript_rules, export_rules):
    twins = {name for name in set(torchscript_rules) & set(export_rules)
             if not _written_once(torchscript_rules[name])}
    grown = twins - TWINS_LEFT
    assert not grown, f"new twins (write the rule once, rules/emitter.py's aten_rule): {sorted(grown)}"
    ported = TWINS_LEFT - twins
    assert not ported, f"no longer twins: delete them from TWINS_LEFT: {sorted(ported)}"


def test_torchscript_attribute_spelling():
    # ONNX's attribute names, with the type suffix g.op wants
    assert emitter._ts_attr("axis", 1) == ("axis_i", 1)
    assert emitter._ts_attr("keepdims", False) == ("keepdims_i", 0)
    assert emitter._ts_attr("alpha", 0.5) == ("alpha_f", 0.5)
    assert emitter._ts_attr("perm", (1, 0)) == ("perm_i", [1, 0])
    assert emitter._ts_attr("reduction", "sum") == ("reduction_s", "sum")
    assert emitter._ts_attr("to", torch.float64) == ("to_i", 11)
    with pytest.raises(TypeError, match="no ONNX attribute type"):
        emitter._ts_attr("x", object())


def test_checks_see_python_values_and_tensor_infos():
    rule = next(r for r in emitter.RULES if r.what == "multi_margin_loss")
    f64, i64 = emitter.TensorInfo(torch.float64, 2), emitter.TensorInfo(torch.int64, 1)
    ok = dict(p=1.0, margin=1.0, reduction=1)
    assert rule.refusal(ok, dict(self=f64, target=i64, weight=None)) is None
    assert "p 1 and 2" in rule.refusal({**ok, "p": 3.0}, dict(self=f64, target=i64, weight=None))
    assert "class indices" in rule.refusal(ok, dict(self=f64, target=f64, weight=None))
    assert "one dtype" in rule.refusal(ok, dict(self=f64, target=i64, weight=emitter.TensorInfo(torch.float32, 1)))
    assert "rank 1 or 2" in rule.refusal(ok, dict(self=emitter.TensorInfo(torch.float64, 3), target=i64, weight=None))


def test_an_argument_annotation_the_bindings_do_not_know_is_refused():
    def rule(e, self: emitter.Tensor, scale: complex = 1j):
        return self
    with pytest.raises(TypeError, match="annotated"):
        emitter.Rule(rule, ("aten::x",), (), "why")


def test_every_family_file_is_loaded():
    # a family is one file, rules/aten_<family>.py: the registry finds it without a line elsewhere
    loaded = {rule.fn.__module__.rsplit(".", 1)[1] for rule in aten_rules.load()}
    assert loaded == set(aten_rules.families())
    assert {"aten_losses", "aten_activations"} <= loaded


def test_an_argument_the_rule_does_not_know_is_refused():
    # another torch's schema with one argument more: refused by name on both paths, never dropped
    import ortmod
    rule = next(r for r in emitter.RULES if r.what == "log_sigmoid")
    with pytest.raises(ortmod.UnsupportedModelError, match="^log_sigmoid: 2 arguments"):
        rule._from_values((object(), object()))
    translation = rule.export_translation(op=None, ir=None, stop_gradient=None)
    with pytest.raises(ortmod.UnsupportedModelError, match="^log_sigmoid: 2 arguments"):
        translation(object(), object())
    with pytest.raises(ortmod.UnsupportedModelError, match="does not know"):
        translation(object(), approximate="tanh")
