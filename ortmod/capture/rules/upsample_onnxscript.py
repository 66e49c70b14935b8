"""The torch.export path's rules for nearest, nearest-exact, (bi/tri)linear upsampling: onnxscript
functions traced by torch's exporter where torchlib's
translation does not mean what eager training means.

Each function below is handed the opset ``op``, ``onnx_ir`` as ``ir`` and the engine's stop-gradient
op, and returns {aten op: rule} for the rules that share its helpers; ``translations`` is their
union, which ``capture.export_registry`` adds to torchlib's registry."""
import torch

from .onnxscript import gather_with_gradient_at


def upsample(op, ir, stop_gradient):
    from typing import Optional, Sequence
    from onnxscript.function_libs.torch_lib.tensor_typing import TFloat, TInt

    I64 = ir.DataType.INT64

    def const(v, dt):
        return op.Constant(value=ir.tensor(v, dtype=dt))

    def ints(v):
        return const(list(v), I64)

    # ---- upsampling: nearest, nearest-exact, (bi/tri)linear --------------------------------------
    # Eager's CPU kernels (UpSampleKernel.cpp, UpSample.h) per spatial axis of input size L and
    # output size O, in the op-math type T (float; double for float64 inputs):
    # * O: the given size, else floor(L * scale) in double (compute_output_size);
    # * the source scale: 1 / scale given (> 0), else L / O, in T (compute_scales_value);
    # * nearest's index floorf(scale * o), nearest-exact's floorf(max(scale (o + .5) - .5, 0) + .5)
    #   (that + .5 in double), both clamped to L - 1; floorf takes a float, so a double is
    #   rounded to float first (2-d: see nearest() for the kernel eager picks);
    # * linear: O == L copies; else the source max(scale (o + .5) - .5, 0) (align_corners:
    #   scale o with scale (L - 1) / (O - 1), 0 for O == 1), i0 = min(floorf(it), L - 1),
    #   i1 = i0 + 1 unless i0 is the last, lambda1 = clamp(it - i0, 0, 1), lambda0 = 1 - lambda1;
    #   the result nests the axes innermost first (w0 x[i0] + w1 x[i1] along W, then H, then D).
    # Sizes are sizes of the call, so the indices and weights are computed in the graph, from
    # integers (no gradient flows into them). torchlib's Resize is an op the engine lacks.
    #
    # Linear's backward scatters with the forward's weights (one linear map). Nearest's does
    # not quite: its backward's index (nearest_idx, nearest_exact_idx) is computed in float and
    # nearest_idx copies for O == L and halves for O == 2 L, while the forward always uses the
    # formula in T. They differ, e.g., for float64 at L 24, O 74, or float32 with scale_factor
    # 1.1 at L 4 (forward [0, 0, 1, 2], the gradient as for [0, 1, 2, 3]). Where they can, the
    # value is read at the forward's index and the gradient sent to the backward's: Gather of
    # the stopped input at one plus (x[b] - stop(x[b])) at the other (gather_with_gradient_at, which
    # the TorchScript path shares), per output position
    # where they differ. Left: at such a position whose x[b] is inf or NaN the value stays
    # eager's but that element gets no gradient where eager's gets dy.

    F32, F64 = ir.DataType.FLOAT, ir.DataType.DOUBLE

    def opmath(dt):
        return F64 if dt == F64 else F32

    def axis_sizes(x, a, k, output_size, scale):
        size = op.Shape(x, start=a, end=a + 1)                                  # L, (1,)
        if output_size is not None:
            out = op.Slice(op.Cast(output_size, to=I64), ints([k]), ints([k + 1]))
        else:
            out = op.Cast(op.Floor(op.Mul(op.Cast(size, to=F64), const([float(scale)], F64))), to=I64)
        return size, out

    def source_scale(size, out, scale, T):
        if scale is not None and scale > 0:
            return const([float(torch.tensor(1.0 / scale, dtype=torch.float64 if T == F64 else torch.float32))], T)
        return op.Div(op.Cast(size, to=T), op.Cast(out, to=T))

    def floorf(v, T):
        if T == F64:
            v = op.Cast(v, to=F32)
        return op.Cast(op.Floor(v), to=I64)

    def nearest_indices(size, out, scale, T, exact):
        o = op.Range(const(0, I64), op.Squeeze(out, ints([0])), const(1, I64))
        last = op.Sub(size, ints([1]))
        s_t, s_f = source_scale(size, out, scale, T), source_scale(size, out, scale, F32)
        if exact:
            half = const(0.5, T)
            real = op.Max(op.Sub(op.Mul(s_t, op.Add(op.Cast(o, to=T), half)), half), const(0.0, T))
            fwd = op.Min(floorf(op.Cast(op.Add(op.Cast(real, to=F64), const(0.5, F64)), to=F32), F32), last)
            bwd_real = op.Mul(op.Add(op.Cast(o, to=F64), const(0.5, F64)), op.Cast(s_f, to=F64))
            bwd = op.Min(floorf(bwd_real, F64), last)
            return o, fwd, bwd
        fwd = op.Min(floorf(op.Mul(op.Cast(o, to=T), s_t), T), last)
        generic = op.Min(floorf(op.Mul(op.Cast(o, to=F32), s_f), F32), last)
        bwd = op.Where(op.Equal(out, size), o,
                       op.Where(op.Equal(out, op.Mul(size, ints([2]))), op.Div(o, const(2, I64)), generic))
        return o, fwd, bwd

    def may_differ(T, scale, exact):
        # whether nearest's backward index can differ from its forward's (see above): float
        # op-math with the same scale differs only through nearest_idx's O == L and O == 2 L
        # cases, which a scale in (1, 2) or (2, 3) can reach
        if exact or T == F64:
            return True
        return scale is not None and (1.0 < scale < 2.0 or 2.0 < scale < 3.0)

    def along(v, a, rank):
        # a vector over axis a, shaped to broadcast against a rank-`rank` tensor
        return op.Reshape(v, ints([-1] + [1] * (rank - 1 - a)))

    def emit(op_type, *inputs, axis=None):
        return getattr(op, op_type)(*inputs, **({} if axis is None else {"axis": axis}))

    def nearest(rank, exact):
        def rule(x, output_size, scales):
            r = len(x.shape)
            T = opmath(x.dtype)
            sizes = [axis_sizes(x, 2 + k, k, output_size, scales[k]) for k in range(rank)]
            if rank == 2:
                # eager's 2-d forward takes its channels-last kernel, which reads at the
                # backward's index, where O_h + O_w <= 128 (_use_vectorized_kernel_cond_2d; its
                # other case, a channels-last input with C > 3, is refused by _CHECKS), else the
                # formula in T
                small = op.LessOrEqual(op.Add(sizes[0][1], sizes[1][1]), ints([128]))
            y = x
            for k in range(rank):
                a = 2 + k
                size, out = sizes[k]
                o, fwd, bwd = nearest_indices(size, out, scales[k], T, exact)
                if rank == 2:
                    fwd = op.Where(small, bwd, fwd)
                if not may_differ(T, scales[k], exact):
                    y = op.Gather(y, fwd, axis=a)
                    continue
                y = gather_with_gradient_at(emit, stop_gradient, y, fwd, bwd, along(op.Equal(fwd, bwd), a, r), a)
            return y
        return rule

    def linear(rank):
        def rule(x, output_size, align_corners, scales):
            r = len(x.shape)
            T = opmath(x.dtype)     # float32 / float64 only (_CHECKS): T is the input's dtype
            y = x
            for k in reversed(range(rank)):
                a = 2 + k
                size, out = axis_sizes(x, a, k, output_size, scales[k])
                o = op.Range(const(0, I64), op.Squeeze(out, ints([0])), const(1, I64))
                o_t = op.Cast(o, to=T)
                zero, one, half = const(0.0, T), const(1.0, T), const(0.5, T)
                last = op.Sub(size, ints([1]))
                if align_corners:
                    ratio = op.Div(op.Cast(last, to=T), op.Cast(op.Sub(out, ints([1])), to=T))
                    ratio = op.Where(op.Greater(out, ints([1])), ratio, zero)
                    real = op.Mul(ratio, o_t)
                else:
                    ratio = source_scale(size, out, scales[k], T)
                    real = op.Max(op.Sub(op.Mul(ratio, op.Add(o_t, half)), half), zero)
                i0 = op.Min(floorf(real, T), last)
                lam1 = op.Min(op.Max(op.Sub(real, op.Cast(i0, to=T)), zero), one)
                i1 = op.Min(op.Add(i0, const(1, I64)), last)
                same = op.Equal(out, size)                                      # O == L copies
                i0, i1 = op.Where(same, o, i0), op.Where(same, o, i1)
                lam1 = op.Where(same, zero, lam1)
                lam0 = op.Sub(one, lam1)
                y = op.Add(op.Mul(op.Gather(y, i0, axis=a), along(lam0, a, r)),
                           op.Mul(op.Gather(y, i1, axis=a), along(lam1, a, r)))
            return y
        return rule

    def scale_list(rank, scale_factors):
        if scale_factors is None:
            return [None] * rank
        v = [float(s) for s in scale_factors]
        return v * rank if len(v) == 1 else v

    def nearest_vec(rank, exact):
        inner = nearest(rank, exact)

        def rule(input: TFloat, output_size: Optional[TInt], scale_factors: Optional[Sequence[float]]) -> TFloat:
            return inner(input, output_size, scale_list(rank, scale_factors))
        return rule

    def nearest_default(rank, exact):
        inner = nearest(rank, exact)
        if rank == 1:
            def rule(self: TFloat, output_size: TInt, scales: Optional[float] = None) -> TFloat:
                return inner(self, output_size, [scales])
        elif rank == 2:
            def rule(self: TFloat, output_size: TInt, scales_h: Optional[float] = None,
                     scales_w: Optional[float] = None) -> TFloat:
                return inner(self, output_size, [scales_h, scales_w])
        else:
            def rule(self: TFloat, output_size: TInt, scales_d: Optional[float] = None,
                     scales_h: Optional[float] = None, scales_w: Optional[float] = None) -> TFloat:
                return inner(self, output_size, [scales_d, scales_h, scales_w])
        return rule

    def linear_vec(rank):
        inner = linear(rank)

        def rule(input: TFloat, output_size: Optional[TInt], align_corners: bool,
                 scale_factors: Optional[Sequence[float]]) -> TFloat:
            return inner(input, output_size, bool(align_corners), scale_list(rank, scale_factors))
        return rule

    def linear_default(rank):
        inner = linear(rank)
        if rank == 1:
            def rule(self: TFloat, output_size: TInt, align_corners: bool, scales: Optional[float] = None) -> TFloat:
                return inner(self, output_size, bool(align_corners), [scales])
        elif rank == 2:
            def rule(self: TFloat, output_size: TInt, align_corners: bool, scales_h: Optional[float] = None,
                     scales_w: Optional[float] = None) -> TFloat:
                return inner(self, output_size, bool(align_corners), [scales_h, scales_w])
        else:
            def rule(self: TFloat, output_size: TInt, align_corners: bool, scales_d: Optional[float] = None,
                     scales_h: Optional[float] = None, scales_w: Optional[float] = None) -> TFloat:
                return inner(self, output_size, bool(align_corners), [scales_d, scales_h, scales_w])
        return rule

    def nearest_channels_last(input: TFloat, output_size: Optional[TInt], scale_factors: Optional[Sequence[float]],
                              exact: bool) -> TFloat:
        # ortmod::nearest_channels_last (onnxscript.mark_channels_last_nearest): eager's
        # channels-last kernel reads at the backward's own index, forward and backward alike
        rank = len(input.shape) - 2
        T = opmath(input.dtype)
        scales = [s if s is not None and s > 0 else None for s in scale_list(rank, scale_factors)]
        y = input
        for k in range(rank):
            size, out = axis_sizes(input, 2 + k, k, output_size, scales[k])
            y = op.Gather(y, nearest_indices(size, out, scales[k], T, bool(exact))[2], axis=2 + k)
        return y

    upsampling = {torch.ops.ortmod.nearest_channels_last.default: nearest_channels_last}
    for rank, lin in ((1, "upsample_linear1d"), (2, "upsample_bilinear2d"), (3, "upsample_trilinear3d")):
        for exact, name in ((False, f"upsample_nearest{rank}d"), (True, f"_upsample_nearest_exact{rank}d")):
            packet = getattr(torch.ops.aten, name)
            upsampling[packet.vec] = nearest_vec(rank, exact)
            upsampling[packet.default] = nearest_default(rank, exact)
        packet = getattr(torch.ops.aten, lin)
        upsampling[packet.vec] = linear_vec(rank)
        upsampling[packet.default] = linear_default(rank)

    return {
        **upsampling,
    }


def translations(op, ir, stop_gradient):
    """{aten op: rule} of this family."""
    return {**upsample(op, ir, stop_gradient)}
