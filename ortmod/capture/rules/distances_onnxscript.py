"""The torch.export path's rules for p-norms and distances: onnxscript functions traced by torch's
exporter where torchlib's translation does not mean what eager training means.

Each function below is handed the opset ``op``, ``onnx_ir`` as ``ir`` and the engine's stop-gradient
op, and returns {aten op: rule} for the rules that share its helpers; ``translations`` is their
union, which ``capture.export_registry`` adds to torchlib's registry."""
import torch


def distances(op, ir, stop_gradient):
    from typing import Optional, Sequence
    from onnxscript.function_libs.torch_lib.tensor_typing import TFloat

    I64 = ir.DataType.INT64

    def const(v, dt):
        return op.Constant(value=ir.tensor(v, dtype=dt))

    def ints(v):
        return const(list(v), I64)

    # ---- p-norms and distances (the TorchScript path's rules, ortmod/capture/rules/symbolics.py) -------

    import math

    def p_norm(x, p, axes, keepdim, dt):
        # linalg_vector_norm of order p over axes, forward and gradient as eager's
        # norm_backward (FunctionsManual.cpp):
        # * p 2 and 1: ReduceL2 (dy x / norm, 0 where the norm is 0), ReduceL1 (dy sgn(x));
        # * p +-inf: ReduceMax / ReduceMin of |x| (ties share dy equally, eager's mask.sum);
        # * p 0: the count of non-zeros, no gradient;
        # * any other p: (sum |x|^p)^(1/p) with eager's masks: 0 where the norm is 0 (p > 0),
        #   where an element is 0 (p < 1: |x|^(p-1) is inf there), and on rows holding a zero
        #   (p < 0: their norm is 0 and eager's norm^(1-p) factor zeroes the row). torchlib's
        #   Pow chain has none of them: its gradient at a zero row is inf * 0 = NaN.
        # A 0-d x is a 1-element vector (eager's dim -1 of a 0-d tensor). dt: x's dtype, which
        # the translator does not always know for an intermediate value.
        if x.shape is not None and len(x.shape) == 0:
            x = op.Reshape(x, ints([1]))
            axes, keepdim = [0], False
        ax, k = ints(axes), int(bool(keepdim))
        if p == 2.0:
            return op.ReduceL2(x, ax, keepdims=k)
        if p == 1.0:
            return op.ReduceL1(x, ax, keepdims=k)
        if math.isinf(p):
            return (op.ReduceMax if p > 0 else op.ReduceMin)(op.Abs(x), ax, keepdims=k)
        zero, one = const(0.0, dt), const(1.0, dt)
        if p == 0.0:
            nonzero = op.Cast(op.Not(op.Equal(x, zero)), to=dt)
            return op.ReduceSum(stop_gradient(nonzero), ax, keepdims=k)
        a = op.Abs(x)
        a_zero = op.Equal(a, zero)
        powed = op.Pow(op.Where(a_zero, one, a), const(p, dt))     # Pow's gradient stays finite at 0
        if p > 0:
            powed = op.Where(a_zero, zero, powed)                     # 0^p = 0, gradient 0
            total = op.ReduceSum(powed, ax, keepdims=k)
            t_zero = op.Equal(total, zero)
            return op.Where(t_zero, zero, op.Pow(op.Where(t_zero, one, total), const(1.0 / p, dt)))
        total = op.ReduceSum(powed, ax, keepdims=k)                   # p < 0: a zero element makes it 0
        has_zero = op.Equal(op.ReduceMin(a, ax, keepdims=k), zero)
        return op.Where(has_zero, zero, op.Pow(op.Where(has_zero, one, total), const(1.0 / p, dt)))

    def vector_norm(self: TFloat, ord: float = 2.0, dim: Optional[Sequence[int]] = None, keepdim: bool = False,
                    dtype: int = -1) -> TFloat:
        # eager: the norm of self (cast to dtype first when given, the gradient through the
        # cast) over dim, every dim when dim is None or empty, keepdim keeping them as 1
        # (torchlib's rule drops keepdim without a dim); p_norm for the order.
        rank = len(self.shape)
        dt = self.dtype
        if dtype is not None and dtype != -1 and dtype != self.dtype:
            dt = ir.DataType(dtype)
            self = op.Cast(self, to=dt)
        if dim is None or len(dim) == 0:
            axes = list(range(rank))
        else:
            axes = [int(d) for d in ([dim] if isinstance(dim, int) else dim)]
        if rank == 0:
            return p_norm(self, float(ord), [0], False, dt)
        return p_norm(self, float(ord), axes, keepdim, dt)

    CDIST_MM_ROWS = 25   # Distance.cpp cdist_impl: p 2 takes the matrix-product path above it

    def euclidean_dist_mm(x1, x2, rank, dt):
        # eager's _euclidean_dist: [-2 x1, |x1|^2, 1] @ [x2, 1, |x2|^2]^T, clamped at 0, sqrt;
        # its backward divides by the result and takes 0 where it is 0 (the Where around Sqrt;
        # Sqrt's own gradient is inf there)
        ax = ints([-1])
        n1 = op.ReduceSum(op.Mul(x1, x1), ax, keepdims=1)
        n2 = op.ReduceSum(op.Mul(x2, x2), ax, keepdims=1)
        one1 = op.Expand(const(1.0, dt), op.Shape(n1))
        one2 = op.Expand(const(1.0, dt), op.Shape(n2))
        a = op.Concat(op.Mul(x1, const(-2.0, dt)), n1, one1, axis=-1)
        b = op.Concat(x2, one2, n2, axis=-1)
        perm = list(range(rank - 2)) + [rank - 1, rank - 2]
        sq = op.MatMul(a, op.Transpose(b, perm=perm))
        zero, one = const(0.0, dt), const(1.0, dt)
        nonpos = op.LessOrEqual(sq, zero)
        return op.Where(nonpos, zero, op.Sqrt(op.Where(nonpos, one, sq)))

    def inf_norm_ties_whole(diff, dt):
        # max |diff| over the last axis with _cdist_backward's gradient: sign(diff) dy at every
        # element equal to the maximum (linalg_vector_norm's shares dy among them instead)
        a = op.Abs(diff)
        ax = ints([-1])
        raw = op.ReduceMax(a, ax, keepdims=1)
        m = stop_gradient(raw)
        hit = op.Cast(op.Equal(a, m), to=dt)
        ties_whole = op.Add(m, op.ReduceSum(op.Mul(stop_gradient(hit), op.Sub(a, stop_gradient(a))), ax, keepdims=1))
        # a - a is NaN at an infinite element: rows whose max is not finite keep ReduceMax
        finite = op.Equal(op.Sub(m, m), const(0.0, dt))
        return op.Squeeze(op.Where(finite, ties_whole, raw), ax)

    def cdist_forward(x1: TFloat, x2: TFloat, p: float = 2.0, compute_mode: Optional[int] = None) -> TFloat:
        # torch.cdist (aten::cdist) and _cdist_forward: aten::cdist kept whole, since its
        # decomposition differentiates _euclidean_dist's Sqrt (NaN at a zero distance: cdist(x, x)
        # with more than 25 rows) where eager's _euclidean_dist_backward takes 0 there.
        # eager (Distance.cpp cdist_impl): p 2 through _euclidean_dist with compute_mode 1, or
        # with the default mode where either input has more than 25 rows; otherwise the norm of
        # every difference, with _cdist_backward's gradient (p inf: every tie gets the whole dy).
        # torchlib has no rule. Row counts are sizes of the call: with both paths possible the
        # choice is made in the graph, each path reading zeros where it is not taken (its
        # backward then adds nothing, not even 0 * inf).
        mode = 0 if compute_mode is None else int(compute_mode)
        p = float(p)
        dt = x1.dtype
        rank = len(x2.shape)

        def direct(a, b):
            diff = op.Sub(op.Unsqueeze(a, ints([-2])), op.Unsqueeze(b, ints([-3])))
            if math.isinf(p):
                return inf_norm_ties_whole(diff, dt)
            return p_norm(diff, p, [-1], False, dt)

        if p == 0.0:
            # eager's _cdist_backward gives p 0 a zero gradient (present, unlike vector_norm's):
            # a Where whose never-true condition the graph cannot fold sends it 0
            count = direct(x1, x2)
            reach = op.ReduceSum(op.Sub(op.Unsqueeze(x1, ints([-2])), op.Unsqueeze(x2, ints([-3]))), ints([-1]),
                                 keepdims=0)
            return op.Where(op.IsNaN(count), reach, count)
        if p != 2.0 or mode == 2:
            return direct(x1, x2)
        if mode == 1:
            return euclidean_dist_mm(x1, x2, rank, dt)
        r1, r2 = x1.shape[-2], x2.shape[-2]
        if isinstance(r1, int) and isinstance(r2, int):
            if r1 > CDIST_MM_ROWS or r2 > CDIST_MM_ROWS:
                return euclidean_dist_mm(x1, x2, rank, dt)
            return direct(x1, x2)
        limit = ints([CDIST_MM_ROWS])
        rows = lambda x: op.Shape(x, start=-2, end=-1)
        use_mm = op.Or(op.Greater(rows(x1), limit), op.Greater(rows(x2), limit))
        zero = const(0.0, dt)
        on_mm = lambda x: op.Where(use_mm, x, zero)
        off_mm = lambda x: op.Where(use_mm, zero, x)
        return op.Where(use_mm, euclidean_dist_mm(on_mm(x1), on_mm(x2), rank, dt), direct(off_mm(x1), off_mm(x2)))

    return {
        torch.ops.aten.linalg_vector_norm.default: vector_norm,
        torch.ops.aten._cdist_forward.default: cdist_forward,
        torch.ops.aten.cdist.default: cdist_forward,
    }


def translations(op, ir, stop_gradient):
    """{aten op: rule} of this family."""
    return {**distances(op, ir, stop_gradient)}
