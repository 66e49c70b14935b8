"""The child process of tests/test_cuda_emulated.py: runs one group of cases on the emulated CUDA
provider and writes one JSON line per case to RESULTS.

    ORTMOD_CUDA_LIBRARY=build/cuda-emu/libortmod_cuda_emu.so python tests/cuda_emu/harness.py GROUP RESULTS

The engine sees kDLCUDA tensors whose data lives in the emulator's device memory (allocated
and filled through the emulated cudaMalloc/cudaMemcpy, as torch's .cuda() would), so it plans
and runs them on the CUDA provider: the real cuda/*.cu code, run on the CPU. Results are
read back with cudaMemcpy and compared with the CPU provider, using the GPU test modules' own
case lists and comparison functions (tests/gpu/test_ops_cuda.py, tests/gpu/test_half_cuda.py)
with their device plumbing replaced by this file's. A case fails on a mismatch, an exception,
or anything the emulator logged while it ran (emu_take_errors), even when the provider
handled the error.

Groups: selftest (the emulator's own checks, and that a wrong result is detected), ops-fp32,
ops-fp64, half (bf16/fp16 on CUDA against the CPU in fp32), models (whole training steps, fp32
against the CPU, and GPT-2 in bf16/fp16 against the CPU in fp32), zoo (tests/test_model_zoo.py's
architectures, one training step each against the CPU; ORTMOD_EMU_ZOO=all for all 38), streams (training steps after
a warm-up make no host-blocking call and enqueue everything on the stream they are given).
"""
import ctypes
import faulthandler
import functools
import json
import os
import sys
import time
import traceback

faulthandler.enable()   # before the emulator installs its fault handler, which chains to this one

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests"), os.path.join(ROOT, "tests", "gpu")]

import numpy as np  # noqa: E402
import torch  # noqa: E402

from ortmod import _C  # noqa: E402
from oputil import _Cap, make_model  # noqa: E402

# ---- the emulated device ----------------------------------------------------------------------

KDL_CUDA = 2
H2D, D2H = 1, 2
DL_TYPES = {  # torch dtype -> DLPack (code, bits)
    torch.float32: (2, 32), torch.float64: (2, 64), torch.float16: (2, 16), torch.bfloat16: (4, 16),
    torch.int64: (0, 64), torch.int32: (0, 32), torch.int8: (0, 8), torch.uint8: (1, 8), torch.bool: (6, 8),
}
TORCH_TYPES = {v: k for k, v in DL_TYPES.items()}


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int), ("device_id", ctypes.c_int),
                ("ndim", ctypes.c_int), ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.c_void_p), ("byte_offset", ctypes.c_uint64)]


class _DLManaged(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_capsule_ptr = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_ptr.restype = ctypes.c_void_p
_capsule_ptr.argtypes = [ctypes.py_object, ctypes.c_char_p]

LIB = ctypes.CDLL(os.environ["ORTMOD_CUDA_LIBRARY"])   # the same object the engine dlopens
LIB.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
LIB.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
LIB.emu_take_errors.restype = ctypes.c_char_p
LIB.emu_launch_count.restype = ctypes.c_ulonglong
LIB.emu_convert.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
LIB.emu_selftest.argtypes = [ctypes.c_int]
LIB.cudaFree.argtypes = [ctypes.c_void_p]
LIB.cudaStreamCreate.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
LIB.emu_take_counters.restype = ctypes.c_char_p
LIB.om_cuda_sync_count.restype = ctypes.c_uint64


def take_emulator_errors():
    return LIB.emu_take_errors().decode()


def take_counters():
    """What the emulator counted since the previous call (and resets it): {"syncs": {call: n},
    "streams": {stream as int: {operation: n}}} (emu.cpp's emu_take_counters)."""
    c = json.loads(LIB.emu_take_counters().decode())
    c["streams"] = {int(k): v for k, v in c["streams"].items()}
    return c


class BlockingCalls:
    """Host-blocking calls over the stretches between construction/resume() and pause(), as the
    emulator counts them (emulator: {call: n}) and as the provider counts its own (provider:
    om_cuda_sync_count, what tests/gpu/bench_gpt2.py reports on a GPU). The harness's own
    uploads and reads belong outside those stretches."""

    def __init__(self):
        self.emulator, self.provider = {}, 0
        self.resume()

    def resume(self):
        take_counters()
        self._start = LIB.om_cuda_sync_count()

    def pause(self):
        self.provider += LIB.om_cuda_sync_count() - self._start
        for k, v in take_counters()["syncs"].items():
            self.emulator[k] = self.emulator.get(k, 0) + v


def create_stream():
    """A stream handle (an int, as torch's Stream.cuda_stream) from the emulated cudaStreamCreate."""
    s = ctypes.c_void_p()
    if LIB.cudaStreamCreate(ctypes.byref(s)) != 0 or not s.value:
        raise RuntimeError("emulated cudaStreamCreate failed")
    return s.value


_KEEP = []   # the engine keeps the DLManagedTensor of an input (stash) beyond the call


def free_device_tensors():
    """Frees what the last case copied to the device (its engines are gone by then)."""
    for t in _KEEP:
        LIB.cudaFree(ctypes.c_void_p(t.ptr))
    _KEEP.clear()


class DeviceTensor:
    """A kDLCUDA DLPack tensor in emulated device memory, holding a copy of a CPU tensor."""

    def __init__(self, t):
        if isinstance(t, (np.ndarray, np.generic)):
            t = torch.from_numpy(np.require(np.asarray(t), requirements="C"))
        t = t.contiguous()
        self.dtype, self.shape = t.dtype, tuple(t.shape)
        raw = t.reshape(-1).view(torch.uint8).numpy() if t.numel() else np.zeros(0, np.uint8)
        ptr = ctypes.c_void_p()
        if LIB.cudaMalloc(ctypes.byref(ptr), max(raw.nbytes, 1)) != 0:
            raise MemoryError("emulated cudaMalloc failed")
        if raw.nbytes and LIB.cudaMemcpy(ptr, raw.ctypes.data, raw.nbytes, H2D) != 0:
            raise RuntimeError("emulated cudaMemcpy (host to device) failed")
        self.ptr = ptr.value
        self._shape = (ctypes.c_int64 * max(1, len(self.shape)))(*self.shape)
        _KEEP.append(self)

    def __dlpack_device__(self):
        return (KDL_CUDA, 0)

    def __dlpack__(self, **kwargs):
        code, bits = DL_TYPES[self.dtype]
        self._mt = _DLManaged()
        self._mt.dl_tensor = _DLTensor(self.ptr, KDL_CUDA, 0, len(self.shape), _DLDataType(code, bits, 1),
                                       self._shape, None, 0)
        return _capsule_new(ctypes.addressof(self._mt), b"dltensor", None)


def to_device(t):
    return DeviceTensor(t)


def from_device(cap):
    """A CPU torch tensor with the contents of the engine's kDLCUDA output capsule."""
    mt = _DLManaged.from_address(_capsule_ptr(cap, b"dltensor"))
    t = mt.dl_tensor
    assert t.device_type == KDL_CUDA, f"the provider returned a tensor on device type {t.device_type}"
    shape = tuple(t.shape[i] for i in range(t.ndim))
    dtype = TORCH_TYPES[(t.dtype.code, t.dtype.bits)]
    out = torch.empty(shape, dtype=dtype)
    n = out.numel() * out.element_size()
    if n and LIB.cudaMemcpy(out.data_ptr(), t.data + t.byte_offset, n, D2H) != 0:
        raise RuntimeError("emulated cudaMemcpy (device to host) failed: " + take_emulator_errors())
    return out


def _device_tensor_of(cap):
    t = _DLManaged.from_address(_capsule_ptr(cap, b"dltensor")).dl_tensor
    assert t.device_type == KDL_CUDA, f"the provider passed a tensor on device type {t.device_type}"
    return t, tuple(t.shape[i] for i in range(t.ndim)), TORCH_TYPES[(t.dtype.code, t.dtype.bits)]


def empty_like_device(cap):
    """An uninitialized CPU torch tensor of a kDLCUDA capsule's shape and dtype (its contents unread)."""
    _, shape, dtype = _device_tensor_of(cap)
    return torch.empty(shape, dtype=dtype)


def into_device(cap, t):
    """Copies CPU tensor t into the emulated device memory of a kDLCUDA capsule of its shape and dtype."""
    d, shape, dtype = _device_tensor_of(cap)
    assert (shape, dtype) == (tuple(t.shape), t.dtype), f"{tuple(t.shape)} {t.dtype} into {shape} {dtype}"
    t = t.contiguous()
    n = t.numel() * t.element_size()
    if n and LIB.cudaMemcpy(d.data + d.byte_offset, t.data_ptr(), n, H2D) != 0:
        raise RuntimeError("emulated cudaMemcpy (host to device) failed: " + take_emulator_errors())


def cpu_out(cap):
    return torch.from_dlpack(_Cap(cap)).clone()

# ---- the GPU test modules with their device plumbing replaced ---------------------------------


_DY_RNG = np.random.default_rng(0)   # output gradients, drawn in case order as test_ops_cuda's R


def emu_run_both(op, inputs, attrs=None, domain="", grad=(), n_outputs=1, const_inputs=(), dtype=None,
                 training=True):
    """tests/gpu/test_ops_cuda.run_both: the same model on the CPU and on the emulated GPU."""
    rng = _DY_RNG
    model = make_model(op, inputs, attrs, domain, 20, n_outputs, const_inputs)
    names = [n for n, a in inputs.items() if a is not None and n not in const_inputs]
    flags = [n in grad for n in names]
    feeds = [np.ascontiguousarray(inputs[n]) for n in names]
    ecpu = _C.Engine(model, flags if any(flags) else None, seed=3)
    caps, stash = ecpu.forward(feeds, training)
    outs_cpu = [cpu_out(c).numpy() for c in caps]
    dys = [rng.standard_normal(o.shape).astype(o.dtype) if np.issubdtype(o.dtype, np.floating) else None
           for o in outs_cpu]
    dys = [d if diff else None for d, diff in zip(dys, ecpu.output_differentiable)]
    grads_cpu = None
    if stash is not None:
        g = ecpu.backward(stash, dys)
        grads_cpu = [None if c is None else cpu_out(c).numpy() for c in g]
    egpu = _C.Engine(model, flags if any(flags) else None, seed=3)
    caps, stash = egpu.forward([to_device(f) for f in feeds], training, 0)
    outs_gpu = [from_device(c).numpy() for c in caps]
    grads_gpu = None
    if stash is not None:
        g = egpu.backward(stash, [None if d is None else to_device(d) for d in dys], 0)
        grads_gpu = [None if c is None else from_device(c).numpy() for c in g]
    return outs_cpu, outs_gpu, grads_cpu, grads_gpu


def typed_model(op, inputs, attrs, domain, float_type, const, n_outputs):
    """test_half_cuda.typed_model, also taking absent optional inputs (None): oputil's one-node
    model with its float graph inputs retyped."""
    import onnx
    from onnx import TensorProto
    import test_half_cuda as H
    model = onnx.load_from_string(make_model(op, inputs, attrs, domain, 20, n_outputs, const))
    for vi in model.graph.input:
        if vi.type.tensor_type.elem_type == TensorProto.FLOAT:
            vi.type.tensor_type.elem_type = float_type
    for k, init in enumerate(model.graph.initializer):
        if init.data_type == TensorProto.FLOAT:
            model.graph.initializer[k].CopyFrom(H.float_initializer(onnx.numpy_helper.to_array(init), init.name,
                                                                    float_type))
    return model.SerializeToString()


def emu_run_pair(op, inputs, dt, attrs=None, domain="", grad=(), const=(), n_outputs=1):
    """tests/gpu/test_half_cuda.run_pair: the CPU in fp32 and the emulated GPU in dt, from the
    same values rounded to dt."""
    import test_half_cuda as H
    inputs = {n: None if a is None else np.ascontiguousarray(a) for n, a in inputs.items()}
    feed_names = [n for n, a in inputs.items() if a is not None and n not in const]
    flags = [n in grad for n in feed_names]
    rin = {n: None if a is None else H.rounded(a, dt) for n, a in inputs.items()}
    ecpu = _C.Engine(typed_model(op, rin, attrs, domain, H.TensorProto.FLOAT, const, n_outputs),
                     flags if any(flags) else None, seed=3)
    caps, stash = ecpu.forward([rin[n] for n in feed_names], True)
    outs_cpu = [cpu_out(c) for c in caps]
    dys = [torch.from_numpy(H.f32(*o.shape)).to(dt) if o.is_floating_point() and diff else None
           for o, diff in zip(outs_cpu, ecpu.output_differentiable)]
    grads_cpu = None
    if stash is not None:
        g = ecpu.backward(stash, [None if d is None else d.float().numpy() for d in dys])
        grads_cpu = [None if c is None else cpu_out(c) for c in g]
    egpu = _C.Engine(typed_model(op, rin, attrs, domain, H.ONNX_HALF[dt], const, n_outputs),
                     flags if any(flags) else None, seed=3)
    feeds = [torch.from_numpy(rin[n]).to(dt) if rin[n].dtype.kind == "f" else torch.from_numpy(rin[n])
             for n in feed_names]
    caps, stash = egpu.forward([to_device(f) for f in feeds], True, 0)
    outs_gpu = [from_device(c) for c in caps]
    for o, c in zip(outs_gpu, outs_cpu):
        if c.is_floating_point():
            assert o.dtype == dt, f"{op}: CUDA output dtype {o.dtype}, expected {dt}"
    outs_gpu = [o.float() if o.is_floating_point() else o for o in outs_gpu]
    grads_gpu = None
    if stash is not None:
        g = egpu.backward(stash, [None if d is None else to_device(d) for d in dys], 0)
        grads_gpu = [None if c is None else from_device(c) for c in g]
        for t in grads_gpu:
            assert t is None or t.dtype == dt, f"{op}: CUDA gradient dtype {t.dtype}, expected {dt}"
        grads_gpu = [None if t is None else t.float() for t in grads_gpu]
    return outs_cpu, outs_gpu, grads_cpu, grads_gpu


def ops_module():
    import test_ops_cuda as M
    M.run_both = emu_run_both
    return M


def half_module():
    import test_half_cuda as H
    H.run_pair = emu_run_pair
    return H

# ---- groups --------------------------------------------------------------------------------------


def cases_ops_fp32():
    M = ops_module()
    for i, (op, inputs, attrs, domain, grad) in enumerate(M.CASES):
        yield f"{op}-{i}", lambda c=(op, inputs, attrs, domain, grad): M.test_op_matches_cpu(*c)
    for name, *c in M.NEW_CASES:
        yield name, lambda c=c: M.test_new_op_matches_cpu(*c)
    for name, *c in M.SELECT_CASES:
        yield name, lambda c=c: M.test_select_op_matches_cpu(*c)
    yield "softmax-cross-entropy", M.test_softmax_cross_entropy_matches_cpu
    yield "dropout-masks", M.test_dropout_masks_match_cpu
    yield "maxpool-nan", M.test_maxpool_nan_wins_its_window_as_on_cpu
    yield "gather-elements-out-of-range-reads-zero", lambda: gather_elements_out_of_range(M)
    yield "nonzero-refused-by-name", lambda: nonzero_refused(M)
    for op, inputs, attrs, match in M.CONSTANT_OUT_OF_RANGE:
        yield f"constant-index-out-of-range-{op}", lambda c=(op, inputs, attrs, match): constant_index_refused(*c)
    for name, *c in M.CTC_CASES:
        yield name, lambda c=c: M.test_ctc_op_matches_cpu(*c)
    for i, c in enumerate(M.LLAMA_CASES):   # last: their output gradients draw after every other case's
        yield f"{c[0]}-llama-{i}", lambda c=c: M.test_llama_op_matches_cpu(*c)


def gather_elements_out_of_range(M):
    """test_ops_cuda.test_gather_elements_out_of_range_index_reads_zero_on_the_gpu, emulated."""
    x = M.f32(3, 2)
    idx = np.array([[3, 0]], np.int64)
    eng = _C.Engine(make_model("GatherElements", {"x": x, "i": idx}, {"axis": 0}), None)
    caps, _ = eng.forward([to_device(x), to_device(idx)], False, 0)
    np.testing.assert_array_equal(from_device(caps[0]).numpy(), [[0.0, x[0, 1]]])


def nonzero_refused(M):
    """A data-dependent size (NonZero: csrc/plan/plan.h's segments) runs on the CPU only: on CUDA the
    executor refuses the graph by name before any kernel, and the CPU runs it."""
    x = np.array([[0.0, 1.5], [2.0, 0.0]], np.float32)
    eng = _C.Engine(make_model("NonZero", {"x": x}, None), None)
    try:
        eng.forward([to_device(torch.from_numpy(x))], False, 0)
    except Exception as e:
        assert "NonZero node" in str(e) and "CPU only" in str(e), f"refused with another message: {e}"
    else:
        raise AssertionError("a NonZero graph ran on the CUDA provider")
    caps, _ = eng.forward([torch.from_numpy(x)], False, 0)
    np.testing.assert_array_equal(cpu_out(caps[0]).numpy(), [[0, 1], [1, 0]])


def constant_index_refused(op, inputs, attrs, match):
    """test_ops_cuda.test_constant_index_out_of_range_is_refused_on_the_gpu, emulated."""
    import re
    eng = _C.Engine(make_model(op, inputs, attrs, const_inputs=("i",)), None)
    feeds = [to_device(torch.from_numpy(a)) for n, a in inputs.items() if n != "i"]
    try:
        caps, _ = eng.forward(feeds, False, 0)
    except _C.EngineError as e:
        assert re.search(f"{op} node .*" + match, str(e)), f"{op}: refused with another message: {e}"
        return
    raise AssertionError(f"{op}: a constant index out of range ran on the CUDA provider (it read "
                         f"{from_device(caps[0]).numpy().tolist()})")


def _as_f64(inputs):
    return {k: (v.astype(np.float64) if isinstance(v, (np.ndarray, np.generic)) and v.dtype == np.float32 else v)
            for k, v in inputs.items()}


def cases_ops_fp64():
    """F64_CASES as test_ops_cuda runs them, and every CASES op in float64 too (the double
    kernels and cuBLAS's D GEMMs; MatMulBias takes its plain-GEMM path there, not cuBLASLt)."""
    M = ops_module()
    for name, *c in M.F64_CASES:
        yield name, lambda c=c: M.test_new_op_float64_matches_cpu(*c[:6])
    for name, op, inputs, attrs, domain, grad, n_out, const in M.SELECT_CASES:
        yield f"{name}-f64", lambda c=(op, _as_f64(inputs), attrs, domain, grad, n_out, const): M.check(
            c[0], c[1], c[2], c[3], c[4], n_outputs=c[5], const_inputs=c[6], rtol=1e-9, atol=1e-10)
    for i, (op, inputs, attrs, domain, grad) in enumerate(M.CASES):
        if op == "Cast":
            continue   # casts to double: no float64 variant
        n_out = 2 if op == "Split" else 1
        const = tuple(k for k in inputs if k in M.CONST and not (op == "LayerNormalization" and k == "s")
                      and not (op == "SimplifiedLayerNormalization" and k == "s"))
        yield f"{op}-{i}", lambda c=(op, _as_f64(inputs), attrs, domain, grad, n_out, const): M.check(
            c[0], c[1], c[2], c[3], c[4], n_outputs=c[5], const_inputs=c[6], rtol=1e-9, atol=1e-10)
    for name, inputs, attrs, grad, const in M.CTC_CASES:
        yield f"{name}-f64", lambda c=(_as_f64(inputs), attrs, grad, const): M.check(
            "CTCLoss", c[0], c[1], "ortmod", c[2], const_inputs=c[3], rtol=1e-12, atol=1e-12)
    for i, (op, inputs, attrs, domain, grad, const) in enumerate(M.LLAMA_CASES):
        yield f"{op}-llama-{i}-f64", lambda c=(op, _as_f64(inputs), attrs, domain, grad, const): M.check(
            c[0], c[1], c[2], c[3], c[4], const_inputs=c[5], rtol=1e-9, atol=1e-10)


def cases_half():
    """test_half_cuda's cases, and test_ops_cuda's NEW_CASES (conv.cu, pool.cu, norm.cu, misc.cu,
    scan.cu, rnn.cu's ops) in fp16/bf16 too, which no GPU test runs in half precision: each
    against the CPU in fp32 with
    test_half_cuda's tolerances (x4 for LSTM/GRU/RNN, whose states are stored in half at every step
    and whose weight gradients sum ~40 rounded terms of magnitude up to ~8). Not the Relu RNN
    cases: half rounding can move a pre-activation near 0 across the kink, which changes its
    gradient by a whole dh, not by a rounding error."""
    H, M = half_module(), ops_module()
    for dt, tag in ((torch.bfloat16, "bf16"), (torch.float16, "fp16")):
        for i, c in enumerate(H.CASES):
            yield f"{tag}-{c[0]}-{i}", lambda c=c, dt=dt: H.test_op_half_matches_cpu_fp32(*c, dt)
        yield f"{tag}-softmax-cross-entropy", lambda dt=dt: H.test_softmax_cross_entropy_half_logits(dt)
        yield f"{tag}-fused-attention", lambda dt=dt: H.test_fused_attention_half(dt)
        yield f"{tag}-gather-grad-fp32-accumulation", lambda dt=dt: H.test_gather_gradient_accumulates_in_fp32(dt)
        for c in H.FLASH_CASES:
            yield f"{tag}-flash-{c[0]}", lambda c=c, dt=dt: H.test_flash_attention_half(c, dt)
        yield f"{tag}-flash-matches-materialized", lambda dt=dt: flash_matches_materialized(H, dt)
        for c in H.SCATTER_SUMS:
            yield f"{tag}-{c[0]}-fp32-accumulation", lambda c=c, dt=dt: H.test_scatter_adds_accumulate_in_fp32(c, dt)
        yield f"{tag}-cast-bit-for-bit", lambda dt=dt: cast_half_bit_for_bit(H, dt)
        for name, op, inputs, attrs, grad, n_out, const, _ in M.NEW_CASES:
            if not any(isinstance(v, np.ndarray) and v.dtype.kind == "f" for v in inputs.values()):
                continue
            if op == "RNN" and "Relu" in (attrs or {}).get("activations", ()):
                continue
            scale = 4 if op in ("LSTM", "GRU", "RNN") else 1
            yield f"{tag}-{name}", lambda c=(op, inputs, dt, attrs, "", grad, const, n_out): H.check(*c, scale=scale)
        for name, op, inputs, attrs, domain, grad, n_out, const in M.SELECT_CASES:
            if op == "TopK" and inputs["x"].dtype.kind != "f":
                continue
            yield f"{tag}-{name}", lambda c=(op, inputs, dt, attrs, domain, grad, const, n_out): H.check(
                *c, equal_nan=True)
        for cell in ("LSTM", "GRU", "RNN"):
            yield f"{tag}-{cell}-dR-over-1024-steps", lambda cell=cell, dt=dt: recurrent_gradient_rounds_once(cell, dt)
    for dt, tag in ((torch.bfloat16, "bf16"), (torch.float16, "fp16")):   # last: their own draws
        for i, c in enumerate(H.LLAMA_CASES):
            yield f"{tag}-{c[0]}-llama-{i}", lambda c=c, dt=dt: H.test_llama_op_half_matches_cpu_fp32(*c, dt)


def flash_matches_materialized(H, dt):
    """test_half_cuda.test_flash_attention_matches_the_materialized_path."""
    H.test_flash_attention_matches_the_materialized_path(dt)


def recurrent_gradient_rounds_once(cell, dt):
    """dR sums one GEMM per time step. Summed in half, the running sum is rounded at every step;
    summed in fp32 and rounded once, dR is as accurate as dW (one GEMM over all steps, one rounding).
    Over 1024 steps the half running sum is 4-36x worse than dW; fp32 accumulation keeps the
    relative error within 4 units of the format's rounding."""
    rng = np.random.default_rng(9)
    g, steps, hidden = {"LSTM": 4, "GRU": 3, "RNN": 1}[cell], 1024, 4
    inputs = {"X": rng.standard_normal((steps, 1, 2)).astype(np.float32),
              "W": (0.5 * rng.standard_normal((1, g * hidden, 2))).astype(np.float32),
              "R": (0.5 * rng.standard_normal((1, g * hidden, hidden))).astype(np.float32)}
    _, _, gc, gg = emu_run_pair(cell, inputs, dt, {"hidden_size": hidden}, "", ("X", "W", "R"), (), 2)
    eps = 2.0 ** -8 if dt == torch.bfloat16 else 2.0 ** -11
    for name, a, b in zip(("X", "W", "R"), gc, gg):
        rel = float((a - b).abs().max() / a.abs().max())
        assert rel <= 4 * eps, f"{cell} {dt}: d{name} has relative error {rel:.2e} (> 4 x {eps:.1e})"


def cast_half_bit_for_bit(H, dt):
    """test_half_cuda.test_cast_half_on_cuda_matches_cpu_bit_for_bit on the emulated device."""
    x = H.f32(1000) * np.exp(H.R.uniform(-20, 20, 1000)).astype(np.float32)
    for to in (H.ONNX_HALF[dt], H.TensorProto.FLOAT):
        src = x if to != H.TensorProto.FLOAT else H.rounded(x, dt)
        ftype = H.TensorProto.FLOAT if to != H.TensorProto.FLOAT else H.ONNX_HALF[dt]
        m = H.typed_model("Cast", {"x": src}, {"to": to}, "", ftype, (), 1)
        feed = torch.from_numpy(src) if ftype == H.TensorProto.FLOAT else torch.from_numpy(src).to(dt)
        (c,), _ = _C.Engine(m, None).forward([feed], False)
        (g,), _ = _C.Engine(m, None).forward([to_device(feed)], False, 0)
        a, b = cpu_out(c), from_device(g)
        assert a.dtype == b.dtype and torch.equal(a, b), f"Cast to {to}: CUDA and CPU differ"


def cases_models():
    import models
    me = sys.modules[__name__]
    yield "TinyResNet", lambda: models.run_and_compare(models.tiny_resnet(), me)
    yield "GPT-2", lambda: models.run_and_compare(models.tiny_gpt2(), me)
    yield "GPT-2-without-attention-mask", lambda: models.run_and_compare(models.tiny_gpt2_without_mask(), me)
    yield "BERT-without-token-type-ids", lambda: models.run_and_compare(models.tiny_bert(), me)
    yield "LSTM-2-layers", lambda: models.run_and_compare(models.rnn_classifier(torch.nn.LSTM, False), me)
    yield "GRU-bidirectional", lambda: models.run_and_compare(models.rnn_classifier(torch.nn.GRU, True), me)
    yield "GPT-2-bf16-vs-cpu-fp32", lambda: models.half_step_close_to_fp32(torch.bfloat16, me)
    yield "GPT-2-fp16-vs-cpu-fp32", lambda: models.half_step_close_to_fp32(torch.float16, me)
    yield "RNN-relu-2-layers", lambda: models.run_and_compare(
        models.rnn_classifier(functools.partial(torch.nn.RNN, nonlinearity="relu"), False), me)
    yield "RNN-tanh-bidirectional", lambda: models.run_and_compare(models.rnn_classifier(torch.nn.RNN, True), me)


def cases_zoo():
    """tests/test_model_zoo.py's architectures (models.ZOO_DEFAULT; ORTMOD_EMU_ZOO=all for all
    38, or a comma-separated list of names)."""
    import models
    me = sys.modules[__name__]
    for name in models.zoo_names(os.environ.get("ORTMOD_EMU_ZOO")):
        yield f"zoo-{name}", lambda name=name: models.run_zoo_case(name, me)


def cases_streams():
    import models
    me = sys.modules[__name__]
    yield "MLP", lambda: models.steps_stay_on_stream(models.small_mlp(), me)
    yield "TinyResNet", lambda: models.steps_stay_on_stream(models.tiny_resnet(), me)
    yield "GPT-2", lambda: models.steps_stay_on_stream(models.tiny_gpt2(), me)


def cases_selftest():
    import selfcheck
    return selfcheck.cases(sys.modules[__name__])


def cases_optim():
    import optim
    yield from optim.cases()


GROUPS = {"selftest": cases_selftest, "ops-fp32": cases_ops_fp32, "ops-fp64": cases_ops_fp64, "half": cases_half,
          "models": cases_models, "zoo": cases_zoo, "streams": cases_streams, "optim": cases_optim}


def run_case(fn):
    """(ok, message): a failure is an exception or anything the emulator logged meanwhile."""
    take_emulator_errors()
    try:
        fn()
        ok, msg = True, ""
    except Exception as e:   # noqa: BLE001 - any failure of the case is its result
        tb = traceback.format_exception(type(e), e, e.__traceback__)
        ok, msg = False, "".join(tb[-3:])[-3000:]
    free_device_tensors()
    logged = take_emulator_errors()
    if logged:
        ok, msg = False, (msg + "\nthe emulator reported:\n" + logged)[-4000:]
    return ok, msg


def main(group, results_path):
    sys.path.insert(0, HERE)
    with open(results_path, "w") as out:
        for name, fn in GROUPS[group]():
            out.write(json.dumps({"running": name}) + "\n")   # names the case if the process dies
            out.flush()
            t0 = time.perf_counter()
            ok, msg = run_case(fn)
            out.write(json.dumps({"id": name, "ok": ok, "message": msg,
                                  "seconds": round(time.perf_counter() - t0, 3)}) + "\n")
            out.flush()
        out.write(json.dumps({"done": True, "launches": LIB.emu_launch_count()}) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
