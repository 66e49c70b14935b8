"""LSTM and GRU (ONNX semantics, layout 0): float32 parity against a numpy transcription of
the ONNX equations and float64 finite-difference checks of BPTT (LSTMGrad / GRUGrad) for
every differentiable input — X, W, R, B, initial_h, initial_c — in each direction."""
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
