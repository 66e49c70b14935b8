"""The TorchScript path's nearest / nearest-exact upsampling (aten::upsample_nearest{1,2,3}d,
aten::_upsample_nearest_exact{1,2,3}d): per spatial axis a Gather with eager's own source
indices, probed on eager's kernels in the input's memory layout (eager picks its kernel's index
arithmetic by layout). Registered by rules/nn.py's upsampling rules."""
import torch

from ..compat import JitTensorType
from ..onnx_util import _const, _dtype_of, _refuse, _stop_gradient
from .nn import _I64, _sizes, _upsample_call


def _channels_last_kernel(x):
    """onnxscript.nearest_takes_channels_last_kernel for a traced value (its type records eager's
    strides: tracing ran eager's kernels)."""
    from .onnxscript import nearest_takes_channels_last_kernel
    t = x.type()
    if not isinstance(t, JitTensorType):
        return None
    sizes = t.varyingSizes()
    return nearest_takes_channels_last_kernel(list(sizes) if sizes is not None else [], t.strides())


@torch.enable_grad()     # the export may run under the caller's no_grad (an eval forward)
def _probe_nearest(op, spatial, out, scales, what, dtype, channels_last=False):
    """Eager's source index along each axis, forward and backward, read off eager's own kernels
    in the input's op-math dtype (float32 for float16 / bfloat16: the index arithmetic differs
    between float32 and float64). Forward: per axis a probe holding each element's coordinate
    along that axis (exact: coordinates < 2 ** 24), checked to depend only on the output's own
    coordinate along it. Backward: eager's backward computes its own index (UpSample.h's
    nearest_idx / nearest_exact_idx, in float, copying for O == L and halving for O == 2 L),
    which differs from the forward's for some sizes (scale_factor 1.1 at size 4: forward
    [0, 0, 1, 2], gradient as for [0, 1, 2, 3]); read as per-input counts of ones (the index is
    nondecreasing), then checked against eager's backward of an integer-valued gradient.
    With ``channels_last`` the probes take the input's layout: 4 channels, contiguous in
    channels-last order (eager's kernel choice depends on it; channel 0 is read).
    Returns [(forward index, backward index)] per axis."""
    pdt = dtype if dtype in (torch.float32, torch.float64) else torch.float32

    def laid_out(t):
        if not channels_last:
            return t
        fmt = torch.channels_last if t.dim() == 4 else torch.channels_last_3d
        return t.expand([1, 4] + list(t.shape[2:])).contiguous(memory_format=fmt)
    if max(spatial + out) >= 2 ** 24:
        _refuse(what, "a spatial size is too large to probe")
    k = len(spatial)
    line = lambda t, a: t[(0, 0) + tuple(slice(None) if b == a else 0 for b in range(k))]
    fwd = []
    for a in range(k):
        shape = [1] * k
        shape[a] = spatial[a]
        probe = torch.arange(spatial[a], dtype=pdt).reshape([1, 1] + shape).expand([1, 1] + spatial).contiguous()
        y = op(laid_out(probe), out, *scales)
        if list(y.shape[2:]) != out:
            _refuse(what, f"eager gives output sizes {list(y.shape[2:])}, not {out}")
        idx = line(y, a)
        shape = [1] * k
        shape[a] = out[a]
        if not torch.equal(y[0, 0], idx.reshape(shape).expand(out)):
            _refuse(what, "eager's source indices are not one per axis (cannot be gathered axis by axis)")
        fwd.append(idx.to(torch.int64))
    probe = laid_out(torch.zeros([1, 1] + spatial, dtype=pdt)).requires_grad_()
    counts, = torch.autograd.grad(op(probe, out, *scales), probe, laid_out(torch.ones([1, 1] + out, dtype=pdt)))
    counts = counts[:, :1].to(torch.float64)
    bwd = []
    for a in range(k):
        per = counts[0, 0].sum([b for b in range(k) if b != a]) if k > 1 else counts[0, 0]
        others = 1
        for b in range(k):
            others *= out[b] if b != a else 1
        c = (per / others).round().to(torch.int64)
        if int(c.sum()) != out[a]:
            _refuse(what, "eager's backward sends the gradient in a way ortmod does not gather axis by axis")
        bwd.append(torch.repeat_interleave(torch.arange(spatial[a]), c))
    g = torch.Generator().manual_seed(0)
    dy = torch.randint(-4, 5, [1, 1] + out, generator=g)
    want, = torch.autograd.grad(op(probe, out, *scales), probe, laid_out(dy.to(pdt)))
    want = want[:, :1]
    have = dy.to(torch.float64)
    for a in range(k):
        src = torch.zeros(have.shape[:2 + a] + (spatial[a],) + have.shape[3 + a:], dtype=torch.float64)
        have = src.index_add(2 + a, bwd[a], have)
    if not torch.equal(want.to(torch.float64), have):
        _refuse(what, "eager's backward sends the gradient in a way ortmod does not gather axis by axis")
    return list(zip(fwd, bwd))


def _nearest_symbolic(rank, exact):
    what = f"{'_upsample_nearest_exact' if exact else 'upsample_nearest'}{rank}d"
    op = getattr(torch.ops.aten, what).default

    def symbolic(g, input, output_size, *scale_args):
        """nearest / nearest-exact: per spatial axis a Gather with eager's own source indices
        (probed, _probe_nearest); Gather's gradient is a scatter-add, as eager's backward, by
        the forward's index; where eager's backward computes another, the gradient goes there
        (rules/onnxscript.gather_with_gradient_at, shared with the torch.export path; imported
        here, not at the top: it registers torch.export's custom ops, which the TorchScript path
        need not pay for at import)."""
        from .onnxscript import gather_with_gradient_at
        spatial, out, scales = _upsample_call(g, what, rank, input, output_size, scale_args)

        def emit(op_type, *inputs, axis=None):
            return g.op(op_type, *inputs, **({} if axis is None else {"axis_i": axis}))

        probe = lambda channels_last: _probe_nearest(op, spatial, out, scales, what, _dtype_of(input), channels_last)
        channels_last = _channels_last_kernel(input) if rank > 1 else False
        if rank > 1 and not (_sizes(input)[1] is not None and _sizes(input)[1] <= 3):
            from ..tracing import _current_recorder
            recorder = _current_recorder()
            if recorder is not None:        # the export holds for this call's layouts only
                recorder.reads_layout = True
        if channels_last is None:
            # the strides are not recorded: follow either layout only where eager gives both the same
            indices = probe(False)
            if any(not (torch.equal(f0, f1) and torch.equal(b0, b1)) for (f0, b0), (f1, b1) in zip(indices, probe(True))):
                _refuse(what, "the input's memory layout is not known at export, and eager's index arithmetic "
                              "depends on it (channels-last inputs with more than 3 channels read at another index)")
        else:
            indices = probe(channels_last)
        y = input
        for a, (fwd, bwd) in enumerate(indices):
            if torch.equal(fwd, bwd):
                if not (out[a] == spatial[a] and torch.equal(fwd, torch.arange(out[a]))):
                    y = g.op("Gather", y, _const(g, fwd.tolist(), _I64), axis_i=2 + a)
                continue
            same = _const(g, torch.eq(fwd, bwd).reshape([-1] + [1] * (rank - 1 - a)).tolist(), torch.bool)
            y = gather_with_gradient_at(emit, lambda v: _stop_gradient(g, v), y,
                                        _const(g, fwd.tolist(), _I64), _const(g, bwd.tolist(), _I64), same, 2 + a)
        return y
    return symbolic


def symbolics(registration, opset):
    """aten name -> ortmod's rule, for torchscript_registry."""
    rules = {}
    for rank in (1, 2, 3):
        rules[f"aten::upsample_nearest{rank}d"] = _nearest_symbolic(rank, exact=False)
        rules[f"aten::_upsample_nearest_exact{rank}d"] = _nearest_symbolic(rank, exact=True)
    return rules
