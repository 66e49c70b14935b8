"""LSTM, GRU and RNN (ONNX semantics, layout 0): float32 parity against a numpy transcription of
the ONNX equations and float64 finite-difference checks of BPTT (LSTMGrad / GRUGrad / RNNGrad)
for every differentiable input — X, W, R, B, initial_h, initial_c — in each direction (RNN: with
Tanh and Relu, and the attributes it does not implement refused by name)."""
import numpy as np
import pytest

from ortmod import _C
from oputil import check_op, make_model, run

RNG = np.random.default_rng(31)
T, B, I, H = 3, 2, 3, 2


def randn(*shape, scale=0.5):
    return (scale * RNG.standard_normal(shape)).astype(np.float32)


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def directions(direction):
    return {"forward": [False], "reverse": [True], "bidirectional": [False, True]}[direction]


def lstm_ref(X, W, R, B=None, initial_h=None, initial_c=None, direction="forward"):
    revs = directions(direction)
    D, nT, nB, Hh = len(revs), X.shape[0], X.shape[1], R.shape[-1]
    Y = np.zeros((nT, D, nB, Hh), X.dtype)
    Yh = np.zeros((D, nB, Hh), X.dtype)
    Yc = np.zeros((D, nB, Hh), X.dtype)
    for d, rev in enumerate(revs):
        b = B[d, :4 * Hh] + B[d, 4 * Hh:] if B is not None else 0
        h = initial_h[d] if initial_h is not None else np.zeros((nB, Hh), X.dtype)
        c = initial_c[d] if initial_c is not None else np.zeros((nB, Hh), X.dtype)
        for t in (reversed(range(nT)) if rev else range(nT)):
            g = X[t] @ W[d].T + h @ R[d].T + b
            i, o, f, cc = (g[:, k * Hh:(k + 1) * Hh] for k in range(4))
            c = sigmoid(f) * c + sigmoid(i) * np.tanh(cc)
            h = sigmoid(o) * np.tanh(c)
            Y[t, d] = h
        Yh[d], Yc[d] = h, c
    return Y, Yh, Yc


def gru_ref(X, W, R, B=None, initial_h=None, direction="forward", lbr=1):
    revs = directions(direction)
    D, nT, nB, Hh = len(revs), X.shape[0], X.shape[1], R.shape[-1]
    Y = np.zeros((nT, D, nB, Hh), X.dtype)
    Yh = np.zeros((D, nB, Hh), X.dtype)
    for d, rev in enumerate(revs):
        wb = B[d, :3 * Hh] if B is not None else np.zeros(3 * Hh, X.dtype)
        rb = B[d, 3 * Hh:] if B is not None else np.zeros(3 * Hh, X.dtype)
        h = initial_h[d] if initial_h is not None else np.zeros((nB, Hh), X.dtype)
        Wz, Wr, Wh = np.split(W[d], 3)
        Rz, Rr, Rh = np.split(R[d], 3)
        for t in (reversed(range(nT)) if rev else range(nT)):
            x = X[t]
            z = sigmoid(x @ Wz.T + h @ Rz.T + wb[:Hh] + rb[:Hh])
            r = sigmoid(x @ Wr.T + h @ Rr.T + wb[Hh:2 * Hh] + rb[Hh:2 * Hh])
            if lbr:
                hh = np.tanh(x @ Wh.T + r * (h @ Rh.T + rb[2 * Hh:]) + wb[2 * Hh:])
            else:
                hh = np.tanh(x @ Wh.T + (r * h) @ Rh.T + rb[2 * Hh:] + wb[2 * Hh:])
            h = (1 - z) * hh + z * h
            Y[t, d] = h
        Yh[d] = h
    return Y, Yh


DIRS = ["forward", "reverse", "bidirectional"]


@pytest.mark.parametrize("direction", DIRS)
def test_lstm(direction):
    D = 2 if direction == "bidirectional" else 1
    inputs = {"X": randn(T, B, I), "W": randn(D, 4 * H, I), "R": randn(D, 4 * H, H), "B": randn(D, 8 * H),
              "sequence_lens": None, "initial_h": randn(D, B, H), "initial_c": randn(D, B, H)}
    check_op("LSTM", inputs,
             lambda X, W, R, B, sequence_lens, initial_h, initial_c: lstm_ref(X, W, R, B, initial_h, initial_c, direction),
             attrs={"hidden_size": H, "direction": direction}, n_outputs=3,
             grad=["X", "W", "R", "B", "initial_h", "initial_c"])


def test_lstm_minimal_inputs_and_only_y_h():
    """No B, no initial states; only Y_h is an output (what a classifier on the last state reads)."""
    inputs = {"X": randn(T, B, I), "W": randn(1, 4 * H, I), "R": randn(1, 4 * H, H)}
    check_op("LSTM", inputs, lambda X, W, R: (None, lstm_ref(X, W, R)[1]), attrs={"hidden_size": H},
             n_outputs=2, grad=["X", "W", "R"])


@pytest.mark.parametrize("direction", DIRS)
@pytest.mark.parametrize("lbr", [1, 0])
def test_gru(direction, lbr):
    D = 2 if direction == "bidirectional" else 1
    inputs = {"X": randn(T, B, I), "W": randn(D, 3 * H, I), "R": randn(D, 3 * H, H), "B": randn(D, 6 * H),
              "sequence_lens": None, "initial_h": randn(D, B, H)}
    check_op("GRU", inputs,
             lambda X, W, R, B, sequence_lens, initial_h: gru_ref(X, W, R, B, initial_h, direction, lbr),
             attrs={"hidden_size": H, "direction": direction, "linear_before_reset": lbr}, n_outputs=2,
             grad=["X", "W", "R", "B", "initial_h"])


def test_gru_minimal_inputs():
    inputs = {"X": randn(T, B, I), "W": randn(1, 3 * H, I), "R": randn(1, 3 * H, H)}
    check_op("GRU", inputs, lambda X, W, R: gru_ref(X, W, R), attrs={"hidden_size": H, "linear_before_reset": 1},
             n_outputs=2, grad=["X", "W", "R"])


def test_lstm_larger_float32_parity():
    """A size where the per-step GEMMs are real GEMMs (float32 parity only)."""
    nT, nB, nI, nH = 9, 5, 16, 24
    inputs = {"X": randn(nT, nB, nI), "W": randn(2, 4 * nH, nI, scale=0.2), "R": randn(2, 4 * nH, nH, scale=0.2),
              "B": randn(2, 8 * nH)}
    check_op("LSTM", inputs, lambda X, W, R, B: lstm_ref(X, W, R, B, direction="bidirectional"),
             attrs={"hidden_size": nH, "direction": "bidirectional"}, n_outputs=3)


@pytest.mark.parametrize("attrs, what", [({"layout": 1}, "layout"), ({"clip": 3.0}, "clip"),
                                         ({"input_forget": 1}, "input_forget")])
def test_lstm_unsupported_attributes_are_named(attrs, what):
    feeds = {"X": randn(T, B, I), "W": randn(1, 4 * H, I), "R": randn(1, 4 * H, H)}
    m = make_model("LSTM", feeds, {"hidden_size": H, **attrs}, n_outputs=1)
    with pytest.raises(_C.UnsupportedOpError, match=what):
        run(m, list(feeds.values()))


def test_lstm_bad_weight_shape_is_named():
    feeds = {"X": randn(T, B, I), "W": randn(1, 4 * H, I + 1), "R": randn(1, 4 * H, H)}
    m = make_model("LSTM", feeds, {"hidden_size": H}, n_outputs=1)
    with pytest.raises(ValueError, match=r"input 1 \(W\)"):
        run(m, list(feeds.values()))


# ---- RNN (the plain Elman cell: H_t = f(X_t W^T + H_{t-1} R^T + Wb + Rb)) -----------------------

ACT = {"Tanh": np.tanh, "Relu": lambda v: np.maximum(v, 0)}


def rnn_ref(X, W, R, B=None, initial_h=None, direction="forward", activations=("Tanh", "Tanh")):
    revs = directions(direction)
    D, nT, nB, Hh = len(revs), X.shape[0], X.shape[1], R.shape[-1]
    Y = np.zeros((nT, D, nB, Hh), X.dtype)
    Yh = np.zeros((D, nB, Hh), X.dtype)
    for d, rev in enumerate(revs):
        f = ACT[activations[d]]
        b = B[d, :Hh] + B[d, Hh:] if B is not None else 0
        h = initial_h[d] if initial_h is not None else np.zeros((nB, Hh), X.dtype)
        for t in (reversed(range(nT)) if rev else range(nT)):
            h = f(X[t] @ W[d].T + h @ R[d].T + b)
            Y[t, d] = h
        Yh[d] = h
    return Y, Yh


def rnn_inputs(D, full=True, nT=T, nB=B, nI=I, nH=H, scale=0.5):
    inputs = {"X": randn(nT, nB, nI), "W": randn(D, nH, nI, scale=scale), "R": randn(D, nH, nH, scale=scale)}
    if full:
        inputs.update({"B": randn(D, 2 * nH), "sequence_lens": None, "initial_h": randn(D, nB, nH)})
    return inputs


@pytest.mark.parametrize("direction", DIRS)
@pytest.mark.parametrize("act", ["Tanh", "Relu"])
def test_rnn(direction, act):
    D = 2 if direction == "bidirectional" else 1
    acts = [act] * D
    check_op("RNN", rnn_inputs(D),
             lambda X, W, R, B, sequence_lens, initial_h: rnn_ref(X, W, R, B, initial_h, direction, acts),
             attrs={"hidden_size": H, "direction": direction, "activations": acts}, n_outputs=2,
             grad=["X", "W", "R", "B", "initial_h"])


def test_rnn_bidirectional_with_a_different_activation_per_direction():
    acts = ["Relu", "Tanh"]
    check_op("RNN", rnn_inputs(2),
             lambda X, W, R, B, sequence_lens, initial_h: rnn_ref(X, W, R, B, initial_h, "bidirectional", acts),
             attrs={"hidden_size": H, "direction": "bidirectional", "activations": acts}, n_outputs=2,
             grad=["X", "W", "R", "B", "initial_h"])


def test_rnn_default_activation_is_tanh_and_minimal_inputs():
    """No activations attribute, no B, no initial_h; only Y_h is an output."""
    check_op("RNN", rnn_inputs(1, full=False), lambda X, W, R: (None, rnn_ref(X, W, R)[1]), attrs={"hidden_size": H},
             n_outputs=2, grad=["X", "W", "R"])


def test_rnn_one_direction_takes_the_first_of_the_onnx_default_pair():
    """ONNX's default activations list is ["Tanh", "Tanh"] whatever the direction; one direction
    given two uses the first (as onnxruntime)."""
    check_op("RNN", rnn_inputs(1, full=False), lambda X, W, R: rnn_ref(X, W, R, activations=("Relu",)),
             attrs={"hidden_size": H, "activations": ["Relu", "Tanh"]}, n_outputs=2, grad=["X", "W", "R"])


def test_rnn_full_length_sequence_lens_is_accepted():
    inputs = rnn_inputs(1)
    inputs["sequence_lens"] = np.full(B, T, np.int32)
    check_op("RNN", inputs, lambda X, W, R, B, sequence_lens, initial_h: rnn_ref(X, W, R, B, initial_h),
             attrs={"hidden_size": H}, n_outputs=2, const_inputs=("sequence_lens",),
             grad=["X", "W", "R", "B", "initial_h"])


def per_sequence(ref, lens, X, initial_h, initial_c=None, D=1):
    """ONNX's sequence_lens by the reference run on each sequence alone, cut to its length: Y is 0
    past the end, Y_h / Y_c are the state at the last valid step (the initial one for length 0)."""
    nT, nB, Hh = X.shape[0], X.shape[1], initial_h.shape[-1]
    outs = [np.zeros((nT, D, nB, Hh), X.dtype), np.zeros((D, nB, Hh), X.dtype), np.zeros((D, nB, Hh), X.dtype)]
    for b, n in enumerate(lens):
        one = ref(X[:n, b:b + 1], initial_h[:, b:b + 1], None if initial_c is None else initial_c[:, b:b + 1])
        outs[0][:n, :, b] = one[0][:, :, 0]
        for k in range(1, len(one)):
            outs[k][:, b] = one[k][:, 0]
    return outs


LENS_CASES = {"mixed": [4, 1, 3], "all_full": [4, 4, 4], "with_zero": [2, 0, 4]}


@pytest.mark.parametrize("cell", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("direction", DIRS)
@pytest.mark.parametrize("lens", list(LENS_CASES))
@pytest.mark.parametrize("lens_dtype", [np.int32, np.int64])
def test_sequence_lens_forward_and_gradients(cell, direction, lens, lens_dtype):
    """Steps past a sequence's length give Y = 0 and leave the state alone (the reverse direction
    starts at len - 1); the gradients of every input skip those steps exactly (FD in float64)."""
    if lens_dtype is np.int64 and (direction != "bidirectional" or lens != "mixed"):
        pytest.skip("int64 lengths: one case is enough")
    D, G, nT, nB = (2 if direction == "bidirectional" else 1), {"LSTM": 4, "GRU": 3, "RNN": 1}[cell], 4, 3
    L = np.array(LENS_CASES[lens], lens_dtype)
    inputs = {"X": randn(nT, nB, I), "W": randn(D, G * H, I), "R": randn(D, G * H, H), "B": randn(D, 2 * G * H),
              "sequence_lens": L, "initial_h": randn(D, nB, H)}
    attrs = {"hidden_size": H, "direction": direction}
    if cell == "LSTM":
        inputs["initial_c"] = randn(D, nB, H)
        ref = lambda X, W, R, B, sequence_lens, initial_h, initial_c: per_sequence(
            lambda x, h, c: lstm_ref(x, W, R, B, h, c, direction), L, X, initial_h, initial_c, D)
    elif cell == "GRU":
        attrs["linear_before_reset"] = 1 if direction != "reverse" else 0
        lbr = attrs["linear_before_reset"]
        ref = lambda X, W, R, B, sequence_lens, initial_h: per_sequence(
            lambda x, h, c: gru_ref(x, W, R, B, h, direction, lbr), L, X, initial_h, None, D)[:2]
    else:
        ref = lambda X, W, R, B, sequence_lens, initial_h: per_sequence(
            lambda x, h, c: rnn_ref(x, W, R, B, h, direction), L, X, initial_h, None, D)[:2]
    grad = [k for k in inputs if k != "sequence_lens"]
    check_op(cell, inputs, ref, attrs=attrs, n_outputs=3 if cell == "LSTM" else 2, const_inputs=("sequence_lens",),
             grad=grad)


def test_sequence_lens_out_of_range_is_refused():
    inputs = rnn_inputs(1)
    inputs["sequence_lens"] = np.array([T, T + 1], np.int32)
    feeds = {k: v for k, v in inputs.items() if v is not None and k != "sequence_lens"}
    m = make_model("RNN", inputs, {"hidden_size": H}, n_outputs=2, const_inputs=("sequence_lens",))
    with pytest.raises(Exception, match="sequence_lens"):
        run(m, list(feeds.values()))


def test_rnn_relu_gradient_at_the_kink_is_zero():
    """relu'(0) = 0, as in torch: a hidden unit whose pre-activation is exactly 0 at every step
    (its rows of W and R and its biases zero) passes no gradient to its weights or inputs."""
    inputs = rnn_inputs(1)
    for k in ("W", "R"):
        inputs[k][0, 1] = 0
    inputs["B"][0, [1, H + 1]] = 0
    x64 = {k: (None if v is None else v.astype(np.float64)) for k, v in inputs.items()}
    feeds = [x64[k] for k in ("X", "W", "R", "B", "initial_h")]
    m = make_model("RNN", x64, {"hidden_size": H, "activations": ["Relu"]}, n_outputs=2)
    outs, grads, dys = run(m, feeds, grad=[True] * 5)
    assert np.all(outs[0][:, 0, :, 1] == 0)
    dX, dW, dR, dB, dh0 = grads
    assert np.all(dW[0, 1] == 0) and np.all(dR[0, 1] == 0) and dB[0, 1] == 0 and dB[0, H + 1] == 0
    # and the rest of the gradient is torch's
    import torch
    t = [torch.tensor(f, requires_grad=True) for f in feeds]
    X, W, R, Bb, h0 = t
    h, ys = h0[0], []
    for step in range(T):
        h = torch.relu(X[step] @ W[0].T + h @ R[0].T + Bb[0, :H] + Bb[0, H:])
        ys.append(h)
    Y = torch.stack(ys)[:, None]
    loss = (Y * torch.from_numpy(dys[0])).sum() + (h[None] * torch.from_numpy(dys[1])).sum()
    loss.backward()
    for name, ours, ref in zip(("X", "W", "R", "B", "initial_h"), grads, t):
        np.testing.assert_allclose(ours, ref.grad.numpy(), rtol=1e-12, atol=1e-12, err_msg=f"d{name}")


def test_rnn_larger_float32_parity():
    """A size where the per-step GEMMs are real GEMMs (float32 parity only)."""
    acts = ["Relu", "Relu"]
    check_op("RNN", rnn_inputs(2, nT=9, nB=5, nI=16, nH=24, scale=0.2),
             lambda X, W, R, B, sequence_lens, initial_h: rnn_ref(X, W, R, B, initial_h, "bidirectional", acts),
             attrs={"hidden_size": 24, "direction": "bidirectional", "activations": acts}, n_outputs=2)


@pytest.mark.parametrize("attrs, what", [
    ({"layout": 1}, "attribute 'layout' = 1"), ({"clip": 3.0}, "attribute 'clip' is not implemented"),
    ({"activations": ["Sigmoid"]}, "attribute 'activations' = \\[..., 'Sigmoid', ...\\] is not implemented"),
    ({"activations": ["LeakyRelu"], "activation_alpha": [0.1]}, "attribute 'activation"),
    ({"activation_beta": [0.5]}, "attribute 'activation_beta' is not implemented")])
def test_rnn_unsupported_attributes_are_named(attrs, what):
    feeds = {"X": randn(T, B, I), "W": randn(1, H, I), "R": randn(1, H, H)}
    m = make_model("RNN", feeds, {"hidden_size": H, **attrs}, n_outputs=1)
    with pytest.raises(_C.UnsupportedOpError, match=what):
        run(m, list(feeds.values()))


def test_rnn_activations_count_must_match_the_directions():
    feeds = {"X": randn(T, B, I), "W": randn(2, H, I), "R": randn(2, H, H)}
    m = make_model("RNN", feeds, {"hidden_size": H, "direction": "bidirectional", "activations": ["Tanh"]},
                   n_outputs=1)
    with pytest.raises(ValueError, match="activations lists 1 functions, expected 2"):
        run(m, list(feeds.values()))


def test_gru_activations_are_refused_by_name():
    feeds = {"X": randn(T, B, I), "W": randn(1, 3 * H, I), "R": randn(1, 3 * H, H)}
    m = make_model("GRU", feeds, {"hidden_size": H, "activations": ["Sigmoid", "Tanh"]}, n_outputs=1)
    with pytest.raises(_C.UnsupportedOpError, match="attribute 'activations' is not implemented"):
        run(m, list(feeds.values()))
