"""The emulator's own checks (harness.py's "selftest" group): a test that cannot fail proves
nothing, so this group shows that each layer can.

- The 16-bit conversions and arithmetic the kernels use (emu_half.h) against numpy's and
  torch's round-to-nearest-even, over every fp16/bf16 bit pattern and the float values that
  separate correct rounding from near misses (ties, ties +- one ulp, subnormals, overflow).
- Deliberately broken kernels (selftest.cu): a write past the end, a barrier half the block
  skips, a full shuffle mask in a partial warp, a read of freed memory, a copy past the end of
  an allocation; each must be reported, and a correct reduction must not be. A read of another
  thread's shared slot without the barrier must come out wrong (in-order execution would hide it).
- wmma (include/mma.h): a one-warp tiled GEMM in fp16 and bf16, over every layout of A, B and
  the accumulator, with and without an accumulator loaded from memory, through __shared__ and
  device memory, matches numpy within float rounding; a misaligned pointer (device and
  __shared__), an ldm that is not a multiple of 16 bytes, a call half the warp skips or meets at
  a __syncwarp instead, a lane-dependent fragment and a partial warp are each reported.
- The comparisons: a result or gradient perturbed slightly beyond tolerance must fail the
  op, half-precision and model comparisons.
- The "streams" group's step check (models.steps_stay_on_stream): a stream synchronization or
  work on the legacy default stream inside a step must fail it, and work enqueued on a stream
  cudaStreamCreate never made must be reported.
"""
import numpy as np
import torch

# ---- 16-bit conversions ------------------------------------------------------------------------


def _convert(h, kind, src, out_dtype):
    src = np.ascontiguousarray(src)
    out = np.empty(src.shape[0], out_dtype)
    h.LIB.emu_convert(kind, src.ctypes.data, out.ctypes.data, out.shape[0])
    return out


def _isnan(a, fmt):
    if fmt == "f16":
        return np.isnan(a.view(np.float16))
    if fmt == "bf16":
        return (a & 0x7fff) > 0x7f80
    return np.isnan(a)


def _same_bits(got, want, what, fmt):
    """Equal bit patterns, any NaN matching any NaN (fmt: f16, bf16 or f32)."""
    nan_got, nan_want = _isnan(got, fmt), _isnan(want, fmt)
    differ = got.view(np.uint8).reshape(len(got), -1) != want.view(np.uint8).reshape(len(want), -1)
    bad = np.flatnonzero((nan_got != nan_want) | (~nan_want & differ.any(1)))
    assert bad.size == 0, f"{what}: {bad.size} values differ, first at {bad[0]}: got {got[bad[0]]!r}, want {want[bad[0]]!r}"


@np.errstate(over="ignore")
def _hard_floats(neighbours_f32):
    """Values between consecutive representable 16-bit values: the midpoints (ties), a float32
    ulp to either side, plus random floats over the whole exponent range and the specials."""
    a = neighbours_f32.astype(np.float64)
    mids = ((a[:-1] + a[1:]) / 2).astype(np.float32)
    ups = np.nextafter(mids, np.float32(np.inf))
    downs = np.nextafter(mids, np.float32(-np.inf))
    rng = np.random.default_rng(1)
    rand = (rng.standard_normal(20000) * np.exp2(rng.uniform(-140, 130, 20000))).astype(np.float32)
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 65504, 65519.99, 65520, 1e-8, 6e-8, 3e38, -3.4e38],
                        np.float32)
    vals = np.concatenate([neighbours_f32, mids, ups, downs, rand, specials]).astype(np.float32)
    return vals[np.isfinite(vals) | np.isinf(vals) | np.isnan(vals)]


@np.errstate(over="ignore")
def fp16_conversions(h):
    bits = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    want = bits.view(np.float16).astype(np.float32)
    _same_bits(_convert(h, 0, bits, np.float32), want, "fp16 -> float", "f32")
    finite = want[np.isfinite(want)]
    vals = _hard_floats(np.unique(finite[finite >= 0]))
    vals = np.concatenate([vals, -vals])
    _same_bits(_convert(h, 1, vals, np.uint16), vals.astype(np.float16).view(np.uint16), "float -> fp16", "f16")
    # double -> fp16 must round once: just above a tie in double, float rounding would land on the tie
    d = np.concatenate([vals.astype(np.float64), ((finite[:-1].astype(np.float64) + finite[1:]) / 2) * (1 + 2.0 ** -40)])
    _same_bits(_convert(h, 4, d, np.uint16), d.astype(np.float16).view(np.uint16), "double -> fp16", "f16")


def _bf16_of_f64(d):
    """Round-to-nearest-even of doubles (within float's normal range) to bf16 bits."""
    u = d.view(np.uint64)
    lsb = (u >> np.uint64(45)) & np.uint64(1)
    r = (u + np.uint64((1 << 44) - 1) + lsb) & ~np.uint64((1 << 45) - 1)
    return r.view(np.float64).astype(np.float32).view(np.uint32).__rshift__(16).astype(np.uint16)


def bf16_conversions(h):
    bits = np.arange(65536, dtype=np.uint32)
    want = (bits << 16).view(np.float32)
    _same_bits(_convert(h, 2, bits.astype(np.uint16), np.float32), want, "bf16 -> float", "f32")
    finite = want[np.isfinite(want)]
    vals = _hard_floats(np.unique(finite[finite >= 0]))
    vals = np.concatenate([vals, -vals])
    ref = torch.from_numpy(vals).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    _same_bits(_convert(h, 3, vals, np.uint16), ref, "float -> bf16", "bf16")
    normal = finite[(np.abs(finite) >= 2.0 ** -126) & (np.abs(finite) < 2.0 ** 127)].astype(np.float64)
    normal = np.unique(normal[normal > 0])
    d = np.concatenate([normal, ((normal[:-1] + normal[1:]) / 2) * (1 + 2.0 ** -40)])
    d = np.concatenate([d, -d])
    _same_bits(_convert(h, 5, d, np.uint16), _bf16_of_f64(d), "double -> bf16", "bf16")


@np.errstate(over="ignore")
def fp16_addition(h):
    rng = np.random.default_rng(2)
    bits = rng.integers(0, 65536, (50000, 2)).astype(np.uint16)
    a, b = bits[:, 0].view(np.float16), bits[:, 1].view(np.float16)
    keep = np.isfinite(a) & np.isfinite(b)
    bits = np.ascontiguousarray(bits[keep])
    want = (a[keep].astype(np.float64) + b[keep].astype(np.float64)).astype(np.float16)   # exact sum, one rounding
    _same_bits(_convert(h, 6, bits, np.uint16), want.view(np.uint16), "fp16 a + b", "f16")

# ---- the emulator's checks fire --------------------------------------------------------------


def expect_reported(h, which, needle):
    rc = h.LIB.emu_selftest(which)
    log = h.take_emulator_errors()
    if needle is None:
        assert rc == 0 and not log, f"a correct kernel was rejected (rc {rc}): {log}"
    else:
        assert rc != 0, f"broken kernel {which} launched without an error"
        assert needle in log, f"broken kernel {which}: expected a report containing {needle!r}, got {log!r}"

# ---- wmma ------------------------------------------------------------------------------------------


def _sixteen_bit(x, kind):
    """(bits, values): x (float32) rounded to fp16 (kind 0) or bf16 (1), as uint16 and float64."""
    if kind == 0:
        h = x.astype(np.float16)
        return np.ascontiguousarray(h.view(np.uint16)), h.astype(np.float64)
    t = torch.from_numpy(x).to(torch.bfloat16)
    return np.ascontiguousarray(t.view(torch.int16).numpy().view(np.uint16)), t.to(torch.float64).numpy()


def wmma_matches_numpy(h):
    """selftest.cu's wmma_gemm: D = 2 (A B + C) and A's row sums, for fp16 and bf16, every
    layout of A, B and the accumulator, with C loaded or the accumulator filled with 0. Products
    of 16-bit values are exact in float; the 49 float additions each round: the error bound."""
    import ctypes
    h.LIB.emu_selftest_wmma.argtypes = [ctypes.c_int, ctypes.c_int] + [ctypes.c_void_p] * 5
    rng = np.random.default_rng(4)
    for kind, name in ((0, "fp16"), (1, "bf16")):
        a_bits, a = _sixteen_bit(rng.standard_normal((32, 48)).astype(np.float32), kind)
        b_bits, b = _sixteen_bit(rng.standard_normal((48, 32)).astype(np.float32), kind)
        b_cm = np.ascontiguousarray(b_bits.T)   # column-major B
        c = rng.standard_normal((32, 32)).astype(np.float32)
        for layouts in range(8):
            for with_c in (True, False):
                what = f"{name} wmma GEMM, layouts {layouts}, {'C loaded' if with_c else 'C = 0'}"
                d = np.full((32, 32), np.nan, np.float32)
                rowsum = np.full((32, 16), np.nan, np.float32)
                rc = h.LIB.emu_selftest_wmma(kind, layouts, a_bits.ctypes.data, b_cm.ctypes.data,
                                             c.ctypes.data if with_c else None, d.ctypes.data, rowsum.ctypes.data)
                log = h.take_emulator_errors()
                assert rc == 0 and not log, f"{what}: rejected (rc {rc}): {log}"
                c64 = c.astype(np.float64) if with_c else np.zeros((32, 32))
                want = 2 * (a @ b + c64)
                bound = 2 * (np.abs(a) @ np.abs(b) + np.abs(c64)) * 64 * 2.0 ** -24
                err = np.abs(d - want)
                assert (err <= bound).all(), f"{what}: off by {err.max()} (bound {bound[err.argmax() // 32, err.argmax() % 32]})"
                want_rows = np.repeat(a.sum(1, keepdims=True), 16, 1)
                bound_rows = np.repeat(np.abs(a).sum(1, keepdims=True), 16, 1) * 64 * 2.0 ** -24
                assert (np.abs(rowsum - want_rows) <= bound_rows).all(), f"{what}: row sums off"

# ---- a wrong result fails the comparison -------------------------------------------------------


def _nudge(a, rel=1e-2):
    a = np.array(a, copy=True)
    a.flat[a.size // 2] += rel * (1 + abs(float(a.flat[a.size // 2])))
    return a


def _expect_assertion(run, what):
    try:
        run()
    except AssertionError:
        return
    raise AssertionError(f"{what}: a perturbed reference went undetected")


def missing_barrier_shows(h):
    """The shuffled thread order makes a missing __syncthreads visible that in-order execution hides."""
    stale = h.LIB.emu_selftest(6)
    assert stale > 0, f"a read of a neighbour's shared slot without a barrier looked right ({stale})"
    assert h.LIB.emu_selftest(7) == 0, "with the barrier, some thread still read a stale value"


def wrong_op_result_detected(h):
    M = h.ops_module()
    real = M.run_both

    def perturbed_output(*a, **k):
        oc, og, gc, gg = real(*a, **k)
        return [_nudge(oc[0])] + oc[1:], og, gc, gg

    def perturbed_gradient(*a, **k):
        oc, og, gc, gg = real(*a, **k)
        return oc, og, [_nudge(gc[0])] + gc[1:], gg

    M.check("Softmax", {"x": M.f32(3, 7)}, None, "", ("x",))   # passes as it is
    try:
        for fake, what in ((perturbed_output, "op output"), (perturbed_gradient, "op gradient")):
            M.run_both = fake
            _expect_assertion(lambda: M.check("Softmax", {"x": M.f32(3, 7)}, None, "", ("x",)), what)
    finally:
        M.run_both = real


def wrong_half_result_detected(h):
    H = h.half_module()
    real = H.run_pair

    def perturbed_gradient(*a, **k):
        oc, og, gc, gg = real(*a, **k)
        return oc, og, [torch.from_numpy(_nudge(gc[0].numpy(), 0.1))] + gc[1:], gg

    H.check("Tanh", {"x": H.f32(4, 5)}, torch.bfloat16, None, "", ("x",))
    try:
        H.run_pair = perturbed_gradient
        _expect_assertion(lambda: H.check("Tanh", {"x": H.f32(4, 5)}, torch.bfloat16, None, "", ("x",)),
                          "bf16 gradient")
    finally:
        H.run_pair = real


def wrong_model_gradient_detected(h):
    import models
    mlp = models.small_mlp()
    models.run_and_compare(mlp, h)

    def nudge_last_gradient(cpu):
        grads = cpu[1]
        i = max(k for k, g in enumerate(grads) if g is not None)
        grads[i] = _nudge(grads[i])

    _expect_assertion(lambda: models.run_and_compare(mlp, h, perturb=nudge_last_gradient), "model gradient")


def wrong_half_model_gradient_detected(h):
    """The bf16/fp16 whole-model comparison (cosine and relative error per gradient)."""
    import models
    rng = np.random.default_rng(3)
    ref = [rng.standard_normal((8, 5)), None, rng.standard_normal(7)]
    names = ["w", "frozen", "b"]
    close = [r if r is None else r * (1 + 1e-3 * rng.standard_normal(r.shape)) for r in ref]
    models.compare_directions(ref, close, names)
    off = list(close)
    off[2] = off[2] * 1.2   # right direction, 20% too large
    _expect_assertion(lambda: models.compare_directions(ref, off, names), "half model gradient size")
    turned = list(close)
    turned[0] = turned[0] + 0.3 * rng.standard_normal(turned[0].shape) * np.abs(turned[0]).mean()
    _expect_assertion(lambda: models.compare_directions(ref, turned, names), "half model gradient direction")


# ---- a step that blocks the host or leaves its stream fails ------------------------------------


def _expect_assertion_saying(run, needle, what):
    try:
        run()
    except AssertionError as e:
        assert needle in str(e), f"{what}: failed for another reason: {e}"
        return
    raise AssertionError(f"{what}: went undetected")


def step_sync_detected(h):
    import ctypes
    import models
    mlp = models.small_mlp()
    models.steps_stay_on_stream(mlp, h, steps=1)
    h.LIB.cudaStreamSynchronize.argtypes = [ctypes.c_void_p]
    _expect_assertion_saying(
        lambda: models.steps_stay_on_stream(mlp, h, steps=1, during_step=lambda s: h.LIB.cudaStreamSynchronize(s)),
        "cudaStreamSynchronize", "a stream synchronization inside a step")


def step_off_stream_detected(h):
    import ctypes
    import models
    scratch = h.to_device(np.zeros(16, np.float32))
    h.LIB.cudaMemset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
    _expect_assertion_saying(
        lambda: models.steps_stay_on_stream(models.small_mlp(), h, steps=1,
                                            during_step=lambda s: h.LIB.cudaMemset(scratch.ptr, 0, 64)),
        "not on the given stream", "a memset on the legacy default stream inside a step")


def uncreated_stream_reported(h):
    import models
    from ortmod import _C
    onnx_bytes, arrays, flags, _ = models.small_mlp()
    eng = _C.Engine(onnx_bytes, flags, seed=7)
    eng.forward([h.to_device(a) for a in arrays], True, 0)   # planned on the default stream
    try:
        eng.forward([h.to_device(a) for a in arrays], True, 0x5000)
    except Exception:   # noqa: BLE001 - cuBLAS refuses the stream: the provider may fail the call
        pass
    log = h.take_emulator_errors()
    assert "which cudaStreamCreate did not create" in log, f"work on a stream nobody created went unreported: {log!r}"


def cases(h):
    yield "fp16-conversions", lambda: fp16_conversions(h)
    yield "bf16-conversions", lambda: bf16_conversions(h)
    yield "fp16-addition-rounds-once", lambda: fp16_addition(h)
    yield "correct-kernel-accepted", lambda: expect_reported(h, 0, None)
    yield "detects-write-past-the-end", lambda: expect_reported(h, 1, "past the end of a 4000-byte device allocation")
    yield "detects-barrier-after-early-return", lambda: expect_reported(h, 2, "deadlock")
    yield "detects-full-mask-in-partial-warp", lambda: expect_reported(h, 3, "names lanes that do not exist")
    yield "detects-use-after-free", lambda: expect_reported(h, 4, "use after free")
    yield "detects-copy-past-the-end", lambda: expect_reported(h, 5, "not inside one device allocation")
    yield "shows-missing-barrier", lambda: missing_barrier_shows(h)
    yield "wmma-matches-numpy", lambda: wmma_matches_numpy(h)
    yield "detects-wmma-misaligned-pointer", lambda: expect_reported(
        h, 8, "is not 32-byte (256-bit) aligned: it is byte 16 of its device allocation")
    yield "detects-wmma-bad-ldm", lambda: expect_reported(h, 9, "ldm 20 is not a multiple of 8")
    yield "detects-wmma-in-half-a-warp", lambda: expect_reported(h, 10, "deadlock")
    yield "detects-wmma-against-a-syncwarp", lambda: expect_reported(h, 11, "is not in this warp-collective call")
    yield "detects-wmma-lane-dependent-fragment", lambda: expect_reported(h, 12, "hold different values in the fragment")
    yield "detects-wmma-misaligned-shared", lambda: expect_reported(h, 13, "aligned (a __shared__ array needs __align__(32))")
    yield "detects-wmma-partial-warp", lambda: expect_reported(h, 14, "in a warp of 16 lanes")
    yield "detects-wrong-op-result", lambda: wrong_op_result_detected(h)
    yield "detects-wrong-half-result", lambda: wrong_half_result_detected(h)
    yield "detects-wrong-model-gradient", lambda: wrong_model_gradient_detected(h)
    yield "detects-wrong-half-model-gradient", lambda: wrong_half_model_gradient_detected(h)
    yield "detects-sync-inside-a-step", lambda: step_sync_detected(h)
    yield "detects-work-off-the-stream", lambda: step_off_stream_detected(h)
    yield "reports-an-uncreated-stream", lambda: uncreated_stream_reported(h)
