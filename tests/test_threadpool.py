"""The engine's thread pool: kernels give the same answers on 1 and on several threads, the
thread count follows om_set_num_threads, and nested / concurrent use neither deadlocks nor
oversubscribes. Large inputs (above the pool's 32K-element grain) so that the threaded
paths really run; the references are numpy."""
import ctypes
import threading

import numpy as np
import pytest

from ortmod import _C
from oputil import make_model, run

LIB = ctypes.CDLL(_C.__file__)
LIB.om_set_num_threads.argtypes = [ctypes.c_int]
LIB.om_get_num_threads.restype = ctypes.c_int


@pytest.fixture
def threads():
    """Yields a setter; restores the default thread count afterwards."""
    yield LIB.om_set_num_threads
    LIB.om_set_num_threads(0)


def _softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


CASES = {
    "Add": (lambda r: {"a": r.standard_normal((96, 1024), dtype=np.float32),
                       "b": r.standard_normal((1024,), dtype=np.float32)}, {}, 1,
            lambda f: [f["a"] + f["b"]]),
    "Mul": (lambda r: {"a": r.standard_normal((300, 700), dtype=np.float32),
                       "b": r.standard_normal((300, 700), dtype=np.float32)}, {}, 1,
            lambda f: [f["a"] * f["b"]]),
    "Tanh": (lambda r: {"x": r.standard_normal((200, 1000), dtype=np.float32)}, {}, 1,
             lambda f: [np.tanh(f["x"])]),
    "Softmax": (lambda r: {"x": r.standard_normal((512, 300), dtype=np.float32)}, {"axis": -1}, 1,
                lambda f: [_softmax(f["x"])]),
    "LayerNormalization": (lambda r: {"x": r.standard_normal((512, 256), dtype=np.float32),
                                      "s": r.standard_normal((256,), dtype=np.float32),
                                      "b": r.standard_normal((256,), dtype=np.float32)}, {"axis": -1}, 1,
                           lambda f: [(f["x"] - f["x"].mean(-1, keepdims=True)) /
                                      np.sqrt(f["x"].var(-1, keepdims=True) + 1e-5) * f["s"] + f["b"]]),
}


@pytest.mark.parametrize("op", sorted(CASES))
def test_threaded_matches_serial_and_reference(op, threads):
    make, attrs, n_out, ref = CASES[op]
    feeds = make(np.random.default_rng(0))
    model = make_model(op, feeds, attrs=attrs, n_outputs=n_out)
    threads(1)
    serial, _, _ = run(model, list(feeds.values()))
    threads(4)
    par, _, _ = run(model, list(feeds.values()))
    for s, p, r in zip(serial, par, ref(feeds)):
        np.testing.assert_array_equal(s, p)                       # bitwise: same ranges, same order
        np.testing.assert_allclose(p, r, rtol=2e-5, atol=2e-5)


def test_softmax_cross_entropy_loss_threaded(threads):
    r = np.random.default_rng(1)
    x = r.standard_normal((2048, 500), dtype=np.float32)
    y = r.integers(0, 500, (2048,)).astype(np.int64)
    model = make_model("SoftmaxCrossEntropyLoss", {"x": x, "y": y}, attrs={"reduction": "mean"})
    outs = []
    for t in (1, 3):
        threads(t)
        (loss,), (dx, _), _ = run(model, [x, y], grad=[True, False])
        outs.append((loss, dx))
    lp = x - x.max(1, keepdims=True)
    lp = lp - np.log(np.exp(lp).sum(1, keepdims=True))
    np.testing.assert_allclose(outs[1][0], -lp[np.arange(2048), y].mean(), rtol=1e-5)
    np.testing.assert_array_equal(outs[0][1], outs[1][1])
    # the loss sums per-range partials: equal on any thread count up to rounding
    np.testing.assert_allclose(outs[0][0], outs[1][0], rtol=1e-6)


def test_thread_count_follows_setter(threads):
    default = LIB.om_get_num_threads()
    assert default >= 1
    threads(3)
    assert LIB.om_get_num_threads() == 3
    threads(0)
    assert LIB.om_get_num_threads() == default


def test_concurrent_callers_are_safe(threads):
    """Two Python threads running kernels at once (the GIL is released in kernels): the
    second caller runs serially instead of waiting or corrupting the first's job."""
    threads(4)
    r = np.random.default_rng(2)
    a = r.standard_normal((256, 1024), dtype=np.float32)
    b = r.standard_normal((256, 1024), dtype=np.float32)
    model = make_model("Add", {"a": a, "b": b})
    want = a + b
    errors = []

    def work():
        try:
            for _ in range(30):
                (o,), _, _ = run(model, [a, b])
                np.testing.assert_array_equal(o, want)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    ts = [threading.Thread(target=work) for _ in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors[0]


def test_resizing_between_kernels(threads):
    """Workers are stopped and restarted when the count shrinks; a worker that starts late
    (a loaded machine) must still see the shutdown — this loop hung once."""
    r = np.random.default_rng(3)
    a = r.standard_normal((128, 1024), dtype=np.float32)
    model = make_model("Relu", {"a": a})
    want = np.maximum(a, 0)
    for i in range(40):
        threads(4 if i % 2 == 0 else 2)
        (o,), _, _ = run(model, [a])
        np.testing.assert_array_equal(o, want)
