"""The optimizer passes on CUDA tensors (cuda/optim.cu, reached through ortmod._C.adam_step,
grads_scale, grads_copy_scaled and grads_check_and_norm as ortmod.optim calls them), emulated,
against the same calls on CPU tensors. Torch here has no CUDA, so FusedAdam and FP16_Optimizer
themselves run on a GPU only (tests/gpu/test_optim_cuda.py); these cases check the kernels and
the engine's routing: every mode and dtype mix, more tensors than one launch carries, chunk
edges, empty tensors, the stream every launch goes to and the one blocking read-back."""
import numpy as np
import torch

from ortmod import _C

# sizes across the kernel's 8192-element chunks, an empty tensor, and more tensors (30) than
# the 24 one launch carries
SIZES = [5, 8192, 8193, 0, 1, 20000, 3, 700] + [37 * (k + 1) for k in range(22)]


def _read(dt):
    import harness
    out = torch.empty(dt.shape, dtype=dt.dtype)
    n = out.numel() * out.element_size()
    if n and harness.LIB.cudaMemcpy(out.data_ptr(), dt.ptr, n, harness.D2H) != 0:
        raise RuntimeError("emulated cudaMemcpy (device to host) failed")
    return out


def _tensors(rng, dtype, scale=1.0):
    return [torch.from_numpy((rng.standard_normal(n) * scale).astype(np.float32)).to(dtype) for n in SIZES]


def _close(a, b, what, dtype):
    tol = {torch.float32: (2e-6, 1e-7), torch.float16: (1e-3, 1e-5), torch.bfloat16: (8e-3, 1e-4)}[dtype]
    torch.testing.assert_close(b.float(), a.float(), rtol=tol[0], atol=tol[1], msg=what)


def adam_matches_cpu(mode, pdt, gdt):
    """Two steps of one group: params, exp_avg and exp_avg_sq as the CPU's."""
    import harness
    rng = np.random.default_rng(mode * 10 + 1)
    p, m = _tensors(rng, pdt), _tensors(rng, torch.float32, 0.1)
    v = [t.abs() for t in _tensors(rng, torch.float32, 0.01)]
    dev = [[harness.to_device(t) for t in ts] for ts in (p, m, v)]
    stream = harness.create_stream()
    for step in (1, 2):
        g = _tensors(rng, gdt)
        hp = dict(lr=1e-2, beta1=0.9, beta2=0.99, eps=1e-8, weight_decay=0.1, bias_correction=True, mode=mode,
                  step=step, grad_scale=4.0)
        _C.adam_step(p, g, m, v, **hp)
        dg = [harness.to_device(t) for t in g]
        _C.adam_step(dev[0], dg, dev[1], dev[2], stream=stream, **hp)
    for name, cpu, d, dt in (("param", p, dev[0], pdt), ("exp_avg", m, dev[1], torch.float32),
                             ("exp_avg_sq", v, dev[2], torch.float32)):
        for k, (a, b) in enumerate(zip(cpu, d)):
            _close(a, _read(b), f"mode {mode} {pdt}/{gdt}: {name} {k}", dt)
    harness.free_device_tensors()


def scaling_matches_cpu(dtype):
    """grads_scale in place and grads_copy_scaled into fp32 (master gradients)."""
    import harness
    rng = np.random.default_rng(7)
    g = _tensors(rng, dtype)
    dg = [harness.to_device(t) for t in g]
    master = [harness.to_device(torch.zeros(t.shape)) for t in g]
    cpu_master = [torch.zeros(t.shape) for t in g]
    _C.grads_copy_scaled(g, cpu_master, 0.25)
    _C.grads_copy_scaled(dg, master, 0.25)
    _C.grads_scale(g, 0.5)
    _C.grads_scale(dg, 0.5)
    for k in range(len(g)):
        _close(cpu_master[k], _read(master[k]), f"copy_scaled {k}", torch.float32)
        _close(g[k], _read(dg[k]), f"scale {k}", dtype)
    harness.free_device_tensors()


def check_and_norm_matches_cpu(dtype):
    """The squared norm as the CPU's (fp64 sums, another order); an inf or a NaN anywhere is found."""
    import harness
    rng = np.random.default_rng(3)
    g = _tensors(rng, dtype)
    found, sq = _C.grads_check_and_norm(g, 8.0)
    dfound, dsq = _C.grads_check_and_norm([harness.to_device(t) for t in g], 8.0)
    assert not found and not dfound
    np.testing.assert_allclose(dsq, sq, rtol=1e-9)
    for bad in (float("inf"), float("nan")):
        g2 = [t.clone() for t in g]
        g2[5][12345] = bad
        dfound, dsq = _C.grads_check_and_norm([harness.to_device(t) for t in g2], 1.0)
        assert dfound and dsq == float("inf"), (bad, dfound, dsq)
    harness.free_device_tensors()


def on_the_callers_stream():
    """Every launch, allocation and copy of the passes goes to the given stream; only the norm's
    read-back blocks (its copy and the wait), and the provider counts both."""
    import harness
    rng = np.random.default_rng(5)
    p, g = _tensors(rng, torch.bfloat16), _tensors(rng, torch.bfloat16)
    m, v = _tensors(rng, torch.float32, 0.0), _tensors(rng, torch.float32, 0.0)
    dev = [[harness.to_device(t) for t in ts] for ts in (p, g, m, v)]
    master = [harness.to_device(torch.zeros(t.shape)) for t in g]
    stream = harness.create_stream()
    for blocking, run in ((0, lambda: (_C.adam_step(*dev, 1e-3, 0.9, 0.999, 1e-8, 0.0, True, 2, 1, 1.0, stream),
                                       _C.grads_scale(dev[1], 0.5, stream),
                                       _C.grads_copy_scaled(dev[1], master, 2.0, stream))),
                          (2, lambda: _C.grads_check_and_norm(dev[1], 1.0, stream))):
        harness.take_counters()
        before = harness.LIB.om_cuda_sync_count()
        run()
        c = harness.take_counters()
        provider = harness.LIB.om_cuda_sync_count() - before
        assert set(c["streams"]) <= {stream}, f"work on streams {sorted(c['streams'])}, expected only {stream}"
        assert provider == blocking and sum(c["syncs"].values()) == blocking, (provider, c["syncs"])
    harness.free_device_tensors()


def mixed_devices_refused():
    import harness
    p = [torch.zeros(4), torch.zeros(4)]
    dev = harness.to_device(torch.zeros(4))
    try:
        _C.grads_scale([p[0], dev], 2.0)
    except _C.InvalidInputError as e:
        assert "cuda:0" in str(e) and "cpu" in str(e), str(e)
    else:
        raise AssertionError("a call over a CPU and a CUDA tensor was accepted")
    harness.free_device_tensors()


def cases():
    for mode in (0, 1, 2):
        for pdt, gdt in ((torch.float32, torch.float32), (torch.float16, torch.float16),
                         (torch.bfloat16, torch.bfloat16), (torch.float32, torch.bfloat16)):
            yield f"adam-mode{mode}-{str(pdt)[6:]}-{str(gdt)[6:]}", lambda a=(mode, pdt, gdt): adam_matches_cpu(*a)
    for dt in (torch.float32, torch.float16, torch.bfloat16):
        yield f"scaling-{str(dt)[6:]}", lambda dt=dt: scaling_matches_cpu(dt)
        yield f"check-and-norm-{str(dt)[6:]}", lambda dt=dt: check_and_norm_matches_cpu(dt)
    yield "on-the-callers-stream", on_the_callers_stream
    yield "mixed-devices-refused", mixed_devices_refused
