"""Shared harness for the model suites (tests/test_models_*.py).

``train_parity`` trains two copies of one model from identical weights — one eager, one
wrapped in ORTModule — for a number of optimizer steps and checks (fp32, rtol 1e-4 /
atol 1e-5): the gradients of the first step (identical weights), every step's loss, the
final parameters and the final buffers. It prints the max differences, llm.c style.

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
    """The sorted op types of every export an ORTModule holds (README's model-families
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


def assert_close(what, got, want, rtol=RTOL, atol=ATOL):
    got, want = got.detach(), want.detach()
    if not got.is_floating_point():
        assert torch.equal(got, want), f"{what}: {got} != {want}"
        return
    try:
        torch.testing.assert_close(got, want, rtol=rtol, atol=atol)
    except AssertionError as e:
        raise AssertionError(f"{what}: max abs diff {max_diff(got, want):.3e}\n{e}") from None


def train_parity(make_model, batches, loss_of, steps=10, lr=0.05, momentum=0.9, on_wrap=None):
    """Train eager and ORTModule copies of ``make_model()`` on ``batches`` for ``steps``
    SGD steps; compare as described above. Returns (eager, ort, losses). ``on_wrap`` is
    called with the ORTModule before its first call (so a caller can inspect its export
    even when the first call ends in an expected failure)."""
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
            for n, pe, po in zip(names, eager.parameters(), ort.parameters()):
                if pe.grad is None:
                    assert po.grad is None, f"{n}: eager has no gradient, ORTModule has one"
                else:
                    assert po.grad is not None, f"{n}: no gradient through ORTModule"
                    assert_close(f"step 0 grad of {n}", po.grad, pe.grad)
        opt_e.step()
        opt_o.step()
        opt_e.zero_grad(set_to_none=True)
        opt_o.zero_grad(set_to_none=True)
        losses_e.append(loss_e.item())
        losses_o.append(loss_o.item())
    print("losses eager   ", " ".join(f"{v:.6f}" for v in losses_e))
    print("losses ortmod  ", " ".join(f"{v:.6f}" for v in losses_o))
    assert_close("per-step losses", torch.tensor(losses_o), torch.tensor(losses_e))
    worst = max((max_diff(po, pe), n) for n, pe, po in zip(names, eager.parameters(), ort.parameters()))
    print(f"final parameters: max abs diff {worst[0]:.3e} ({worst[1]})")
    for n, pe, po in zip(names, eager.parameters(), ort.parameters()):
        assert_close(f"final {n}", po, pe)
    for (n, be), bo in zip(eager.named_buffers(), ort.buffers()):
        assert_close(f"final buffer {n}", bo, be)
    assert ort._ortmod_export_count == 1, f"{ort._ortmod_export_count} exports for one schema"
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
