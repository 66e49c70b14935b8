"""TopK and ortmod's Sort (csrc/ops/topk.c): what torch.topk, torch.sort and torch.argsort export to.

- Order: the indices are eager torch's exactly, ties and NaN included (csrc/ops/sort_order.h
  replays libstdc++'s algorithms as aten's CPU kernels run them), checked on rows full of ties.
- Gradients: finite differences (float64), and eager autograd among ties (where the gradient
  lands depends on the order; tests/test_nonfinite.py has NaN and infinities).
- K known at plan time, or refused by name.
- A whole module using topk / sort / argsort / F.normalize / norm / logsumexp through ORTModule
  on both capture paths: a few SGD steps, parity with eager (tests/test_ops_norms.py has the
  norm reductions themselves).
"""
import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from onnx import TensorProto, helper

import ortmod
from ortmod import DebugOptions, ORTModule
from oputil import Fn, check_op, make_model, run

RNG = np.random.default_rng(14)


def ties(*shape, levels=4, nan=False):
    x = RNG.integers(0, levels, shape).astype(np.float32)
    if nan:
        x.reshape(-1)[::7] = np.nan
        x.reshape(-1)[3::11] = -0.0
    return x


def topk_model(x, k, **attrs):
    return make_model("TopK", {"x": x, "k": np.array([k], np.int64)}, attrs, n_outputs=2, const_inputs=["k"])


def sort_model(x, **attrs):
    return make_model("Sort", {"x": x}, attrs, domain="ortmod", n_outputs=2)


def assert_same_values(got, want):
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(got[~np.isnan(got)], want[~np.isnan(want)])


# ---- order: eager's, ties and NaN included --------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("largest", [1, 0])
@pytest.mark.parametrize("sorted_", [1, 0])
def test_topk_indices_are_eagers_on_rows_of_ties(dtype, largest, sorted_):
    # k * 64 <= n takes partial_sort, the rest nth_element (+ sort of the first k - 1)
    for n, k, levels, nan in [(37, 5, 4, True), (300, 4, 3, False), (300, 5, 6, True), (20, 20, 2, False),
                              (1000, 3, 2, True), (64, 1, 3, True), (17, 16, 1, False), (129, 70, 5, True)]:
        x = ties(3, n, levels=levels, nan=nan).astype(dtype)
        (v, i), _, _ = run(topk_model(x, k, axis=1, largest=largest, sorted=sorted_), [x])
        ev, ei = torch.topk(torch.from_numpy(x), k, dim=1, largest=bool(largest), sorted=bool(sorted_))
        np.testing.assert_array_equal(i, ei.numpy(), err_msg=f"n={n} k={k}")
        assert_same_values(v, ev.numpy())


def test_tie_order_matches_eager_on_random_rows():
    # the replay of libstdc++'s steps against eager on many row lengths (introsort's depth
    # limit, the 16-element insertion sort, heap select and nth_element's small-range end)
    rng = np.random.default_rng(1414)
    for trial in range(40):
        n = int(rng.integers(1, 400 if trial % 4 else 3000))
        x = rng.integers(0, int(rng.integers(1, 6)), (30, n)).astype(np.float32)
        x[rng.random(x.shape) < 0.05] = np.nan
        t = torch.from_numpy(x)
        k = int(rng.integers(1, n + 1)) if trial % 3 else max(1, n // 64)
        largest, sorted_ = int(trial % 2), int(trial % 5 != 0)
        (_, i), _, _ = run(topk_model(x, k, axis=1, largest=largest, sorted=sorted_), [x])
        want = torch.topk(t, k, dim=1, largest=bool(largest), sorted=bool(sorted_))[1].numpy()
        np.testing.assert_array_equal(i, want, err_msg=f"topk n={n} k={k} largest={largest} sorted={sorted_}")
        (_, i), _, _ = run(sort_model(x, axis=1, descending=largest), [x])
        np.testing.assert_array_equal(i, torch.sort(t, dim=1, descending=bool(largest))[1].numpy(),
                                      err_msg=f"sort n={n}")


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_topk_along_any_axis(axis):
    x = ties(9, 7, 5, levels=3, nan=True)
    k = 3
    (v, i), _, _ = run(topk_model(x, k, axis=axis), [x])
    ev, ei = torch.topk(torch.from_numpy(x), k, dim=axis)
    np.testing.assert_array_equal(i, ei.numpy())
    assert_same_values(v, ev.numpy())


def test_topk_int64_and_k_zero():
    x = RNG.integers(-3, 3, (4, 30))
    (v, i), _, _ = run(topk_model(x, 6, axis=1), [x])
    ev, ei = torch.topk(torch.from_numpy(x), 6, dim=1)
    np.testing.assert_array_equal(i, ei.numpy())
    np.testing.assert_array_equal(v, ev.numpy())
    x = ties(3, 5)
    (v, i), _, _ = run(topk_model(x, 0, axis=1), [x])
    assert v.shape == (3, 0) and i.shape == (3, 0)


@pytest.mark.parametrize("descending", [0, 1])
@pytest.mark.parametrize("stable", [0, 1])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sort_indices_are_eagers(descending, stable, dtype):
    for shape, axis in [((3, 50), 1), ((4, 700), -1), ((40, 3), 0), ((2, 16), 1), ((2, 17), 1)]:
        x = ties(*shape, nan=True).astype(dtype)
        (v, i), _, _ = run(sort_model(x, axis=axis, descending=descending, stable=stable), [x])
        ev, ei = torch.sort(torch.from_numpy(x), dim=axis, descending=bool(descending), stable=bool(stable))
        np.testing.assert_array_equal(i, ei.numpy(), err_msg=f"{shape} axis {axis}")
        assert_same_values(v, ev.numpy())


def test_sort_and_topk_of_the_whole_axis_order_ties_differently_as_in_eager():
    # why torch.sort is not exported as TopK(k = n): eager's two tie orders differ
    x = ties(1, 40, levels=2)
    t = torch.from_numpy(x)
    assert not torch.equal(torch.sort(t, descending=True)[1], torch.topk(t, 40)[1])
    (_, i_sort), _, _ = run(sort_model(x, axis=1, descending=1), [x])
    (_, i_topk), _, _ = run(topk_model(x, 40, axis=1), [x])
    np.testing.assert_array_equal(i_sort, torch.sort(t, descending=True)[1].numpy())
    np.testing.assert_array_equal(i_topk, torch.topk(t, 40)[1].numpy())


# ---- K ---------------------------------------------------------------------------------------

def test_topk_k_from_run_time_data_is_refused_by_name():
    nodes = [helper.make_node("ReduceMax", ["x"], ["mx"], keepdims=0),
             helper.make_node("Cast", ["mx"], ["mi"], to=TensorProto.INT64),
             helper.make_node("Reshape", ["mi", "one"], ["k"]),
             helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=1, name="top")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 6])],
                          [helper.make_tensor_value_info("v", TensorProto.FLOAT, None),
                           helper.make_tensor_value_info("i", TensorProto.INT64, None)],
                          initializer=[helper.make_tensor("one", TensorProto.INT64, [1], [1])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)]).SerializeToString()
    with pytest.raises(ortmod.UnsupportedOpError, match=r"TopK node 'top'.*K is computed from run-time data"):
        run(model, [np.abs(ties(3, 6)) + 1])


def test_topk_k_larger_than_the_axis_is_an_error():
    x = ties(3, 5)
    with pytest.raises(Exception, match=r"K = 6, but axis 1 has 5 elements"):
        run(topk_model(x, 6, axis=1), [x])


def test_topk_k_folded_from_the_shape():
    class M(nn.Module):
        def forward(self, x):
            return torch.topk(x, x.shape[1] // 2, dim=1).values
    m = ORTModule(M())
    for cols in (6, 10):
        x = torch.randn(3, cols)
        torch.testing.assert_close(m(x), M()(x))


# ---- gradients ---------------------------------------------------------------------------------

@pytest.mark.parametrize("attrs,k", [({"axis": 1}, 3), ({"axis": 0, "largest": 0, "sorted": 0}, 2),
                                     ({"axis": -1, "largest": 1}, 7)])
def test_topk_gradient_finite_differences(attrs, k):
    x = RNG.permutation(5 * 7).reshape(5, 7) * 0.1 + RNG.standard_normal((5, 7)) * 0.01   # distinct values
    check_op("TopK", {"x": x, "k": np.array([k], np.int64)}, None, attrs=attrs, grad=("x",), n_outputs=2,
             const_inputs=["k"])


@pytest.mark.parametrize("attrs", [{"axis": 1, "descending": 1}, {"axis": 0, "stable": 1}, {"axis": -1}])
def test_sort_gradient_finite_differences(attrs):
    x = RNG.permutation(4 * 6).reshape(4, 6) * 0.1 + RNG.standard_normal((4, 6)) * 0.01
    check_op("Sort", {"x": x}, None, attrs=attrs, domain="ortmod", grad=("x",), n_outputs=2)


def test_gradients_land_where_eager_puts_them_among_ties():
    class M(nn.Module):
        def forward(self, x):
            return (torch.topk(x, 5, dim=1).values * torch.arange(1.0, 6.0), torch.sort(x, dim=0)[0] * 1.5,
                    torch.topk(x, 2, dim=1, largest=False, sorted=False).values)
    x = torch.from_numpy(ties(6, 40, levels=3, nan=True))
    xe, xo = x.clone().requires_grad_(), x.clone().requires_grad_()
    ye, yo = M()(xe), ORTModule(M())(xo)
    for a, b in zip(yo, ye):
        assert_same_values(a.detach().numpy(), b.detach().numpy())
    sum((t * torch.randn(t.shape, generator=torch.Generator().manual_seed(i))).nansum()
        for i, t in enumerate(ye)).backward()
    sum((t * torch.randn(t.shape, generator=torch.Generator().manual_seed(i))).nansum()
        for i, t in enumerate(yo)).backward()
    torch.testing.assert_close(xo.grad, xe.grad, rtol=1e-6, atol=1e-6)


# ---- whole modules, both capture paths ----------------------------------------------------------

class Ranker(nn.Module):
    """topk / sort / argsort / F.normalize / norm / logsumexp in one forward."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.out = nn.Linear(4, 3)

    def forward(self, x):
        h = torch.relu(self.inp(x))            # ReLU's zeros: rows full of ties
        top, idx = torch.topk(h, 4, dim=-1)
        ordered, order = torch.sort(h, dim=-1, descending=True)
        rank = torch.argsort(h, dim=-1)
        stable = torch.sort(h, dim=0, stable=True).values
        n = F.normalize(h, dim=-1)
        y = self.out(top) + n[:, :3] + torch.norm(h, dim=-1, keepdim=True) + ordered[:, 4:7]
        y = y + torch.logsumexp(h, dim=-1, keepdim=True) + stable[:, 2:5] + torch.linalg.vector_norm(h, 1, dim=0)[:3]
        return y, idx, order, rank


@pytest.mark.parametrize("capture", ["torchscript", "export"])
def test_ranker_trains_like_eager(capture):
    torch.manual_seed(0)
    eager = Ranker()
    wrapped = Ranker()
    wrapped.load_state_dict(eager.state_dict())
    model = ORTModule(wrapped, DebugOptions(capture=capture))
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.01)
    opt_o = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(4):
        x = torch.randn(6, 8)
        ye, *ie = eager(x)
        yo, *io = model(x)
        torch.testing.assert_close(yo, ye, rtol=1e-5, atol=1e-5, msg=lambda m: f"step {step}: {m}")
        for a, b in zip(io, ie):
            assert torch.equal(a, b), f"step {step}: indices differ"
        ye.square().sum().backward()
        yo.square().sum().backward()
        for (name, p), q in zip(wrapped.named_parameters(), eager.parameters()):   # fp32: to the gradient's scale
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-5 * q.grad.abs().max().item(),
                                       msg=lambda m: f"step {step} {name}: {m}")
        opt_e.step(), opt_o.step(), opt_e.zero_grad(), opt_o.zero_grad()


def test_sort_exports_as_ortmods_sort_not_topk():
    import onnx
    from ortmod.capture import torchscript_registry
    import io as _io
    m = Fn(lambda x: torch.sort(x, dim=-1)[0] + torch.argsort(x, dim=-1).float())
    buf = _io.BytesIO()
    with torchscript_registry.semantic_export(20):
        torch.onnx.export(m, (torch.randn(3, 5),), buf, dynamo=False, opset_version=20)
    ops = [(n.domain, n.op_type) for n in onnx.load_from_string(buf.getvalue()).graph.node]
    assert ops.count(("ortmod", "Sort")) == 2 and ("", "TopK") not in ops, ops
