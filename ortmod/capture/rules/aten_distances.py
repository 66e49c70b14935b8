"""Distance rules written once for both capture paths (``emitter.aten_rule``): cosine_similarity."""
from .aten_losses import one_float_dtype
from .emitter import Tensor, aten_rule


def clamped_min_straight_through(e, n, eps):
    """max(n, eps) in value with the gradient of n itself: eager clamps the norms in place under
    NoGradGuard, so autograd differentiates them as if unclamped. eps + (n - n) keeps the value
    exactly eps and the gradient 1."""
    lifted = e.op("Add", e.op("Sub", n, e.stop_gradient(n)), eps)
    return e.op("Where", e.op("Less", n, eps), lifted, n)


@aten_rule("aten::cosine_similarity", checks=(one_float_dtype("x1", "x2"),),
           why="eager's straight-through clamp of the norms (torch's rules: Sqrt's NaN gradient at a zero vector)")
def cosine_similarity(e, x1: Tensor, x2: Tensor, dim: int = 1, eps: float = 1e-8):
    """eager (Distance.cpp, torch 2.x): x1, x2 expanded to one shape; n_i = ||x_i||_2 over dim
    (keepdim), each clamped to eps in place under no_grad; sum((x1 / n1) * (x2 / n2), dim).
    torch's TorchScript rule divides by max(sqrt(|x1|^2 |x2|^2), eps): Sqrt's gradient at a zero
    vector is inf * 0 = NaN, and its gradient below eps is a true clamp's, not eager's; the
    decomposition clamps with a gradient (0 below eps)."""
    dt = e.dtype(x1)
    x1e, x2e = e.op("Expand", x1, e.op("Shape", x2)), e.op("Expand", x2, e.op("Shape", x1))
    axes, eps_c = e.ints([dim]), e.const(eps, dt)
    n1 = clamped_min_straight_through(e, e.op("ReduceL2", x1e, axes, keepdims=1), eps_c)
    n2 = clamped_min_straight_through(e, e.op("ReduceL2", x2e, axes, keepdims=1), eps_c)
    return e.op("ReduceSum", e.op("Mul", e.op("Div", x1e, n1), e.op("Div", x2e, n2)), axes, keepdims=0)
