"""One-op tests through the engine alone: build a one-node ONNX model, run it, check it.

check_op runs the node in float32 against a reference (parity) and checks the engine's
gradients against central finite differences of the engine's own forward in float64.
No torch op computes anything here: the reference is numpy (or torch, by the caller).
"""
import numpy as np
import onnx
import torch.nn as nn
from onnx import TensorProto, helper, numpy_helper

from ortmod import _C

_NP_TO_ONNX = {
    np.dtype("float32"): TensorProto.FLOAT,
    np.dtype("float64"): TensorProto.DOUBLE,
    np.dtype("int64"): TensorProto.INT64,
    np.dtype("int32"): TensorProto.INT32,
    np.dtype("bool"): TensorProto.BOOL,
    np.dtype("uint8"): TensorProto.UINT8,
}


def _as_float(a, dt):
    return a.astype(dt) if np.issubdtype(a.dtype, np.floating) else a


def make_model(op_type, inputs, attrs=None, domain="", opset=20, n_outputs=1, const_inputs=()):
    """A one-node model; inputs is an ordered dict name -> array (None = absent optional)."""
    graph_inputs, inits, names = [], [], []
    for name, arr in inputs.items():
        if arr is None:
            names.append("")
            continue
        names.append(name)
        if name in const_inputs:
            inits.append(numpy_helper.from_array(np.asarray(arr), name))
        else:
            graph_inputs.append(helper.make_tensor_value_info(name, _NP_TO_ONNX[np.asarray(arr).dtype], None))
    outs = [f"out{i}" for i in range(n_outputs)]
    node = helper.make_node(op_type, names, outs, domain=domain, **(attrs or {}))
    graph = helper.make_graph([node], "one_op", graph_inputs,
                              [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outs],
                              initializer=inits)
    opsets = [helper.make_opsetid("", opset)]
    if domain:
        opsets.append(helper.make_opsetid(domain, 1))
    return helper.make_model(graph, opset_imports=opsets).SerializeToString()


def run(model_bytes, feeds, grad=None, seed=0, training=True):
    """Runs forward (and backward with random output gradients when grad is given).
    feeds: list of arrays in graph-input order. Returns (outputs, grads, dys)."""
    grad_flags = [bool(g) for g in grad] if grad is not None else None
    eng = _C.Engine(model_bytes, grad_flags)
    caps, stash = eng.forward([np.require(f, requirements="C") for f in feeds], training)
    outs = [np.from_dlpack(_Cap(c)).copy() for c in caps]
    if grad is None or stash is None:
        return outs, None, None
    rng = np.random.default_rng(seed)
    dys = [rng.standard_normal(o.shape).astype(o.dtype) if np.issubdtype(o.dtype, np.floating) else None
           for o in outs]
    dys = [d if diff else None for d, diff in zip(dys, eng.output_differentiable)]
    gcaps = eng.backward(stash, [None if d is None else np.require(d, requirements="C") for d in dys])
    grads = [None if c is None else np.from_dlpack(_Cap(c)).copy() for c in gcaps]
    return outs, grads, dys


class _Cap:
    """numpy.from_dlpack wants an object with __dlpack__; this wraps a capsule."""

    def __init__(self, cap):
        self.cap = cap

    def __dlpack__(self, **kwargs):
        return self.cap

    def __dlpack_device__(self):
        return (1, 0)


def check_op(op_type, inputs, ref=None, attrs=None, grad=(), domain="", opset=20, n_outputs=1,
             rtol=1e-4, atol=1e-5, const_inputs=(), grad_rtol=1e-4, grad_atol=1e-6, eps=1e-6):
    """Parity in float32 against ref(**inputs) (float inputs cast to float32), then a
    finite-difference gradient check in float64 of the inputs named in grad."""
    inputs = dict(inputs)
    feed_names = [n for n, a in inputs.items() if a is not None and n not in const_inputs]

    # --- parity, float32
    in32 = {n: (None if a is None else _as_float(np.asarray(a), np.float32)) for n, a in inputs.items()}
    model = make_model(op_type, in32, attrs, domain, opset, n_outputs, const_inputs)
    outs, _, _ = run(model, [in32[n] for n in feed_names])
    if ref is not None:
        expect = ref(**{n: a for n, a in in32.items()})
        expect = expect if isinstance(expect, (tuple, list)) else (expect,)
        for i, (o, e) in enumerate(zip(outs, expect)):
            if e is None:
                continue
            e = np.asarray(e)
            assert o.shape == e.shape, f"{op_type} output {i}: shape {o.shape} != expected {e.shape}"
            np.testing.assert_allclose(o.astype(np.float64) if o.dtype != bool else o,
                                       e.astype(np.float64) if e.dtype != bool else e,
                                       rtol=rtol, atol=atol, err_msg=f"{op_type} output {i}")
    if not grad:
        return outs

    # --- gradients, float64, central differences of sum(out * dy)
    in64 = {n: (None if a is None else _as_float(np.asarray(a), np.float64)) for n, a in inputs.items()}
    model64 = make_model(op_type, in64, attrs, domain, opset, n_outputs, const_inputs)
    feeds = [in64[n] for n in feed_names]
    flags = [n in grad for n in feed_names]
    outs64, grads, dys = run(model64, feeds, grad=flags)

    def objective(fs):
        o, _, _ = run(model64, fs)
        return sum(float(np.sum(oi * d)) for oi, d in zip(o, dys) if d is not None)

    for gi, name in enumerate(feed_names):
        if name not in grad:
            continue
        g = grads[gi]
        assert g is not None, f"{op_type}: no gradient for input '{name}'"
        assert g.shape == feeds[gi].shape, f"{op_type}: gradient of '{name}' has shape {g.shape}, input {feeds[gi].shape}"
        num = np.zeros_like(feeds[gi])
        flat = feeds[gi].reshape(-1)
        for k in range(flat.size):
            old = flat[k]
            flat[k] = old + eps
            fp = objective(feeds)
            flat[k] = old - eps
            fm = objective(feeds)
            flat[k] = old
            num.reshape(-1)[k] = (fp - fm) / (2 * eps)
        np.testing.assert_allclose(g, num, rtol=grad_rtol, atol=grad_atol,
                                   err_msg=f"{op_type}: gradient of '{name}' vs finite differences")
    return outs


class Fn(nn.Module):
    """A function as an nn.Module, what ORTModule wraps: ORTModule(Fn(torch.sin))(x)."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)
