"""Shared harness for the model suites (tests/test_models_*.py).

``train_parity`` trains two copies of one model from identical weights — one eager, one
wrapped in ORTModule — for a number of optimizer steps and checks (fp32, rtol 1e-4 /
atol 1e-5): the gradients of the first step (identical weights), every step's loss, the
final parameters and the final buffers. It prints the max differences, llm.c style. Where
fp32 eager and ORTModule disagree, an fp64 eager run referees (``referee_holds``).

A model whose export needs an op the engine does not have yet is reported as an expected
failure naming the op (``pytest.xfail``), so the suite stays green while the op table
grows, and the test turns into a real parity check as soon as the op lands.
"""
import copy
import re

import pytest
import torch

import ortmod
from ortmod import ORTModule

RTOL, ATOL = 1e-4, 1e-5


def engine_ops():
    from ortmod import _C
    return {name for name, _domain, _grad in _C.op_table()}


# torch.onnx.export's message for an aten op that has no ONNX conversion (TorchScript exporter)
_NO_SYMBOLIC = re.compile(r"Exporting the operator '([\w:.]+)' to ONNX opset version \d+ is not supported")


def call_or_xfail(fn):
    """Run ``fn``; an UnsupportedOpError becomes an expected failure naming the op, and so
    does an ExportError saying torch's exporter has no conversion for an aten op (the op is
    named; any other ExportError is a real failure)."""
    try:
        return fn()
    except ortmod.UnsupportedOpError as e:
        pytest.xfail(f"engine lacks an op this model needs: {e}")
    except ortmod.ExportError as e:
        m = _NO_SYMBOLIC.search(str(e))
        if m is None:
            raise
        pytest.xfail(f"torch's ONNX exporter cannot convert {m.group(1)}: {e}")


def exported_op_types(ort):
    """The sorted op types of every export an ORTModule holds (docs/models.md's model-families
    convention: ortmod's own capture ops, StopGradient, unprefixed)."""
    import onnx
    ops = set()
    for record in ort._ortmod_exports.values():
        graph = onnx.load_from_string(record.exported.onnx_bytes).graph
        ops |= {n.op_type for n in graph.node}
    return sorted(ops)


def max_diff(a, b):
    a, b = a.detach().double(), b.detach().double()
    return (a - b).abs().max().item() if a.numel() else 0.0


# relative to the tensor's own size: a gradient of scale 40 (a summed loss) holds elements near
# zero whose fp32 rounding noise, ~1e-6 of the scale, is past any elementwise atol
SIZE_RTOL = 2e-5


def assert_close(what, got, want, rtol=RTOL, atol=ATOL):
    """Elementwise rtol/atol, or every difference within SIZE_RTOL of the tensor's largest
    magnitude (each tensor relative to its own size)."""
    got, want = got.detach(), want.detach()
    if not got.is_floating_point():
        assert torch.equal(got, want), f"{what}: {got} != {want}"
        return
    try:
        torch.testing.assert_close(got, want, rtol=rtol, atol=atol)
    except AssertionError as e:
        scale = want.detach().double().abs().max().item() if want.numel() else 0.0
        if got.shape == want.shape and max_diff(got, want) <= SIZE_RTOL * scale:
            return
        raise AssertionError(f"{what}: max abs diff {max_diff(got, want):.3e} (scale {scale:.3g})\n{e}") from None


def _double(batch):
    if isinstance(batch, torch.Tensor):
        return batch.double() if batch.is_floating_point() else batch
    if isinstance(batch, dict):
        return {k: _double(v) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(_double(v) for v in batch)
    return batch


def _train_eager(model, batches, loss_of, steps, lr, momentum, double=False):
    """Train ``model`` as train_parity trains its copies; returns (step 0 grads, losses)."""
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    grads0, losses = None, []
    for step in range(steps):
        batch = batches[step % len(batches)]
        loss = loss_of(model, _double(batch) if double else batch)
        loss.backward()
        if step == 0:
            grads0 = [None if p.grad is None else p.grad.detach().clone() for p in model.parameters()]
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return grads0, losses


def referee_holds(got, want, ref):
    """fp64 decides an fp32 disagreement: ORTModule's error against the fp64 run is no worse
    than twice eager fp32's own (both rounding the same exact answer differently)."""
    ref = ref.detach().double()
    scale = ref.abs().max().item() if ref.numel() else 0.0
    return max_diff(got, ref) <= 2 * max_diff(want, ref) + 1e-7 * scale


def train_parity(make_model, batches, loss_of, steps=10, lr=0.05, momentum=0.9, on_wrap=None):
    """Train eager and ORTModule copies of ``make_model()`` on ``batches`` for ``steps``
    SGD steps; compare as described above. Returns (eager, ort, losses). ``on_wrap`` is
    called with the ORTModule before its first call (so a caller can inspect its export
    even when the first call ends in an expected failure).

    Where fp32 eager and ORTModule disagree beyond rtol/atol, an fp64 eager copy trained the
    same way referees (only then: it costs a second training): the values pass when ORTModule
    is as close to fp64 as eager fp32 is (an ill-conditioned model, e.g. MobileNetV2's BatchNorm
    over a batch of 4, amplifies rounding far past any fixed tolerance)."""
    torch.manual_seed(0)
    base = make_model()
    eager = copy.deepcopy(base).train()
    ort = ORTModule(copy.deepcopy(base)).train()
    if on_wrap is not None:
        on_wrap(ort)
    opt_e = torch.optim.SGD(eager.parameters(), lr=lr, momentum=momentum)
    opt_o = torch.optim.SGD(ort.parameters(), lr=lr, momentum=momentum)
    names = [n for n, _ in eager.named_parameters()]
    assert names == [n for n, _ in ort.named_parameters()]
    losses_e, losses_o = [], []
    checks = []     # (what, ORTModule's, eager's, key of the referee's value)
    for step in range(steps):
        batch = batches[step % len(batches)]
        loss_o = loss_of(ort, batch) if step else call_or_xfail(lambda: loss_of(ort, batch))
        loss_e = loss_of(eager, batch)
        loss_o.backward()
        loss_e.backward()
        if step == 0:
            worst = max((max_diff(po.grad, pe.grad), n) for n, pe, po in
                        zip(names, eager.parameters(), ort.parameters()) if pe.grad is not None)
            print(f"step 0 gradients: max abs diff {worst[0]:.3e} ({worst[1]})")
            for k, (n, pe, po) in enumerate(zip(names, eager.parameters(), ort.parameters())):
                if pe.grad is None:
                    assert po.grad is None, f"{n}: eager has no gradient, ORTModule has one"
                else:
                    assert po.grad is not None, f"{n}: no gradient through ORTModule"
                    checks.append((f"step 0 grad of {n}", po.grad.detach().clone(), pe.grad.detach().clone(),
                                   ("grad", k)))
        opt_e.step()
        opt_o.step()
        opt_e.zero_grad(set_to_none=True)
        opt_o.zero_grad(set_to_none=True)
        losses_e.append(loss_e.item())
        losses_o.append(loss_o.item())
    print("losses eager   ", " ".join(f"{v:.6f}" for v in losses_e))
    print("losses ortmod  ", " ".join(f"{v:.6f}" for v in losses_o))
    checks.append(("per-step losses", torch.tensor(losses_o), torch.tensor(losses_e), ("losses", 0)))
    worst = max((max_diff(po, pe), n) for n, pe, po in zip(names, eager.parameters(), ort.parameters()))
    print(f"final parameters: max abs diff {worst[0]:.3e} ({worst[1]})")
    for k, (n, pe, po) in enumerate(zip(names, eager.parameters(), ort.parameters())):
        checks.append((f"final {n}", po, pe, ("param", k)))
    for k, ((n, be), bo) in enumerate(zip(eager.named_buffers(), ort.buffers())):
        checks.append((f"final buffer {n}", bo, be, ("buffer", k)))
    failed = []
    for what, got, want, key in checks:
        try:
            assert_close(what, got, want)
        except AssertionError as e:
            failed.append((what, got, want, key, e))
    if failed:
        ref = copy.deepcopy(base).double().train()
        grads, losses = _train_eager(ref, batches, loss_of, steps, lr, momentum, double=True)
        values = {("losses", 0): torch.tensor(losses, dtype=torch.float64)}
        values.update({("grad", k): g for k, g in enumerate(grads)})
        values.update({("param", k): p for k, p in enumerate(ref.parameters())})
        values.update({("buffer", k): b for k, b in enumerate(ref.buffers())})
        for what, got, want, key, e in failed:
            r = values[key]
            if not got.is_floating_point() or not referee_holds(got, want, r):
                raise e
            print(f"{what}: fp32 differs by {max_diff(got, want):.3e}; against fp64 ORTModule "
                  f"{max_diff(got, r):.3e}, eager {max_diff(want, r):.3e}: held by the referee")
    # one export per schema; the torch.export path exports static sizes first and once more, with
    # the dims that varied symbolic, when a batch changes them (torch.compile's automatic dynamic)
    paths = {r.exported.capture for r in ort._ortmod_exports.values()}
    shapes = {tuple(tuple(t.shape) for t in b if isinstance(t, torch.Tensor)) for b in batches} \
        if all(isinstance(b, (tuple, list)) for b in batches) else None
    allowed = 2 if "export" in paths and (shapes is None or len(shapes) > 1) else 1
    assert 1 <= ort._ortmod_export_count <= allowed, f"{ort._ortmod_export_count} exports for one schema"
    return eager, ort, losses_o


def train_with_dropout(make_model, batches, loss_of, steps=12, lr=3e-3):
    """Dropout > 0 through ORTModule: training runs, two forwards of one batch differ
    (the masks are random), and the loss falls. Returns the losses."""
    torch.manual_seed(0)
    ort = ORTModule(make_model()).train()
    opt = torch.optim.AdamW(ort.parameters(), lr=lr)
    first = call_or_xfail(lambda: loss_of(ort, batches[0]))
    again = loss_of(ort, batches[0])
    assert first.item() != again.item(), "two training forwards with dropout gave the same loss"
    losses = []
    for step in range(steps):
        loss = loss_of(ort, batches[step % len(batches)])
        assert torch.isfinite(loss), f"step {step}: loss {loss.item()}"
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    print("dropout training losses", " ".join(f"{v:.4f}" for v in losses))
    k = max(2, len(losses) // 4)
    head, tail = sum(losses[:k]) / k, sum(losses[-k:]) / k
    assert tail < 0.9 * head, f"loss did not fall: first {k} steps {head:.4f}, last {k} steps {tail:.4f}"
    return losses
