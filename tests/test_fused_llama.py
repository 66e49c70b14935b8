"""The Llama fusions (issue 18): passes swiglu (silu(gate) * up -> SwiGLU) and rotary_embedding
(x * cos + rotate_half(x) * sin -> FusedRotary), csrc/passes/fuse_swiglu.c and
fuse_rotary_embedding.c, ops in csrc/ops/fused_llama.c.

- Unit graphs as torch.onnx writes them (the benchmark Llama's chunk-based rotate_half, transformers'
  d//2 slices with axis 3 of a rank-4 tensor): the pass fires, and the forward and every gradient
  equal the unfused graph's (ORTMOD_DISABLE_PASSES=<pass>) — bit for bit where nothing broadcasts,
  since the fused kernels compute the unfused formulas term for term. Operand orders, broadcasting
  gate/up and cos/sin, odd head dims, cos/sin gradients when they are wanted.
- Near misses are left alone: a Concat in the other order, slices of another tensor, a slice on
  another axis or with a step, a half that starts elsewhere, links read outside the pattern.
- Whole models: the benchmark Llama (odd sizes) and transformers' Llama, fused against unfused,
  in float32 (equal to rounding) and bfloat16 (the fused ops round once: close, relative to each
  gradient's size), with both passes seen firing.
"""
import copy
import json
import os
import sys

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

from oputil import run
from ortmod import ORTModule, _C, options
from ortmod._explain import engine_reports
from test_passes import check_pass, const, model, optimized_ops, rnd

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
import models as bench_models  # noqa: E402

I64 = TensorProto.INT64
BIG = 9223372036854775807


def i64(name, values):
    return const(name, np.asarray(values, np.int64), np.int64)


# ---- swiglu: unit graphs ------------------------------------------------------------------

def swiglu_model(order=(0, 0), g_shape=(2, 5, 7), u_shape=(2, 5, 7), extra_outputs=()):
    """Mul(Mul(g, Sigmoid(g)), u) with the operands of the inner (order[0]) and outer (order[1]) Mul swapped."""
    inner = ["g", "s"] if order[0] == 0 else ["s", "g"]
    outer = ["silu", "u"] if order[1] == 0 else ["u", "silu"]
    nodes = [helper.make_node("Sigmoid", ["g"], ["s"]), helper.make_node("Mul", inner, ["silu"]),
             helper.make_node("Mul", outer, ["y"])]
    return model(nodes, [("g", g_shape), ("u", u_shape)], ["y", *extra_outputs])


@pytest.mark.parametrize("order", [(0, 0), (0, 1), (1, 0), (1, 1)])
def test_swiglu_fires_and_equals_unfused_bit_for_bit(order):
    outs, grads = check_pass("swiglu", swiglu_model(order), [rnd(2, 5, 7, scale=3), rnd(2, 5, 7)], [True, True],
                             "SwiGLU", rtol=0, atol=0)
    assert grads[0].shape == grads[1].shape == (2, 5, 7)


def test_swiglu_only_fused_op_left():
    ops, _ = optimized_ops(swiglu_model(), [True, True])
    assert ops == ["SwiGLU"], ops


@pytest.mark.parametrize("g_shape,u_shape", [((2, 5, 7), (7,)), ((1, 7), (3, 4, 7)), ((3, 1, 7), (1, 4, 1))])
def test_swiglu_broadcast_gate_and_up(g_shape, u_shape):
    # the gradient of a broadcast operand is summed back to its shape (SumToShape): the sums run in
    # another order than the unfused graph's, so equal to rounding
    check_pass("swiglu", swiglu_model((0, 0), g_shape, u_shape), [rnd(*g_shape, scale=2), rnd(*u_shape)],
               [True, True], "SwiGLU", rtol=1e-5, atol=1e-6)


def test_swiglu_gradient_of_one_input_only():
    check_pass("swiglu", swiglu_model(), [rnd(2, 5, 7), rnd(2, 5, 7)], [False, True], "SwiGLU", rtol=0, atol=0)
    check_pass("swiglu", swiglu_model(), [rnd(2, 5, 7), rnd(2, 5, 7)], [True, False], "SwiGLU", rtol=0, atol=0)


def test_swiglu_gate_is_up():
    # silu(g) * g: both gradients land on g
    nodes = [helper.make_node("Sigmoid", ["g"], ["s"]), helper.make_node("Mul", ["g", "s"], ["silu"]),
             helper.make_node("Mul", ["silu", "g"], ["y"])]
    check_pass("swiglu", model(nodes, [("g", (3, 8))], ["y"]), [rnd(3, 8, scale=3)], [True], "SwiGLU",
               rtol=1e-6, atol=1e-7)


def test_swiglu_left_alone_when_not_exactly_the_pattern():
    feeds = [rnd(2, 5, 7), rnd(2, 5, 7)]
    # the sigmoid (or silu) is also a graph output: read outside the pattern
    for extra in (["s"], ["silu"]):
        check_pass("swiglu", swiglu_model(extra_outputs=extra), feeds, [True, True], "SwiGLU", fires=False)
    # sigmoid of another tensor: g * sigmoid(u) * u
    nodes = [helper.make_node("Sigmoid", ["u"], ["s"]), helper.make_node("Mul", ["g", "s"], ["silu"]),
             helper.make_node("Mul", ["silu", "u"], ["y"])]
    check_pass("swiglu", model(nodes, [("g", (2, 5, 7)), ("u", (2, 5, 7))], ["y"]), feeds, [True, True], "SwiGLU",
               fires=False)
    # GELU's sigmoid approximation x * sigmoid(1.702 x) is not a SiLU
    nodes = [const("k", 1.702), helper.make_node("Mul", ["g", "k"], ["gk"]), helper.make_node("Sigmoid", ["gk"], ["s"]),
             helper.make_node("Mul", ["g", "s"], ["silu"]), helper.make_node("Mul", ["silu", "u"], ["y"])]
    check_pass("swiglu", model(nodes, [("g", (2, 5, 7)), ("u", (2, 5, 7))], ["y"]), feeds, [True, True], "SwiGLU",
               fires=False)


# ---- rotary_embedding: unit graphs --------------------------------------------------------

def rope_model(form="hf", d=8, x_rank=4, cos_shape=None, concat_order=(0, 1), add_order=0, mul_orders=(0, 0),
               slice_axis=None, concat_axis=-1, step=None, lo_start=0, other_x=False, extra_outputs=()):
    """y = x * cos + rotate_half(x) * sin, rotate_half as the exporters write it:
    form "hf":    s = Unsqueeze(Shape(x)[3] / 2), x[..., 0:s], x[..., s:INT64_MAX] on axis 3 (transformers)
    form "chunk": s = (Shape(x)[-1] + 1) / 2 * 1, x[..., 0:s], x[..., s:s*2] on axis -1 (x.chunk(2, -1))"""
    B, H, T = 2, 3, 5
    x_shape = (B, H, T, d)[4 - x_rank:]
    cos_shape = cos_shape or (T, d)
    nodes = [helper.make_node("Shape", ["x"], ["shp"])]
    if form == "hf":
        axis = x_rank - 1 if slice_axis is None else slice_axis
        nodes += [i64("ax_i", axis), helper.make_node("Gather", ["shp", "ax_i"], ["dd"], axis=0), i64("two", 2),
                  helper.make_node("Div", ["dd", "two"], ["h"]), i64("zero_ax", [0]),
                  helper.make_node("Unsqueeze", ["h", "zero_ax"], ["split"]), i64("big", [BIG]),
                  helper.make_node("Identity", ["big"], ["end"])]
    else:
        axis = -1 if slice_axis is None else slice_axis
        nodes += [i64("last", [-1]), helper.make_node("Gather", ["shp", "last"], ["dd"], axis=0), i64("one", [1]),
                  i64("two", [2]), helper.make_node("Add", ["dd", "one"], ["dd1"]),
                  helper.make_node("Div", ["dd1", "two"], ["h"]), helper.make_node("Mul", ["h", "one"], ["split"]),
                  helper.make_node("Mul", ["h", "two"], ["end"])]
    src = "x2" if other_x else "x"
    steps = [] if step is None else ["steps"]
    nodes += [i64("axes", [axis]), i64("start0", [lo_start])]
    if step is not None:
        nodes.append(i64("steps", [step]))
    nodes += [helper.make_node("Slice", [src, "start0", "split", "axes", *steps], ["lo"]),
              helper.make_node("Slice", ["x", "split", "end", "axes", *steps], ["hi"]),
              helper.make_node("Neg", ["hi"], ["nhi"])]
    cat_in = [["nhi", "lo"][i] for i in concat_order]
    nodes.append(helper.make_node("Concat", cat_in, ["rot"], axis=concat_axis))
    nodes.append(helper.make_node("Mul", ["x", "cos"] if mul_orders[0] == 0 else ["cos", "x"], ["xc"]))
    nodes.append(helper.make_node("Mul", ["rot", "sin"] if mul_orders[1] == 0 else ["sin", "rot"], ["rs"]))
    nodes.append(helper.make_node("Add", ["xc", "rs"] if add_order == 0 else ["rs", "xc"], ["y"]))
    inputs = [("x", x_shape), ("cos", cos_shape), ("sin", cos_shape)]
    if other_x:
        inputs.append(("x2", x_shape))
    m = model(nodes, inputs, ["y", *extra_outputs])
    feeds = [rnd(*x_shape), np.cos(rnd(*cos_shape)), np.sin(rnd(*cos_shape))] + ([rnd(*x_shape)] if other_x else [])
    return m, feeds


@pytest.mark.parametrize("form", ["hf", "chunk"])
@pytest.mark.parametrize("orders", [(0, (0, 0)), (1, (1, 0)), (0, (1, 1)), (1, (0, 1))])
def test_rotary_fires_and_equals_unfused_bit_for_bit(form, orders):
    m, feeds = rope_model(form, add_order=orders[0], mul_orders=orders[1])
    check_pass("rotary_embedding", m, feeds, [True, False, False], "FusedRotary", rtol=0, atol=0)
    ops, _ = optimized_ops(m, [True, False, False])
    assert "Neg" not in ops and "Concat" not in ops and ops.count("FusedRotary") == 1, ops


@pytest.mark.parametrize("form,d", [("hf", 6), ("chunk", 6), ("chunk", 7), ("hf", 7), ("chunk", 1), ("hf", 2)])
def test_rotary_head_dims(form, d):
    # odd d: chunk splits at ceil(d/2), d//2 at floor; either way the halves cover d
    m, feeds = rope_model(form, d=d, cos_shape=(5, d))
    check_pass("rotary_embedding", m, feeds, [True, False, False], "FusedRotary", rtol=0, atol=0)


@pytest.mark.parametrize("cos_shape", [(2, 1, 5, 8), (1, 8), (5, 1), (8,)])
def test_rotary_cos_sin_broadcast_and_their_gradients(cos_shape):
    # transformers' cos/sin are (B, 1, T, d); here they also want gradients (a learned table):
    # the fused rule emits them from dy * x and dy * rotate_half(x), summed to their shapes
    m, feeds = rope_model("hf", cos_shape=cos_shape)
    check_pass("rotary_embedding", m, feeds, [True, True, True], "FusedRotary", rtol=1e-5, atol=1e-6)
    check_pass("rotary_embedding", m, feeds, [False, False, True], "FusedRotary", rtol=1e-5, atol=1e-6)


def test_rotary_rank3_chunk_form():
    m, feeds = rope_model("chunk", x_rank=3)
    check_pass("rotary_embedding", m, feeds, [True, False, False], "FusedRotary", rtol=0, atol=0)


def test_rotary_cos_that_does_not_broadcast_into_x_is_refused_by_name():
    # x (5, 8) * cos (2, 3, 5, 8) broadcasts x up: the fused op keeps x's shape, so its shape rule
    # refuses the plan (naming the pass to switch off) rather than computing something else
    m, feeds = rope_model("chunk", x_rank=2, cos_shape=(2, 3, 5, 8))
    ops, _ = optimized_ops(m, [True, False, False])
    assert "FusedRotary" in ops
    with pytest.raises(Exception, match="rotary_embedding"):
        run(m, feeds, grad=[True, False, False])
    with options.overridden(disable_passes="rotary_embedding"):
        outs, _, _ = run(m, feeds, grad=[True, False, False])
    assert outs[0].shape == (2, 3, 5, 8)


@pytest.mark.parametrize("change", [
    dict(concat_order=(1, 0)),                 # Concat(x[:s], -x[s:]): not rotate_half
    dict(other_x=True),                        # the first half sliced from another tensor
    dict(slice_axis=2),                        # slices along T, concat along d
    dict(concat_axis=2),                       # concat along T
    dict(step=2),                              # a stepped slice
    dict(lo_start=1),                          # the first half starts at 1
    dict(extra_outputs=("rot",)),              # rotate_half read outside the pattern
    dict(extra_outputs=("xc",)),
])
def test_rotary_left_alone_when_not_exactly_the_pattern(change):
    m, feeds = rope_model("hf", **change)
    ops, _ = optimized_ops(m, [True, False, False] + ([False] if change.get("other_x") else []))
    assert "FusedRotary" not in ops, ops


def test_rotary_axis_of_unknown_rank_is_left_alone():
    # a slice on axis 3 is the last axis only if x has rank 4: x from an op whose rank the pass
    # cannot prove (a Reshape to a computed shape) is left alone; axis -1 is fused
    def build(axis):
        nodes = [helper.make_node("Shape", ["x0"], ["shp0"]), helper.make_node("Reshape", ["x0", "shp0"], ["x"]),
                 helper.make_node("Shape", ["x"], ["shp"]), i64("ax_i", 3),
                 helper.make_node("Gather", ["shp", "ax_i"], ["dd"], axis=0), i64("two", 2),
                 helper.make_node("Div", ["dd", "two"], ["h"]), i64("zero_ax", [0]),
                 helper.make_node("Unsqueeze", ["h", "zero_ax"], ["split"]), i64("big", [BIG]), i64("axes", [axis]),
                 i64("start0", [0]), helper.make_node("Slice", ["x", "start0", "split", "axes"], ["lo"]),
                 helper.make_node("Slice", ["x", "split", "big", "axes"], ["hi"]), helper.make_node("Neg", ["hi"], ["nhi"]),
                 helper.make_node("Concat", ["nhi", "lo"], ["rot"], axis=-1),
                 helper.make_node("Mul", ["x", "cos"], ["xc"]), helper.make_node("Mul", ["rot", "sin"], ["rs"]),
                 helper.make_node("Add", ["xc", "rs"], ["y"])]
        return model(nodes, [("x0", (2, 3, 5, 8)), ("cos", (5, 8)), ("sin", (5, 8))], ["y"])
    assert "FusedRotary" not in optimized_ops(build(3), [True, False, False])[0]
    assert "FusedRotary" in optimized_ops(build(-1), [True, False, False])[0]


# ---- whole models: fused against unfused ------------------------------------------------------

def _fired(ortmodule):
    fired = {}
    for r in engine_reports(ortmodule):
        for p in r.get("passes", []):
            fired[p["pass"]] = fired.get(p["pass"], 0) + p["fired"]
    return fired


def _step(base, args, disabled, dtype, kwargs=None):
    with options.overridden(disable_passes=disabled):
        m = ORTModule(copy.deepcopy(base).to(dtype))
        out = m(*args, **(kwargs or {}))
        loss = out if torch.is_tensor(out) else out.loss
        loss.float().backward()
    grads = {n: p.grad.detach().float().clone() for n, p in m.named_parameters() if p.grad is not None}
    return loss.detach().float(), grads, _fired(m)


def _compare(base, args, dtype, kwargs=None, n_swiglu=None, n_rope=None):
    loss_f, g_f, fired = _step(base, args, "", dtype, kwargs)
    loss_u, g_u, fired_u = _step(base, args, "swiglu,rotary_embedding", dtype, kwargs)
    assert fired.get("swiglu", 0) == n_swiglu and fired.get("rotary_embedding", 0) == n_rope, fired
    assert fired_u.get("swiglu", 0) == 0 and fired_u.get("rotary_embedding", 0) == 0
    assert g_f.keys() == g_u.keys() and len(g_f) > 0
    # fp32: the same formulas (sums over broadcast heads of the RoPE's cos/sin are not taken, the
    # gradients flow only into x): equal to fp32 rounding. bf16: the fused ops round once where the
    # unfused graph rounds after each op: close, relative to each gradient's size
    tol = 1e-6 if dtype == torch.float32 else 3e-2
    assert abs(loss_f - loss_u) <= tol * max(1.0, abs(loss_u)), (loss_f, loss_u)
    worst = max((((g_f[n] - g_u[n]).norm() / g_u[n].norm().clamp_min(1e-30)).item(), n) for n in g_u)
    print(f"{dtype}: loss {loss_f.item():.6f} vs {loss_u.item():.6f}; worst gradient difference {worst[0]:.2e} ({worst[1]})")
    assert worst[0] <= tol, worst


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_bench_llama_fused_matches_unfused(dtype):
    torch.manual_seed(0)
    base = bench_models.Llama(vocab=97, d=48, heads=4, kv_heads=2, ffn=37, layers=2, max_len=32)
    g = torch.Generator().manual_seed(1)
    idx, tgt = torch.randint(0, 97, (3, 13), generator=g), torch.randint(0, 97, (3, 13), generator=g)
    _compare(base, (idx, tgt), dtype, n_swiglu=2, n_rope=4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_transformers_llama_fused_matches_unfused(dtype):
    transformers = pytest.importorskip("transformers")
    from test_models_rotary import FAMILIES, make_batches
    torch.manual_seed(0)
    base = FAMILIES["llama"]()
    batch = make_batches()[2]    # T = 9, one row right-padded
    _compare(base, (), dtype, kwargs=batch, n_swiglu=2, n_rope=4)
