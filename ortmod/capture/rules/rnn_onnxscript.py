"""ortmod's translations of the recurrent layers (``aten::lstm``, ``aten::gru``, ``aten::rnn_tanh``,
``aten::rnn_relu``, their ``.input`` overloads) for the torch.export capture path (issue 16).

The TorchScript path exports one ONNX ``LSTM``/``GRU``/``RNN`` node per layer, which the engine
runs as its op of that name and differentiates with ``LSTMGrad``/``GRUGrad``/``RNNGrad``
(csrc/ops/rnn.c); these rules give the same nodes, so both paths mean the same thing:

    LSTM  i, f, g, o = x_t W_ih^T + b_ih + h W_hh^T + b_hh;  c_t = s(f) c + s(i) tanh(g);  h_t = s(o) tanh(c_t)
    GRU   r, z from the sum as above;  n = tanh(x_t W_in^T + b_in + r (h W_hn^T + b_hn));  h_t = (1 - z) n + z h
    RNN   h_t = f(x_t W_ih^T + b_ih + h W_hh^T + b_hh),  f = tanh or relu

per layer and direction, W = W_ih, R = W_hh, B = [b_ih, b_hh], torch's gate blocks reordered to
ONNX's, GRU with linear_before_reset=1 (torch's n above); each layer's h0 (c0) sliced from hx
(layer-major, the directions of a layer together, as torch's h_n), the directions' outputs side
by side on the feature axis as the next layer's input; batch_first transposed around. The
module unsqueezes an unbatched input and builds zero states when none is given: the op always
sees them.

torchlib's LSTM/GRU rules build these nodes too, but take the hidden size from hx's dims, which
the export leaves symbolic when the caller passes the state (the translation then fails); here
it is W_hh's. torchlib has no rule for rnn_tanh/rnn_relu, so torch's decomposition would unroll
them over time (an ``unbind`` of the sequence, a graph specialised to its length).

Refused by ``audit._CHECKS`` before translation: dropout between layers in training
(eager draws its mask between layers; the TorchScript path refuses it too) and a weight list
that is not (W_ih, W_hh[, b_ih, b_hh][, W_hr]) per layer and direction; packed sequences (the
``.data`` overloads) are not reviewed. nn.LSTM(proj_size > 0), which ONNX's LSTM cannot
express, is unrolled over time as on the TorchScript path (``projected``).

``translations(op, ir, stop_gradient)`` returns {aten overload: onnxscript function}, merged
into the translator's registry as ``export_registry``'s rule modules is."""
import contextlib

import torch

from .rnn import MAX_UNROLL, _MAX_CONCAT


@contextlib.contextmanager
def static_projection_lengths(module):
    """While torch.export traces: the sequence length of every nn.LSTM(proj_size > 0) in
    ``module`` is read as a number, which specialises it (the projection is unrolled over time,
    so the graph is for one length); the export's ShapeGuard then checks it per call and another
    length exports again, as the TorchScript path re-exports with static sizes."""
    def read_length(lstm, args):
        x = args[0] if args else None
        if isinstance(x, torch.Tensor) and x.dim() in (2, 3):
            int(x.shape[1 if lstm.batch_first and x.dim() == 3 else 0])
    handles = [m.register_forward_pre_hook(read_length) for m in module.modules()
               if isinstance(m, torch.nn.LSTM) and m.proj_size > 0]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def translations(op, ir, stop_gradient):
    from typing import Sequence, Tuple
    from onnxscript.function_libs.torch_lib.tensor_typing import TFloat

    I64 = ir.DataType.INT64

    def ints(v):
        return op.Constant(value=ir.tensor(list(v), dtype=I64))

    # torch's gate blocks (rows of W_ih, W_hh, b_ih, b_hh) in ONNX's order: LSTM i,f,g,o -> i,o,f,c;
    # GRU r,z,n -> z,r,h; RNN one block
    gate_order = {"LSTM": (0, 3, 1, 2), "GRU": (1, 0, 2), "RNN": (0,)}

    def reordered(v, order, hidden):
        if len(order) == 1:
            return v
        return op.Concat(*[op.Slice(v, ints([k * hidden]), ints([(k + 1) * hidden]), ints([0])) for k in order],
                         axis=0)

    def layers(cell, x, h0, c0, params, has_biases, num_layers, bidirectional, batch_first, **attrs):
        directions = 2 if bidirectional else 1
        per = 4 if has_biases else 2
        order = gate_order[cell]
        # the hidden size from W_hh (a parameter: static); torchlib's LSTM/GRU rules read it from
        # hx, whose dims the export leaves symbolic when the caller passes the state
        hidden = int(params[1].shape[1])
        x = op.Transpose(x, perm=[1, 0, 2]) if batch_first else x                 # (T, B, I)
        h_n, c_n = [], []
        for layer in range(num_layers):
            w, r, b = [], [], []
            for d in range(directions):
                p = params[(layer * directions + d) * per:(layer * directions + d + 1) * per]
                w.append(op.Unsqueeze(reordered(p[0], order, hidden), ints([0])))
                r.append(op.Unsqueeze(reordered(p[1], order, hidden), ints([0])))
                if has_biases:
                    b.append(op.Unsqueeze(op.Concat(reordered(p[2], order, hidden), reordered(p[3], order, hidden),
                                                    axis=0), ints([0])))
            W = op.Concat(*w, axis=0) if directions > 1 else w[0]
            R = op.Concat(*r, axis=0) if directions > 1 else r[0]
            B = (op.Concat(*b, axis=0) if directions > 1 else b[0]) if has_biases else None
            lo, hi = ints([layer * directions]), ints([(layer + 1) * directions])
            state = dict(initial_h=op.Slice(h0, lo, hi, ints([0])))
            if c0 is not None:
                state["initial_c"] = op.Slice(c0, lo, hi, ints([0]))
            node = getattr(op, cell)
            outs = node(x, W, R, B, None, **state, hidden_size=hidden,
                        direction="bidirectional" if bidirectional else "forward", **attrs)
            y = outs[0]
            h_n.append(outs[1])
            if c0 is not None:
                c_n.append(outs[2])
            # (T, D, B, H) -> (T, B, D*H): each step's directions side by side, as eager
            x = op.Reshape(op.Transpose(y, perm=[0, 2, 1, 3]), ints([0, 0, -1]))
        out = op.Transpose(x, perm=[1, 0, 2]) if batch_first else x
        cat = (lambda v: op.Concat(*v, axis=0) if len(v) > 1 else v[0])
        return (out, cat(h_n), cat(c_n)) if c0 is not None else (out, cat(h_n))

    def concat(xs, axis):
        # in chunks of at most _MAX_CONCAT inputs: the engine differentiates a node's first 32
        while len(xs) > 1:
            xs = [c[0] if len(c) == 1 else op.Concat(*c, axis=axis)
                  for c in (xs[j:j + _MAX_CONCAT] for j in range(0, len(xs), _MAX_CONCAT))]
        return xs[0]

    def projected(x, h0, c0, params, has_biases, num_layers, bidirectional, batch_first):
        # nn.LSTM(proj_size > 0), which ONNX's LSTM cannot express: the TorchScript path's rule
        # (ortmod/capture/rules/rnn.py), unrolled over the sequence (its length specialised by
        # static_projection_lengths), in eager's equations: gates from x_t W_ih^T + b_ih +
        # h W_hh^T + b_hh in torch's order i, f, g, o; c_t = s(f) c + s(i) tanh(g);
        # h_t = (s(o) tanh(c_t)) W_hr^T. The reverse direction runs t = T-1 .. 0.
        directions = 2 if bidirectional else 1
        per = 5 if has_biases else 3
        proj, hidden = int(params[per - 1].shape[0]), int(params[per - 1].shape[1])
        # the export specialised the length (_CHECKS made sure): the translator names that dim
        # by the number
        steps = x.shape[1 if batch_first else 0]
        steps = steps if isinstance(steps, int) else getattr(steps, "value", None)
        steps = int(steps) if isinstance(steps, int) or (isinstance(steps, str) and steps.isdigit()) else None
        x = op.Transpose(x, perm=[1, 0, 2]) if batch_first else x                 # (T, B, I)
        if steps is None:
            raise NotImplementedError("ortmod: nn.LSTM(proj_size > 0) needs its sequence length at export")
        if steps > MAX_UNROLL or steps == 0:
            raise NotImplementedError(f"ortmod: nn.LSTM(proj_size > 0) unrolls 1..{MAX_UNROLL} steps, not {steps}")

        def sl(v, axis, start, width=1):
            return op.Slice(v, ints([start]), ints([start + width]), ints([axis]))

        h_n, c_n = [], []
        for layer in range(num_layers):
            outs = []
            for d in range(directions):
                k = layer * directions + d
                p = params[k * per:(k + 1) * per]
                w_ih, w_hh, w_hr = p[0], p[1], p[per - 1]
                b_ih, b_hh = (p[2], p[3]) if has_biases else (None, None)
                xw = op.MatMul(x, op.Transpose(w_ih, perm=[1, 0]))                   # (T, B, 4H)
                if b_ih is not None:
                    xw = op.Add(xw, b_ih)
                r = op.Transpose(w_hh, perm=[1, 0])                                  # (P, 4H)
                pr = op.Transpose(w_hr, perm=[1, 0])                                 # (H, P)
                h, c = sl(h0, 0, k), sl(c0, 0, k)                                    # (1, B, P), (1, B, H)
                hs = [None] * steps
                for t in (range(steps - 1, -1, -1) if d == 1 else range(steps)):
                    gates = op.Add(sl(xw, 0, t), op.MatMul(h, r))
                    if b_hh is not None:
                        gates = op.Add(gates, b_hh)
                    i, f, g, o = (sl(gates, 2, j * hidden, hidden) for j in range(4))
                    c = op.Add(op.Mul(op.Sigmoid(f), c), op.Mul(op.Sigmoid(i), op.Tanh(g)))
                    h = op.MatMul(op.Mul(op.Sigmoid(o), op.Tanh(c)), pr)
                    hs[t] = h
                outs.append(concat(hs, 0))
                h_n.append(h)
                c_n.append(c)
            x = outs[0] if directions == 1 else op.Concat(*outs, axis=2)
        out = op.Transpose(x, perm=[1, 0, 2]) if batch_first else x
        return out, concat(h_n, 0), concat(c_n, 0)

    def lstm(input: TFloat, hx: Sequence[TFloat], params: Sequence[TFloat], has_biases: bool, num_layers: int,
             dropout: float, train: bool, bidirectional: bool, batch_first: bool) -> Tuple[TFloat, TFloat, TFloat]:
        if len(params) != num_layers * (2 if bidirectional else 1) * (4 if has_biases else 2):
            # W_hr per layer and direction (_CHECKS refuses any other count)
            return projected(input, hx[0], hx[1], params, has_biases, num_layers, bidirectional, batch_first)
        return layers("LSTM", input, hx[0], hx[1], params, has_biases, num_layers, bidirectional, batch_first)

    def gru(input: TFloat, hx: TFloat, params: Sequence[TFloat], has_biases: bool, num_layers: int,
            dropout: float, train: bool, bidirectional: bool, batch_first: bool) -> Tuple[TFloat, TFloat]:
        # linear_before_reset: torch's n = tanh(W_in x + b_in + r * (W_hn h + b_hn))
        return layers("GRU", input, hx, None, params, has_biases, num_layers, bidirectional, batch_first,
                      linear_before_reset=1)

    def rnn(activation):
        def rnn_layers(input: TFloat, hx: TFloat, params: Sequence[TFloat], has_biases: bool, num_layers: int,
                       dropout: float, train: bool, bidirectional: bool,
                       batch_first: bool) -> Tuple[TFloat, TFloat]:
            return layers("RNN", input, hx, None, params, has_biases, num_layers, bidirectional, batch_first,
                          activations=[activation] * (2 if bidirectional else 1))
        return rnn_layers

    return {
        torch.ops.aten.lstm.input: lstm,
        torch.ops.aten.gru.input: gru,
        torch.ops.aten.rnn_tanh.input: rnn("Tanh"),
        torch.ops.aten.rnn_relu.input: rnn("Relu"),
    }
