"""The torch.export path's audit of a decomposed program: every aten op it holds must be reviewed
against torchlib's translation for what eager training means (``REVIEWED``), and some are
checked per call site (``_CHECKS``: an argument torchlib drops is refused by name)."""
import operator

import torch

from . import compat

from .rules import aten as aten_rules, rnn_onnxscript
from .errors import ExportError, UnsupportedModelError
from .fx_passes import _const_arg, _meta_val
from .shape_guard import _size_expr
from .errors import _user_line


def _engine_ops():
    from .. import _C
    return {(d or "", n) for d, n in _engine_op_names(_C)}


def _engine_op_names(C):
    names = C.op_attributes()
    out = []
    for key in names:
        if isinstance(key, tuple):
            out.append(key)
        elif "::" in key:
            d, n = key.split("::", 1)
            out.append((d, n))
        else:
            out.append(("", key))
    return out


def _check_ops(module, proto):
    """Refuse, by name, ONNX ops the engine does not implement (also inside local functions,
    which the engine's importer does not inline)."""
    if proto.functions:
        names = ", ".join(sorted({f.name for f in proto.functions}))
        raise ExportError(f"the torch.export capture of {type(module).__name__} holds ONNX local functions "
                          f"({names}), which ortmod's engine does not take")


def _getitem_users(node, index):
    return [u for u in node.users if u.target is operator.getitem and u.args[1] == index and u.users]


def _check_batch_norm(node):
    if _getitem_users(node, 1) or _getitem_users(node, 2):
        return "its saved mean / inverse std are read by the forward"
    return None


def _check_rnn(node):
    # (input, hx, params, has_biases, num_layers, dropout, train, ...): eager applies dropout
    # between layers only, none with one layer
    layers, dropout, train = node.args[4], node.args[5], node.args[6]
    if dropout and train and layers != 1:
        return "dropout between recurrent layers in training mode is dropped by the ONNX translation"
    return None


def _check_one_float_dtype(node):
    # ortmod's distance rules compute in their inputs' one dtype (eps, p as its constants);
    # eager promotes mixed ones
    dtypes = {v.dtype for v in map(_meta_val, node.args) if isinstance(v, torch.Tensor) and v.is_floating_point()}
    if len(dtypes) > 1:
        return f"inputs of {sorted(map(str, dtypes))}: ortmod takes them in one float dtype (cast them first)"
    return None


def _check_cross_entropy(node):
    # ortmod's rule takes label_smoothing and probability targets as eager does; what eager
    # raises on is refused here rather than computed
    ls = _const_arg(node, 5, "label_smoothing", 0.0)
    if not isinstance(ls, (int, float)) or not 0.0 <= ls <= 1.0:
        return f"label_smoothing {ls!r} (eager takes a number in [0, 1])"
    target, x = _meta_val(node.args[1]), _meta_val(node.args[0])
    if isinstance(target, torch.Tensor) and target.is_floating_point() and _const_arg(node, 4, "ignore_index", -100) >= 0:
        return "ignore_index with probability targets (eager raises)"
    if isinstance(target, torch.Tensor) and target.is_floating_point() and isinstance(x, torch.Tensor) \
            and target.dtype != x.dtype:
        return (f"probability targets of {target.dtype} for an input of {x.dtype} (eager computes in the "
                "promoted dtype; cast them to one dtype)")
    return None


def _check_pad(node):
    # torchlib's Pad: constant, reflect, edge (replicate), wrap (circular); a negative pad crops
    # (eager's meaning in every mode, and the engine's Pad and PadGrad). Pads traced as symbols
    # (Swin pads to a multiple of its window) go through torchlib's _process_padding, which
    # orders them as it orders numbers; circular ones are not taken: ortmod's rule crops first
    # by the negative pads, and needs their signs.
    pads, mode = node.args[1], _const_arg(node, 2, "mode", "constant")
    if mode not in ("constant", "reflect", "replicate", "circular"):
        return f"mode {mode!r} is not reviewed on this path"
    if mode == "circular" and not all(isinstance(p, int) for p in pads):
        return "only constant circular paddings are reviewed on this path"
    return None


def _check_cumsum(node):
    val = _meta_val(node.args[0])
    if isinstance(val, torch.Tensor) and not val.is_floating_point() and val.dtype != torch.int64 \
            and node.kwargs.get("dtype") is None:
        return f"cumsum of {val.dtype} accumulates in int64 in eager, in {val.dtype} in the ONNX translation"
    return None


def _clamp_mode_missing(node):
    # a torch whose clamp gradient at a bound none of ortmod's rules reproduces (compat.clamp_semantics)
    kind = "tensor" if str(node.target).endswith(".Tensor") else "number"
    try:
        compat.require_clamp_mode(kind)
    except compat.TorchFeatureMissing as e:
        return str(e)
    return None


def _check_clamp_tensor(node):
    # clamp.Tensor(self, min, max): ortmod's rule is Clip, for 0-d (or absent) bounds; a larger
    # bound would be Max / Min, whose gradient at ties is not clamp's
    missing = _clamp_mode_missing(node)
    if missing or node.target is not torch.ops.aten.clamp.Tensor:
        return missing
    for k, name in ((1, "min"), (2, "max")):
        bound = node.args[k] if len(node.args) > k else node.kwargs.get(name)
        val = _meta_val(bound)
        if isinstance(val, torch.Tensor) and val.dim() != 0:
            return f"clamp with a {name} tensor of more than one element is not reviewed (Max / Min halve the gradient at ties)"
    return None


def _check_arange(node):
    # ortmod's rule (zoo_translations): Python bounds give eager's values as a constant; a
    # symbolic bound takes Range over int64, exact for integers only
    bounds = [a for a in node.args[:3]] + [v for k, v in node.kwargs.items() if k in ("start", "end", "step")]
    symbolic = [b for b in bounds if isinstance(b, (torch.fx.Node, torch.SymInt, torch.SymFloat))]
    if not symbolic:
        return None
    def fractional(b):
        if isinstance(b, torch.fx.Node):
            b = b.meta.get("val")
        return isinstance(b, (float, torch.SymFloat))
    if any(fractional(b) for b in bounds):
        return ("a bound computed from sizes beside a fractional bound or step: eager computes start + i * step "
                "in double, which ortmod reproduces for constant bounds only")
    return None


def _check_clamp_min(node):
    # torchlib: a number or a 0-d bound gives Clip (torch.clamp's rule); a larger bound gives Max,
    # whose gradient at ties is not clamp_min's
    missing = _clamp_mode_missing(node)
    if missing or node.target is torch.ops.aten.clamp_min.default:
        return missing
    bound = node.args[1] if len(node.args) > 1 else None
    val = _meta_val(bound)
    if isinstance(val, torch.Tensor) and val.dim() == 0:
        return None
    return "clamp_min with a tensor bound translates to Max, whose gradient at ties is not clamp_min's"


def _check_local_scalar_dense(node):
    # the translator types a Python float as float32: a float64 .item() stays exact only where
    # it goes straight into a tensor op (scalar_tensor casts it to that op's dtype)
    val = _meta_val(node.args[0])
    if isinstance(val, torch.Tensor) and val.dtype == torch.float64:
        others = sorted({str(u.target) for u in node.users if u.target is not torch.ops.aten.scalar_tensor.default})
        if others:
            return (f"a Python number from a float64 tensor used in Python arithmetic ({', '.join(others)}) "
                    "is computed in float32 by the ONNX translation")
    return None


def _check_index_put(node):
    indices = node.args[1]
    vals = [_meta_val(i) for i in indices]
    if not any(isinstance(v, torch.Tensor) and v.dtype == torch.bool for v in vals):
        return None
    values = _meta_val(node.args[2])
    one_mask = len(indices) == 1 and isinstance(vals[0], torch.Tensor) and vals[0].dtype == torch.bool
    if not one_mask or not isinstance(values, torch.Tensor):
        return ("boolean-mask index assignment is taken only with one mask (x[mask] = v or x[mask] = values per "
                "selected slice); several indices with a mask among them are not reviewed")
    return None


def _check_avg_pool(node):
    if _const_arg(node, 6, "divisor_override", None) is not None and _const_arg(node, 4, "ceil_mode", False):
        return ("divisor_override with ceil_mode is not reproduced by ortmod (a window past the padding "
                "sums fewer taps)")
    return None


def _check_constant_pad(node):
    if not all(isinstance(p, int) for p in node.args[1]):
        return "only constant paddings are reviewed on this path"
    return None


def _check_adaptive_pool(node):
    # an output size is a positive constant, or the input's own size (output_size=None there:
    # ortmod's rule takes a size it cannot read as that, the identity)
    sizes = node.args[1]
    val = _meta_val(node.args[0])
    for k, d in enumerate(sizes):
        if isinstance(d, int):
            if d <= 0:
                return f"output size {d} is not reviewed on this path"
            continue
        same = isinstance(d, torch.fx.Node) and isinstance(val, torch.Tensor) and \
            str(d.meta.get("val")) == str(val.shape[val.dim() - len(sizes) + k])
        if not same:
            return "an output size computed in the graph (not a constant nor the input's size) is not reviewed"
    return None


def _check_fractional_max_pool(node):
    samples = node.args[3] if len(node.args) > 3 else None
    if not (isinstance(samples, torch.fx.Node) and samples.op == "placeholder"):
        return ("its windows are drawn from torch's random generator on every call, which the engine cannot "
                "replay; pass _random_samples to fix them")
    x, u = node.args[0].meta.get("val"), samples.meta.get("val")
    if not (isinstance(x, torch.Tensor) and isinstance(u, torch.Tensor) and u.dtype == x.dtype and u.dim() == 3):
        return "ortmod needs the random samples as a (N, C, dims) tensor in the input's dtype (as eager's kernel reads them)"
    if not all(isinstance(v, int) for v in [*node.args[1], *node.args[2]]):
        return "ortmod needs kernel_size and output_size as constants"
    return None


def _check_div_mode(node):
    # div.Tensor_mode: ortmod's rule takes integers, floor and trunc (eager's integer kernels);
    # float rounding (eager's div_floor_floating adjusts fmod's quotient) is not reviewed
    if node.target is not torch.ops.aten.div.Tensor_mode:
        return None
    val = _meta_val(node.args[0])
    mode = node.kwargs.get("rounding_mode", node.args[2] if len(node.args) > 2 else None)
    if not isinstance(val, torch.Tensor) or val.is_floating_point() or val.is_complex() or val.dtype == torch.bool \
            or mode not in ("floor", "trunc"):
        return (f"division with rounding_mode={mode!r} of {getattr(val, 'dtype', None)}: ortmod reviewed integer floor "
                "and trunc division only")
    return None


def _check_extremum_all(node):
    # max() / min() over every element and along a dim (max.dim, min.dim); the other overloads
    # (max.other, ...) are not reviewed
    if node.target in (torch.ops.aten.max.default, torch.ops.aten.min.default, torch.ops.aten.max.dim,
                       torch.ops.aten.min.dim):
        return None
    return "this overload is not reviewed on this path"


def _check_upsample_linear(node):
    val = _meta_val(node.args[0])
    if isinstance(val, torch.Tensor) and val.dtype not in (torch.float32, torch.float64):
        return (f"linear interpolation of {val.dtype}: eager keeps the weights in {val.dtype} and computes in it, "
                "ortmod reproduces float32 and float64 only")
    return None


def _check_upsample_nearest(node):
    # eager's 2-d and 3-d nearest kernels pick their index arithmetic by the input's memory
    # layout (rules/onnxscript.nearest_takes_channels_last_kernel); mark_channels_last_nearest
    # gives the channels-last kernel's inputs its rule, read from the traced strides
    val = _meta_val(node.args[0])
    if not isinstance(val, torch.Tensor) or val.dim() < 4:
        return None
    from .rules.onnxscript import nearest_kernel_of_fake
    if nearest_kernel_of_fake(val) is None:
        return ("an input whose memory layout is not known at export (symbolic strides): eager picks its kernel's "
                "index arithmetic by memory layout (channels-last with more than 3 channels reads at another index)")
    return None


def _check_rnn_layout(node):
    # lstm/gru/rnn_*.input(input, hx, params, has_biases, num_layers, dropout, train,
    # bidirectional, batch_first). ortmod's rules (_export_rules_rnn.py) read (W_ih, W_hh[, b_ih,
    # b_hh]) per layer and direction, and nn.LSTM(proj_size > 0)'s W_hr after them (torchlib's
    # LSTM rule would read it as the next direction's weights); any other count is refused. The
    # packed-sequence overloads (.data) are not reviewed.
    name = node.target.name()
    if not name.endswith(".input"):
        return None
    params, has_biases, num_layers, bidirectional = node.args[2], node.args[3], node.args[4], node.args[7]
    per = 4 if has_biases else 2
    count = num_layers * (2 if bidirectional else 1)
    if len(params) == count * (per + 1) and name.startswith("aten::lstm"):
        # proj_size > 0: ortmod's rule unrolls over the sequence, whose length it needs as a number
        val = _meta_val(node.args[0])
        steps = _size_expr(val.shape[1 if node.args[8] else 0]) if isinstance(val, torch.Tensor) else None
        if not isinstance(steps, int):
            return "nn.LSTM(proj_size > 0) needs its sequence length fixed at export (ortmod unrolls it)"
        if not 0 < steps <= rnn_onnxscript.MAX_UNROLL:
            return (f"nn.LSTM(proj_size > 0) with a sequence of {steps} steps: ortmod unrolls 1 to "
                    f"{rnn_onnxscript.MAX_UNROLL}")
    elif len(params) != count * per:
        return f"{len(params)} weights for {num_layers} layer(s), bias={bool(has_biases)} are not reviewed"
    return _check_rnn(node)


def _check_baddbmm(node):
    beta, alpha = node.kwargs.get("beta", 1), node.kwargs.get("alpha", 1)
    if not all(isinstance(v, (int, float)) for v in (beta, alpha)):
        return "beta and alpha computed in the graph are not reviewed on this path (only numbers)"
    if alpha == 0:
        return ("alpha=0: eager's result depends on its kernel (BLAS skips the product, the small-matrix "
                "loop multiplies NaN by 0)")


def _check_nll_loss_forward(node):
    if _getitem_users(node, 1):
        return "its total_weight output is read, which the ONNX translation does not compute"
    return None


def _check_unfold(node):
    # torchlib's unfold builds its window offsets (range(size)) and the transpose from Python
    # numbers: a size or step traced as a symbol has none
    size, step = _const_arg(node, 2, "size", None), _const_arg(node, 3, "step", None)
    if not isinstance(size, int) or not isinstance(step, int):
        return f"size {size!r} and step {step!r} must be numbers, not sizes traced as symbols"
    return None


_CHECKS = {
    "aten::upsample_nearest2d": _check_upsample_nearest, "aten::upsample_nearest3d": _check_upsample_nearest,
    "aten::_upsample_nearest_exact2d": _check_upsample_nearest, "aten::_upsample_nearest_exact3d": _check_upsample_nearest,
    "aten::upsample_linear1d": _check_upsample_linear, "aten::upsample_bilinear2d": _check_upsample_linear,
    "aten::upsample_trilinear3d": _check_upsample_linear,
    "aten::baddbmm": _check_baddbmm,
    "aten::div": _check_div_mode, "aten::max": _check_extremum_all, "aten::min": _check_extremum_all,
    "aten::clamp": _check_clamp_tensor,
    "aten::fractional_max_pool2d": _check_fractional_max_pool, "aten::fractional_max_pool3d": _check_fractional_max_pool,
    "aten::adaptive_avg_pool1d": _check_adaptive_pool, "aten::adaptive_avg_pool2d": _check_adaptive_pool,
    "aten::adaptive_avg_pool3d": _check_adaptive_pool, "aten::adaptive_max_pool2d": _check_adaptive_pool,
    "aten::adaptive_max_pool3d": _check_adaptive_pool,
    "aten::constant_pad_nd": _check_constant_pad, "aten::unfold": _check_unfold,
    "aten::avg_pool2d": _check_avg_pool, "aten::avg_pool3d": _check_avg_pool,
    "aten::index_put": _check_index_put,
    "aten::_local_scalar_dense": _check_local_scalar_dense,
    "aten::clamp_min": _check_clamp_min,
    "ortmod::clamp_number": _clamp_mode_missing,
    "aten::cumsum": _check_cumsum,
    "aten::arange": _check_arange,
    "aten::pad": _check_pad,
    "aten::cross_entropy_loss": _check_cross_entropy, "ortmod::cross_entropy_loss": _check_cross_entropy,
    "aten::_native_batch_norm_legit_functional": _check_batch_norm,
    "aten::cdist": _check_one_float_dtype,
    "aten::_cdist_forward": _check_one_float_dtype,
    # norms and recurrent layers (issue 16)
    "aten::_native_batch_norm_legit": _check_batch_norm,     # .no_stats: its saved mean / invstd
    # _check_rnn_layout ends with _check_rnn (the dropout and proj_size refusals)
    "aten::lstm": _check_rnn_layout, "aten::gru": _check_rnn_layout, "aten::rnn_tanh": _check_rnn_layout,
    "aten::rnn_relu": _check_rnn_layout,
    # activations and elementwise losses (issue 16, helper "act")
    "aten::nll_loss_forward": _check_nll_loss_forward,
}
# the rules written once for both paths carry their checks (rules/emitter.py)
if set(_CHECKS) & set(aten_rules.audit_checks()):
    raise RuntimeError(f"ops checked twice: {sorted(set(_CHECKS) & set(aten_rules.audit_checks()))}")
_CHECKS.update(aten_rules.audit_checks())

AUDIT_LOG = None     # a set: while set, every op the audit sees is added (to grow the reviewed list)


def _audit(module, ep):
    for gm in ep.graph_module.modules():
        if not isinstance(gm, torch.fx.GraphModule):
            continue
        for node in gm.graph.nodes:
            if node.op != "call_function":
                continue
            target = node.target
            name = target.name() if isinstance(target, compat.OpOverload) else getattr(target, "__name__", str(target))
            if AUDIT_LOG is not None:
                AUDIT_LOG.add(name)
            base = name.split(".", 1)[0]
            check = _CHECKS.get(base)
            why = check(node) if check is not None else None
            # by the overload's own name: an overload of a reviewed op is another schema, with its
            # own torchlib rule (clamp.Tensor was Max where clamp is Clip)
            unreviewed = why is None and name not in REVIEWED and target not in _PY_OPS
            if unreviewed:
                why = "not yet reviewed for the torch.export capture path"
            if why is not None:
                where = _user_line(node.meta.get("stack_trace") or "")
                where = f" (at {where})" if where else ""
                error = UnsupportedModelError(
                    f"{type(module).__name__}: {name}{where}: {why}; ORTMOD_CAPTURE=torchscript captures with the "
                    "TorchScript exporter instead")
                if unreviewed:      # an op this path cannot run, as an op the engine lacks on the other path
                    error.fallback_category = "FALLBACK_UNSUPPORTED_ONNX_MODEL"
                raise error


_PY_OPS = frozenset({operator.getitem, operator.add, operator.sub, operator.mul, operator.floordiv,
                     operator.truediv, operator.mod, operator.neg, operator.eq, operator.ne, operator.lt,
                     operator.le, operator.gt, operator.ge})

# aten ops (after decomposition) whose torchlib translation was read and means what eager computes
# for every argument (or whose dropped arguments _CHECKS refuses)
REVIEWED = frozenset({
    "getitem", "aten::sym_size.int", "aten::sym_numel", "aten::sym_stride.int",
    # data-dependent sizes (issue 37): NonZero + Transpose, the engine's segmented plans (plan/plan.h);
    # its count is an unbacked symbol, which no guard reads (shape_guard: _free_unbacked)
    "aten::nonzero",
    "aten::masked_select",     # ortmod's rule (rules/indexing_onnxscript): GatherND at NonZero
    # elementwise (add/sub with alpha: ortmod's rule, alpha in the op's dtype)
    "aten::add.Tensor", "aten::sub.Tensor", "aten::mul.Tensor", "aten::div.Tensor", "aten::neg", "aten::relu",
    "aten::tanh", "aten::sigmoid", "aten::exp", "aten::log", "aten::sqrt", "aten::rsqrt", "aten::abs",
    "aten::pow.Tensor_Scalar", "aten::pow.Tensor_Tensor", "aten::gelu", "aten::erf",
    "aten::ne.Tensor", "aten::ne.Scalar", "aten::le.Tensor", "aten::lt.Tensor", "aten::ge.Tensor", "aten::gt.Tensor", "aten::eq.Tensor",
    "aten::le.Scalar", "aten::lt.Scalar", "aten::ge.Scalar", "aten::gt.Scalar", "aten::eq.Scalar",
    "aten::bitwise_and.Tensor", "aten::bitwise_or.Tensor", "aten::bitwise_not", "aten::logical_not",
    "aten::where.self", "aten::clone", "aten::_to_copy", "aten::alias",
    # from the type-promotion pass; scalar_tensor is ortmod's rule (a Python number made a
    # constant in the op's dtype, not a float32 constant cast to it)
    "prims::convert_element_type", "aten::scalar_tensor",
    # shapes
    "aten::view", "aten::_unsafe_view", "aten::reshape", "aten::transpose.int", "aten::stack",
    "aten::triu", "aten::tril", "aten::gather", "aten::index_select", "aten::einsum", "aten::clamp",
    "aten::masked_fill.Scalar", "aten::zeros_like", "aten::ones_like", "aten::full_like", "aten::permute", "aten::unsqueeze",
    "aten::squeeze.dim", "aten::expand", "aten::slice.Tensor", "aten::select.int", "aten::cat",
    "aten::cumsum", "aten::arange", "aten::arange.start", "aten::arange.start_step", "aten::new_ones", "aten::ones", "aten::zeros", "aten::full",
    # nn
    "aten::linear", "aten::addmm", "aten::mm", "aten::matmul", "aten::bmm", "aten::conv2d", "aten::conv1d",
    "aten::max_pool2d", "aten::mean.dim", "aten::sum.dim_IntList", "aten::mean", "aten::sum",
    "aten::layer_norm", "aten::native_dropout", "aten::softmax.int", "aten::_softmax", "aten::log_softmax.int",
    "aten::_log_softmax", "aten::index.Tensor",
    "aten::_native_batch_norm_legit_functional", "aten::_native_batch_norm_legit_no_training",
    "aten::scaled_dot_product_attention", "ortmod::stop_gradient", "aten::pad",
    "ortmod::python_op",     # a user's autograd.Function (its own forward and backward, in PyTorch)
    # torch's CTC loss: the engine's CTCLoss node (_export_ctc.py; eager's reduction traced around it)
    "ortmod::ctc_loss",
    # a clamp by numbers where eager's number and tensor kernels differ at the bound (2.14): the
    # number kernel's rule, its bounds 0-d tensors of the clamped dtype (rules/onnxscript.number_clamps_back)
    "ortmod::clamp_number",
    # nearest upsampling of an input eager hands to its channels-last kernel (its own index
    # arithmetic: rules/onnxscript.mark_channels_last_nearest)
    "ortmod::nearest_channels_last",
    # selection and norms (TopK, ortmod's Sort, ReduceLogSumExp; clamp_min is Clip);
    # linalg_vector_norm: ortmod's rule, every order with eager's gradient at zeros (the
    # TorchScript path's _p_norm), keepdim without a dim, dtype
    "aten::topk", "aten::sort", "aten::sort.stable", "aten::linalg_vector_norm", "aten::logsumexp", "aten::clamp_min",
    # ortmod's rules (rules/*_onnxscript.py): .item() without a gradient, scatter_add of a larger src,
    # var/std dividing by max(0, N - correction)
    "aten::_local_scalar_dense", "aten::scatter_add", "prims::var",
    # torchlib's rules as they are: Reshape + Expand; ScatterND (accumulate: repeated indices
    # add; otherwise the last write wins, eager's deterministic order; negative indices wrap)
    "prims::broadcast_in_dim", "aten::index_put",
    # x[:, a:b] = v: ScatterND at the slice's positions (Slice of Range: torch's clamping of
    # start/end, the step), no duplicates; gradients GatherND / ScatterND(0), eager's
    "aten::slice_scatter", "aten::copy",     # copy: ortmod's rule (src broadcast to self)
    # x[:, 2] = v: ScatterElements of Unsqueeze(v) at the index (negative wraps), as eager
    "aten::select_scatter",
    # convolution: torchlib's Conv / ConvTranspose (symmetric pads per dim, strides, dilations,
    # groups, output_padding; an unbatched input unsqueezed; the engine takes them all); conv3d
    # ortmod's rule (torchlib's builds a wrong-shaped zero bias)
    "aten::convolution", "aten::conv3d",
    # pools: MaxPool (ceil_mode, dilations; the engine's windows and NaN are torch's), its
    # indices made per-plane as torch's (ONNX's flat index minus each plane's first);
    # AveragePool (count_include_pad, ceil_mode: the engine's divisor is torch's); avg_pool2d/3d
    # ortmod's rule (divisor_override)
    "aten::max_pool1d", "aten::max_pool3d", "aten::max_pool1d_with_indices", "aten::max_pool2d_with_indices",
    "aten::max_pool3d_with_indices", "aten::avg_pool1d", "aten::avg_pool2d", "aten::avg_pool3d",
    # Pad(constant) in torch's last-dim-first order (padding="same" with an even kernel)
    "aten::constant_pad_nd",
    # sign: torch's (NaN -> 0, gradient 0); LPPool's sign(x) * relu(|x|)
    "aten::sign",
    # ortmod's rule: separable MatMuls by each dim's window-average matrix (built from the shape)
    "aten::adaptive_avg_pool1d", "aten::adaptive_avg_pool2d", "aten::adaptive_avg_pool3d",
    # ortmod's rule: per dim, per window a Slice and eager's argmax (first max, last NaN), the
    # indices flat over the plane (AdaptiveMaxPool1d is adaptive_max_pool2d)
    "aten::adaptive_max_pool2d", "aten::adaptive_max_pool3d",
    # ortmod's rule (the TorchScript path's): taps gathered into blocks, MaxPool, indices mapped back
    "aten::fractional_max_pool2d", "aten::fractional_max_pool3d",
    # any / all: ortmod's rules (rules/onnxscript.zoo_translations), 0/1 values reduced with
    # ReduceMax (torch's truth: 0 and -0 false, NaN true), over no element any False and all True
    # as eager (torchlib's any reads ReduceMax's lowest value as True); no gradient through a bool
    "aten::all", "aten::all.dim", "aten::all.dims", "aten::any", "aten::any.dim", "aten::any.dims",
    # ortmod's rules: max/min along a dim read the value at ArgMax/ArgMin's index (the first
    # extremum or first NaN, eager's; the gradient goes there alone, torchlib's ReduceMax shares
    # it among ties); argmax/argmin keep every dim for keepdim without a dim
    "aten::max.dim", "aten::min.dim", "aten::argmax", "aten::argmin",
    # ortmod's rules: max() / min() over every element as amax / amin (ReduceMax / ReduceMin);
    # div.Tensor_mode of integers, eager's floor and trunc (float rounding refused by _CHECKS)
    "aten::max", "aten::min", "aten::div.Tensor_mode",
    # ortmod's rules (zoo_translations): clamp and clamp_min by tensors (_CHECKS: a bound in
    # float64), upsampling's .vec overloads (output_size or scale factors, eager's indices)
    "aten::clamp.Tensor", "aten::clamp_min.Tensor",
    "aten::upsample_nearest1d.vec", "aten::upsample_nearest2d.vec", "aten::upsample_nearest3d.vec",
    "aten::_upsample_nearest_exact1d.vec", "aten::_upsample_nearest_exact2d.vec",
    "aten::_upsample_nearest_exact3d.vec", "aten::upsample_linear1d.vec", "aten::upsample_bilinear2d.vec",
    "aten::upsample_trilinear3d.vec",
    # torchlib's rules as they are: a Python number a constant in self's dtype from its Python
    # value (mul.Scalar; add/sub.Scalar with ortmod's alpha, as add/sub.Tensor); t: Transpose
    # of a 2-d tensor, others as they are; flip: Slice with step -1 (the engine's Slice and
    # SliceGrad walk backwards); minimum/maximum: Min/Max (NaN propagates, and the engine's
    # gradient is eager's: ties share dy, a NaN comparison gives both all of it)
    "aten::mul.Scalar", "aten::add.Scalar", "aten::sub.Scalar", "aten::t", "aten::flip",
    "aten::minimum", "aten::maximum",
    # ortmod's rule (the TorchScript path's): the direct norm of each difference with
    # _cdist_backward's gradient, or eager's matrix-product path for p 2 (compute_mode, rows);
    # torch.cdist kept whole (its decomposition's Sqrt is NaN's gradient at a zero distance)
    "aten::_cdist_forward", "aten::cdist",
    # ortmod's rule (the TorchScript path's): label_smoothing, probability targets and an
    # unbatched input as eager's cross_entropy_loss; class targets of a batch are torchlib's
    # SoftmaxCrossEntropyLoss (weight, ignore_index, reductions: the engine's are eager's);
    # ortmod::cross_entropy_loss is an unbatched one kept opaque (unbatched_cross_entropy_loss)
    "aten::cross_entropy_loss", "ortmod::cross_entropy_loss",
    # ortmod's rules: eager's CPU kernels' indices and weights computed in the graph from the
    # call's sizes (Gathers; nearest's gradient to eager's backward index where it differs)
    "aten::upsample_nearest1d", "aten::upsample_nearest2d", "aten::upsample_nearest3d",
    "aten::_upsample_nearest_exact1d", "aten::_upsample_nearest_exact2d", "aten::_upsample_nearest_exact3d",
    "aten::upsample_linear1d", "aten::upsample_bilinear2d", "aten::upsample_trilinear3d",
    # torchlib's rules as they are: Sin / Cos (rotary embeddings); type_as: CastLike of other,
    # made Cast to its dtype (_lower_cast_like; an unknown dtype is refused at import);
    # new_zeros: ConstantOfShape, in self's dtype unless dtype is given (no gradient, as eager)
    "aten::sin", "aten::cos", "aten::type_as", "aten::new_zeros",
    # silu: torchlib's x * Sigmoid(x), eager's x / (1 + exp(-x)) and its gradient up to rounding;
    # ceil: Ceil (gradient 0, as eager's); fill: ortmod's rule (Expand of value, self's dtype)
    "aten::silu", "aten::ceil", "aten::fill.Tensor", "aten::fill.Scalar",
    # repeat: torchlib's Expand to len(repeats) dims (eager's leading new dims) then Tile; the
    # engine's Tile and Expand gradients sum the copies, as eager's
    "aten::repeat",
    # norms and recurrent layers (issue 16)
    # ortmod's rule (rules/norms_onnxscript.py), the decomposition of group_norm and instance_norm
    # (rules/aten_norms.py): BatchNorm without running stats (batch statistics, differentiated through)
    "aten::_native_batch_norm_legit.no_stats",
    # torchlib's bilinear: x1 (in1 -> out*in2 by the permuted weight) then a batched MatMul with
    # x2, plus the bias; eager's sum_ij x1_i W_kij x2_j + b_k for any leading dims and no bias
    "aten::bilinear",
    # ortmod's LSTM/GRU/RNN (_export_rules_rnn.py): one ONNX node per layer, the engine's, as
    # the TorchScript path exports (torchlib's LSTM/GRU read the hidden size from a state whose
    # dims may be symbolic); _CHECKS refuses projections and dropout between layers in training
    "aten::lstm.input", "aten::gru.input", "aten::rnn_tanh.input", "aten::rnn_relu.input",
    # ---- the model zoo's ops (issue 16) ----
    # Unsqueeze, Expand by the repeats after dim, Reshape: eager's order (each element repeated
    # in place); dim=None flattens first; a negative dim wraps; output_size is only a hint
    "aten::repeat_interleave.self_int",
    # sym_min / sym_max: Min / Max of int64 sizes
    "sym_min", "sym_max",
    # ortmod's rules (rules/onnxscript.zoo_translations):
    # - scalar_tensor (listed above; every number the type-promotion pass makes a tensor), where
    #   and fill with a number: the number in the tensor's dtype from its int64 or double
    #   (torchlib's reach the graph as float32 constants: 0.1 in float64 was 0.10000000149);
    # - fill with a tensor (torchlib's is a local function); ceil (an int is its own ceiling);
    # - remainder: Mod(fmod=0), eager's fmod-and-adjust (torchlib's a - floor(a / b) * b rounds
    #   otherwise); the engine refuses a divisor's gradient by name;
    # - baddbmm: beta=0 does not read self (alpha=0 refused by _CHECKS);
    # - view_copy: a view in the decomposed graph (_views_to_view_copies), torchlib's view rule
    "aten::where.ScalarOther", "aten::where.ScalarSelf", "aten::remainder.Scalar", "aten::remainder.Tensor",
    "aten::baddbmm", "aten::view_copy",
    # amin / amax: ortmod's rule, ReduceMin / ReduceMax (ties share the gradient, as eager; the
    # TorchScript path's one difference is left: a NaN row's gradient all at the NaN)
    "aten::amin", "aten::amax",
    # ---- activations and elementwise losses (issue 16, helper "act"): torchlib's rule where it
    # emits an engine op whose forward and backward are eager's (csrc/ops/misc.c, elementwise.c:
    # a select where torch selects, NaN taking the branch its comparison fails into)
    # PRelu with the weight reshaped to (1, C, 1, ...) (a 0-d input: squeezed; a vector: along
    # it): eager's channel dim 1; gradients x > 0 ? dy : w dy and sum of x dy where x <= 0
    "aten::prelu",
    # nn.Threshold decomposes to where(x <= threshold, value, x): Where's gradient is dy where x
    # > threshold or NaN, eager's threshold_backward
    "aten::where.ScalarSelf",
    # Sub, Mul(d, d) (gradient 2 d dy, exact), ReduceMean/ReduceSum over every element
    # (target broadcast as eager's TensorIterator does)
    "aten::mse_loss",
    # NegativeLogLikelihoodLoss(weight, ignore_index, reduction): (N, C, d1..dk) and the
    # unbatched (C,) / 0-d target forms; weighted mean divides by the weights of the targets
    # not ignored (NaN when all are, as eager), the engine's gradient is eager's; nll_loss_nd
    # (what F.nll_loss traces to) by the same rule, kept whole (rules/*_onnxscript.py), and
    # nll_loss_forward (unbatched inputs; its total_weight output is torchlib's placeholder:
    # _CHECKS refuses a graph that reads it)
    "aten::nll_loss", "aten::nll_loss_nd", "aten::nll_loss_forward",
    # Expand(0) in self's shape and dtype: eager's contents are unspecified; HingeEmbeddingLoss
    # and CosineEmbeddingLoss fill it before reading
    "aten::empty_like",
    # ortmod's rules (rules/*_onnxscript.py): torchlib's are ONNX local functions, lose small
    # values (log1p), give xlogy(0, 0) a NaN gradient
    "aten::hardswish", "aten::mish", "aten::glu", "aten::log1p", "aten::xlogy.Tensor",
    # ortmod's rule: the engine's Erf (torchlib's is a local function)
    "aten::special_erf",
    # torchlib's rules as they are: Reciprocal (the TorchScript path's op); roll, each (shift,
    # dim) a Concat of two Slices at Mod(-shift, size) (Python's sign, 0 <= r < size), flattened
    # first without dims: eager's data movement and, through Slice and Concat, its gradient
    "aten::reciprocal", "aten::roll",
    # torchlib's rules as they are (issue 37): mv and dot are MatMul of a matrix and a vector and
    # of two vectors (numpy's 1-d rules, eager's shapes; the engine's MatMul gradient for a 1-d
    # operand is the outer product / the other vector scaled, as eager's; spectral_norm's power
    # iteration and sigma); unfold is a Gather along dim of the windows' indices (Range of the
    # starts, 0 .. L - size by step, plus 0 .. size - 1) and a Transpose of the window axis to the
    # end: eager's (..., windows, ..., size) view, overlapping windows' gradients summed by
    # Gather's (step < size), the elements between windows none (step > size); _CHECKS refuses a
    # size or step traced as a symbol
    "aten::mv", "aten::dot", "aten::unfold",
}) | aten_rules.reviewed()     # the rules written once for both paths carry their review (rules/emitter.py)
