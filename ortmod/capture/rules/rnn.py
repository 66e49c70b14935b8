"""ortmod's export rule for ``aten::lstm`` with projections (``nn.LSTM(proj_size > 0)``), which
torch's TorchScript exporter refuses ("LSTMs with projections"): ONNX's LSTM has no projection,
so the recurrence is unrolled over the (static) sequence length, per layer and direction, in
eager's equations (torch.nn.LSTM's documentation, PyTorch's gate order i, f, g, o):

    gates = x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh      -> i, f, g, o
    i, f, o = sigmoid(.), g = tanh(.)
    c_t = f * c_{t-1} + i * g
    h_t = (o * tanh(c_t)) W_hr^T

The reverse direction runs t = T-1 .. 0 and writes its h_t at t; a bidirectional layer's
output concatenates the two directions' on the feature axis, and is the next layer's input.
Outputs as eager's: the sequence (T, B, D*P), or (B, T, D*P) batch_first; h_n (L*D, B, P);
c_n (L*D, B, H). The module itself unsqueezes an unbatched input and its (h0, c0) around the
op, and builds zero initial states when none is given: the op sees (h0, c0) as tensors.
Gradients are the engine's autodiff of these ops.

Without projections the stock rule (one ONNX LSTM node per layer) is used unchanged.

Refused, by name: packed sequences with projections, inter-layer dropout in training (eager
draws a mask ortmod cannot reproduce), sequences longer than ``MAX_UNROLL`` steps (the
unrolled graph grows with the length). A sequence length unknown at export (dynamic dims)
makes ortmod export again with static sizes.

``symbolics(registration, opset)`` returns {aten name: symbolic}; ``semantic_export``
registers them only while ortmod exports."""
import torch

from .nn import _NeedsStaticSizes
from ..onnx_util import _const, _refuse, _torch_symbolic

MAX_UNROLL = 512
_I64 = torch.int64
_WHAT = "nn.LSTM(proj_size>0)"
# the engine differentiates a node's first 32 inputs only (csrc/autodiff/autodiff.c: a 32-bit
# diff_inputs mask; a Concat's later inputs got no gradient, silently) and takes 64 at most
_MAX_CONCAT = 32


def symbolics(registration, opset):
    stock = _torch_symbolic(registration, "aten::lstm", opset)
    return {"aten::lstm": _lstm_symbolic(stock)}


def _lstm_symbolic(stock):
    def symbolic(g, *args):
        from ..compat import symbolic_helper as sh
        packed = sh.is_tensor_list(args[3])
        weights = sh.unpack_list(args[3] if packed else args[2])
        has_biases, num_layers, bidirectional = (args[4], args[5], args[8]) if packed else (args[3], args[4], args[7])
        consts = [sh.maybe_get_const(v, kind) for v, kind in
                  ((has_biases, "b"), (num_layers, "i"), (bidirectional, "b"))]
        if any(sh.is_value(c) for c in consts):
            return _stock(stock, g, args)   # not ortmod's to tell apart: torch's rule answers
        has_biases, num_layers, bidirectional = consts
        directions = 2 if bidirectional else 1
        per = 4 if has_biases else 2
        if len(weights) == num_layers * directions * per:
            return _stock(stock, g, args)
        if len(weights) != num_layers * directions * (per + 1):
            _refuse("aten::lstm", f"{len(weights)} weights for {num_layers} layer(s), {directions} "
                                  f"direction(s), bias={bool(has_biases)}")
        if packed:
            _refuse(_WHAT, "packed sequences (PackedSequence) with projections are not exported by ortmod")
        input, hx, _, _, _, dropout, train, _, batch_first = args
        dropout = _const_arg(dropout, "f", "dropout")
        train = _const_arg(train, "b", "train")
        batch_first = _const_arg(batch_first, "b", "batch_first")
        if dropout and train and num_layers > 1:
            _refuse(_WHAT, "dropout between layers in training mode (eager draws a random mask "
                           "ortmod cannot reproduce); set dropout=0 or train in eval mode")
        h0, c0 = sh.unpack_list(hx)
        return _unrolled(g, input, h0, c0, weights, bool(has_biases), int(num_layers), directions,
                         bool(batch_first))
    return symbolic


def _stock(stock, g, args):
    if stock is None:
        _refuse("aten::lstm", "torch's exporter has no rule for it at this opset")
    return stock(g, *args)


def _const_arg(v, kind, name):
    from ..compat import symbolic_helper as sh
    c = sh.maybe_get_const(v, kind)
    if sh.is_value(c):
        _refuse(_WHAT, f"{name} is not a constant at export")
    return c


def _sizes(v):
    from ..compat import symbolic_helper as sh
    return sh.get_tensor_sizes(v)


class _Consts:
    """Constants cached per export call (every time step slices with the same few)."""
    def __init__(self, g):
        self.g, self.cache = g, {}

    def __call__(self, *vals):
        if vals not in self.cache:
            self.cache[vals] = _const(self.g, list(vals), _I64)
        return self.cache[vals]


def _unrolled(g, input, h0, c0, weights, has_biases, num_layers, directions, batch_first):
    sizes = _sizes(input)
    if sizes is None or len(sizes) != 3:
        raise _NeedsStaticSizes(f"{_WHAT}: the input's rank is not known at export")
    steps = sizes[1] if batch_first else sizes[0]
    if steps is None:
        raise _NeedsStaticSizes(f"{_WHAT}: the sequence length is not known at export")
    if steps > MAX_UNROLL:
        _refuse(_WHAT, f"sequence length {steps} is above {MAX_UNROLL}: ortmod unrolls the "
                       "recurrence over time and the graph would be too large")
    if steps == 0:
        _refuse(_WHAT, "an empty sequence (eager refuses it too)")
    per = 5 if has_biases else 3
    w_hr0 = weights[per - 1]
    wsz = _sizes(w_hr0)
    if wsz is None or None in wsz:
        raise _NeedsStaticSizes(f"{_WHAT}: the projection weight's sizes are not known at export")
    proj, hidden = wsz
    k = _Consts(g)
    x = g.op("Transpose", input, perm_i=[1, 0, 2]) if batch_first else input   # (T, B, I)
    h_n, c_n = [], []
    for layer in range(num_layers):
        outs = []
        for d in range(directions):
            idx = layer * directions + d
            w = weights[idx * per:(idx + 1) * per]
            if has_biases:
                w_ih, w_hh, b_ih, b_hh, w_hr = w
            else:
                (w_ih, w_hh, w_hr), b_ih, b_hh = w, None, None
            seq, h, c = _direction(g, k, x, _slice(g, k, h0, 0, idx), _slice(g, k, c0, 0, idx),
                                   w_ih, w_hh, b_ih, b_hh, w_hr, hidden, steps, reverse=d == 1)
            outs.append(seq)
            h_n.append(h)
            c_n.append(c)
        x = outs[0] if directions == 1 else g.op("Concat", *outs, axis_i=2)
    out = g.op("Transpose", x, perm_i=[1, 0, 2]) if batch_first else x
    return out, _concat(g, h_n, 0), _concat(g, c_n, 0)


def _concat(g, xs, axis):
    """Concat of any number of values, in chunks of at most ``_MAX_CONCAT`` inputs, then the
    chunks (the engine gives no gradient to a node's inputs past the 32nd)."""
    while len(xs) > 1:
        xs = [x[0] if len(x) == 1 else g.op("Concat", *x, axis_i=axis)
              for x in (xs[j:j + _MAX_CONCAT] for j in range(0, len(xs), _MAX_CONCAT))]
    return xs[0]


def _slice(g, k, x, axis, i, width=1):
    return g.op("Slice", x, k(i), k(i + width), k(axis))


def _direction(g, k, x, h, c, w_ih, w_hh, b_ih, b_hh, w_hr, hidden, steps, reverse):
    """One layer, one direction, on x (T, B, I) from h (1, B, P), c (1, B, H): the h_t
    sequence (T, B, P) and the last h, c. Everything stays rank 3 with a time axis of 1."""
    xw = g.op("MatMul", x, g.op("Transpose", w_ih, perm_i=[1, 0]))          # (T, B, 4H)
    if b_ih is not None:
        xw = g.op("Add", xw, b_ih)
    r = g.op("Transpose", w_hh, perm_i=[1, 0])                              # (P, 4H)
    p = g.op("Transpose", w_hr, perm_i=[1, 0])                              # (H, P)
    hs = [None] * steps
    for t in (range(steps - 1, -1, -1) if reverse else range(steps)):
        gates = g.op("Add", _slice(g, k, xw, 0, t), g.op("MatMul", h, r))
        if b_hh is not None:
            gates = g.op("Add", gates, b_hh)
        i, f, gg, o = (_slice(g, k, gates, 2, j * hidden, hidden) for j in range(4))
        i, f, o = g.op("Sigmoid", i), g.op("Sigmoid", f), g.op("Sigmoid", o)
        c = g.op("Add", g.op("Mul", f, c), g.op("Mul", i, g.op("Tanh", gg)))
        h = g.op("MatMul", g.op("Mul", o, g.op("Tanh", c)), p)
        hs[t] = h
    return _concat(g, hs, 0), h, c
