"""ortmod's export rule for CTC loss (``aten::ctc_loss``), which torch's TorchScript exporter
cannot convert: the per-sample negative log likelihoods are the engine's ``ortmod::CTCLoss``
(csrc/ops/ctc.c, eager's CPU recursions), and the reduction is done in the graph as eager's
ctc_loss does it around _ctc_loss (aten/src/ATen/native/LossCTC.cpp):

    mean: mean over the batch of loss_n / clamp_min(target_length_n, 1)   (in the loss's dtype)
    sum:  sum of loss_n
    none: loss_n (a scalar for an unbatched (T, C) input)

zero_infinity is the op's attribute: eager replaces an infinite loss by 0 and its backward gives
that sample no gradient, which CTCLoss and CTCLossGrad do. Both overloads are taken: lengths as
Python lists (constants in the trace, checked when the engine plans) and as tensors (graph
inputs, checked when the kernel runs).

``symbolics(registration, opset)`` returns {aten name: symbolic}; ``semantic_export``
registers them only while ortmod exports.

The torch.export path (``ORTMOD_CAPTURE=export``) reaches the same engine node another way:
torch has no fake kernel for ``aten._ctc_loss`` (its log_alpha's size is read from the target
lengths), so torch.export cannot trace eager's ctc_loss. While it traces, ``traced_ctc_loss``
takes the call instead (F.ctc_loss, torch.ctc_loss, aten.ctc_loss: capture.export's function
mode hands them here): the per-sample losses become the custom op ``ortmod::ctc_loss``, whose
fake kernel gives their shape ((N,), or () for an unbatched (T, C) input; symbolic N kept) and
whose translation (``export_translations``) is the CTCLoss node above; eager's reduction is
traced around it as ordinary aten ops (the same division and mean as the symbolic's).
``masked_targets`` gives the op Wav2Vec2ForCTC's ``labels.masked_select(mask)`` targets through
the node's mask input, as ``_masked_select_parts`` does on the TorchScript path."""
from typing import Optional

import torch

from .. import compat
from ..onnx_util import _concrete, _const, _dtype_of, _onnx_dtype
from ..errors import UnsupportedModelError

# eager's at::Reduction: None, Mean, Sum
_REDUCTIONS = {0: "none", 1: "mean", 2: "sum"}
_INDEX_DTYPES = (torch.int32, torch.int64)


def symbolics(registration, opset):
    return {"aten::ctc_loss": _ctc_loss_symbolic}


def _lengths(g, what, v):
    """input_lengths / target_lengths as an int64 (or int32) tensor value: a constant list, a
    list built in the trace, or a tensor (eager takes any integral dtype: cast to int64)."""
    from ..compat import symbolic_helper as sh
    from ..onnx_util import _refuse     # onnx_util's (what, why), not this module's _refuse(why)
    c = sh.maybe_get_const(v, "is")
    if not sh.is_value(c):
        return _const(g, [int(x) for x in (c if isinstance(c, (list, tuple)) else [c])], torch.int64)
    if sh.is_packed_list(v):
        items = [g.op("Cast", g.op("Reshape", x, _const(g, [1], torch.int64)), to_i=_onnx_dtype(torch.int64))
                 for x in sh.unpack_list(v)]
        return g.op("Concat", *items, axis_i=0) if items else _const(g, [], torch.int64)
    # the trace ran eager's ctc_loss, which refused lengths that are not integral; a dtype the
    # trace did not record (graph inputs) is cast like any integral one
    dt = _dtype_of(v, None)
    if dt is not None and (dt.is_floating_point or dt.is_complex or dt == torch.bool):
        _refuse("ctc_loss", f"{what} must be integral (eager: {what} must be integral)")
    return v if dt in _INDEX_DTYPES else g.op("Cast", v, to_i=_onnx_dtype(torch.int64))


def _masked_select_parts(targets):
    """(x, mask) when targets is torch.masked_select(x, mask) as torch's rule exports it
    (GatherND(x, Transpose(NonZero(Expand(mask, Shape(x)))))), else None. CTCLoss reads such
    targets through its mask input: NonZero's output length is data, which a planned engine
    cannot have (Wav2Vec2ForCTC's labels.masked_select(labels >= 0))."""
    from ..compat import symbolic_helper as sh
    node = targets.node()
    if node.kind() != "onnx::GatherND" or (node.hasAttribute("batch_dims") and sh.node_get(node, "batch_dims") != 0):
        return None
    x, idx = list(node.inputs())
    tr = idx.node()
    if tr.kind() != "onnx::Transpose" or list(sh.node_get(tr, "perm")) != [1, 0]:
        return None
    nz = next(tr.inputs()).node()
    if nz.kind() != "onnx::NonZero":
        return None
    mask = next(nz.inputs())
    return x, mask


def _ctc_loss_symbolic(g, log_probs, targets, input_lengths, target_lengths, blank, reduction, zero_infinity):
    from ..compat import symbolic_helper as sh
    from ..onnx_util import _refuse     # onnx_util's (what, why), not this module's _refuse(why)
    blank = sh.maybe_get_const(blank, "i")
    reduction = sh.maybe_get_const(reduction, "i")
    zero_infinity = sh.maybe_get_const(zero_infinity, "b")
    if sh.is_value(blank) or sh.is_value(reduction) or sh.is_value(zero_infinity):
        _refuse("ctc_loss", "ortmod keeps blank, reduction and zero_infinity only as constants")
    if int(reduction) not in _REDUCTIONS:
        _refuse("ctc_loss", f"unknown reduction {reduction}")
    dtype = _dtype_of(log_probs, None)
    if dtype not in (torch.float32, torch.float64):
        _refuse("ctc_loss", f"log_probs of dtype {dtype}: eager's ctc_loss takes float32 or float64")
    mask_parts = _masked_select_parts(targets)
    extra = ()
    if mask_parts is not None:
        targets, mask = mask_parts
        extra = (g.op("Cast", mask, to_i=_onnx_dtype(torch.bool)),)
    # eager moves the targets to int64 (targets.to(kLong)); int32 is read as it is
    if _dtype_of(targets, None) not in _INDEX_DTYPES:
        targets = g.op("Cast", targets, to_i=_onnx_dtype(torch.int64))
    il = _lengths(g, "input_lengths", input_lengths)
    tl = _lengths(g, "target_lengths", target_lengths)
    loss = g.op("ortmod::CTCLoss", log_probs, targets, il, tl, *extra, blank_i=int(blank),
                zero_infinity_i=int(bool(zero_infinity)))
    rank = sh.get_tensor_rank(log_probs)
    if isinstance(log_probs.type(), compat.JitTensorType) and rank in (2, 3):
        sizes = sh.get_tensor_sizes(log_probs)
        loss.setType(log_probs.type().with_sizes([sizes[1]] if rank == 3 else []))
    mode = _REDUCTIONS[int(reduction)]
    if mode == "none":
        return loss
    if mode == "sum":
        return g.op("ReduceSum", loss, keepdims_i=0)
    # mean: at::tensor(target_lengths, res.options()).clamp_min(1): the lengths in the loss's dtype
    den = g.op("Max", g.op("Cast", tl, to_i=_onnx_dtype(dtype)), _const(g, 1.0, dtype))
    return g.op("ReduceMean", g.op("Div", loss, den), keepdims_i=0)


# ---------------------------------------------------------------------------------------------
# the torch.export path: ortmod::ctc_loss, the per-sample losses (the engine's CTCLoss node)


@torch.library.custom_op("ortmod::ctc_loss", mutates_args=())
def ctc_loss_op(log_probs: torch.Tensor, targets: torch.Tensor, input_lengths: torch.Tensor,
                target_lengths: torch.Tensor, blank: int, zero_infinity: bool,
                targets_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Eager's per-sample CTC losses (reduction 'none'); targets_mask: the targets are
    targets[targets_mask] (torch.masked_select's). Run for real only by torch.export's real-tensor
    propagation; the engine runs the CTCLoss node. targets_mask is last and left out of traced
    calls (masked_targets sets it after the trace): torch 2.13's check that an op does not mutate
    its arguments fails on an optional tensor passed as None."""
    if targets_mask is not None:
        targets = torch.masked_select(targets, targets_mask)
    # without the function mode that would hand this call back to ortmod::ctc_loss
    with compat.DisableTorchFunction():
        return torch.ctc_loss(log_probs, targets, input_lengths, target_lengths, blank, 0, zero_infinity)


@ctc_loss_op.register_fake
def _ctc_loss_fake(log_probs, targets, input_lengths, target_lengths, blank, zero_infinity, targets_mask=None):
    # log_probs (T, N, C) -> (N,); (T, C) -> () (eager squeezes the unbatched sample's loss)
    return log_probs.new_empty((log_probs.shape[1],) if log_probs.dim() == 3 else ())


# how each way to torch's CTC loss takes its arguments; a reduction is F.ctc_loss's string or
# at::Reduction's number
_ARGS = ("log_probs", "targets", "input_lengths", "target_lengths", "blank", "reduction", "zero_infinity")


def traced_functions():
    """The callables whose calls ``traced_ctc_loss`` takes while torch.export traces."""
    aten = torch.ops.aten
    return {torch.nn.functional.ctc_loss: "mean", torch.ctc_loss: 1, aten.ctc_loss: 1,
            aten.ctc_loss.IntList: 1, aten.ctc_loss.Tensor: 1}


def _refuse(why):
    raise UnsupportedModelError(f"ctc_loss: {why}")


def _constant(name, v, kind):
    v = _concrete(v)
    if isinstance(v, torch.Tensor) or not isinstance(v, kind):
        _refuse(f"{name} = {v!r}: ortmod keeps blank, reduction and zero_infinity only as Python constants")
    return v


def _traced_lengths(what, v):
    """input_lengths / target_lengths as a 1-D int32 or int64 tensor, as eager reads them: a list
    of numbers (a constant of the graph; a symbolic size is specialised, which the shape guard
    then checks per call) or an integral tensor of any shape (eager reads its elements in order)."""
    if isinstance(v, torch.Tensor):
        if v.dtype.is_floating_point or v.dtype.is_complex or v.dtype == torch.bool:
            _refuse(f"{what} of dtype {v.dtype} (eager: {what} must be integral)")
        v = v.reshape(-1)
        return v if v.dtype in _INDEX_DTYPES else v.to(torch.int64)
    if not isinstance(v, (list, tuple)):
        _refuse(f"{what} is a {type(v).__name__}; eager takes a tensor or a list of ints")
    items = [_concrete(x) for x in v]
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in items):
        _refuse(f"{what} holds something other than ints ({[type(x).__name__ for x in items]})")
    return torch.tensor(items, dtype=torch.int64)


def traced_ctc_loss(func, args, kwargs):
    """torch's CTC loss while torch.export traces: ortmod::ctc_loss and eager's reduction around
    it (aten/src/ATen/native/LossCTC.cpp ctc_loss_impl). What the engine would not compute as
    eager does is refused by name; what eager converts is converted here, in the graph."""
    default_reduction = traced_functions()[func]
    if len(args) > len(_ARGS) or set(kwargs) - set(_ARGS):
        _refuse(f"unexpected arguments {sorted(set(kwargs) - set(_ARGS))}")
    bound = dict(zip(_ARGS, args), **kwargs)
    missing = [n for n in _ARGS[:4] if n not in bound]
    if missing:
        _refuse(f"missing arguments {missing}")
    log_probs, targets = bound["log_probs"], bound["targets"]
    blank = _constant("blank", bound.get("blank", 0), int)
    reduction = bound.get("reduction", default_reduction)
    if isinstance(reduction, str):
        reduction = compat.reduction_enum(reduction)     # eager's ValueError for others
    reduction = _constant("reduction", reduction, int)
    if reduction not in _REDUCTIONS:
        _refuse(f"unknown reduction {reduction}")
    zero_infinity = bool(_constant("zero_infinity", bound.get("zero_infinity", False), (bool, int)))
    if not isinstance(log_probs, torch.Tensor) or not isinstance(targets, torch.Tensor):
        _refuse("log_probs and targets must be tensors")
    if log_probs.dtype not in (torch.float32, torch.float64):
        _refuse(f"log_probs of dtype {log_probs.dtype}: eager's ctc_loss takes float32 or float64")
    if log_probs.dim() not in (2, 3):
        _refuse(f"log_probs must be (T, N, C) or (T, C), got {log_probs.dim()} dims")
    if targets.dim() not in (1, 2):
        _refuse(f"targets must be (N, S) padded or 1-D concatenated, got {targets.dim()} dims")
    # eager moves the targets to int64 (targets.to(kLong)); int32 is read as it is
    if targets.dtype not in _INDEX_DTYPES:
        if targets.dtype.is_complex:
            _refuse(f"targets of dtype {targets.dtype}")
        targets = targets.to(torch.int64)
    input_lengths = _traced_lengths("input_lengths", bound["input_lengths"])
    target_lengths = _traced_lengths("target_lengths", bound["target_lengths"])
    loss = torch.ops.ortmod.ctc_loss(log_probs, targets, input_lengths, target_lengths, blank, zero_infinity)
    mode = _REDUCTIONS[reduction]
    if mode == "none":
        return loss
    if mode == "sum":
        return loss.sum()
    # mean: at::tensor(target_lengths, res.options()).clamp_min(1): the lengths in the loss's dtype
    return (loss / target_lengths.to(loss.dtype).clamp_min(1)).mean()


def masked_targets(gm):
    """In the exported program, before decomposition: ortmod::ctc_loss of targets
    ``torch.masked_select(x, mask)`` (x and mask of one shape, mask bool) reads x through the
    node's mask input instead: masked_select's length is data, which the engine's planned
    shapes cannot have (Wav2Vec2ForCTC's labels.masked_select(labels >= 0)). Returns the count."""
    count = 0
    op = torch.ops.ortmod.ctc_loss.default
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not op:
            continue
        args = list(node.args)
        src = args[1]
        if len(args) > 6 or "targets_mask" in node.kwargs or not isinstance(src, torch.fx.Node) or \
                src.target is not torch.ops.aten.masked_select.default:
            continue
        x, mask = src.args[:2]
        xv, mv = (a.meta.get("val") if isinstance(a, torch.fx.Node) else None for a in (x, mask))
        if not isinstance(xv, torch.Tensor) or not isinstance(mv, torch.Tensor) or mv.dtype != torch.bool \
                or xv.dim() != mv.dim() or any(str(a) != str(b) for a, b in zip(xv.shape, mv.shape)):
            continue      # left to masked_select, which this path refuses by name
        args[1] = x
        node.args = tuple(args) + (mask,)
        _drop_size_assertions(gm, src)
        count += 1
    if count:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return count


def _drop_size_assertions(gm, node):
    """Erase ``node`` (a masked_select no op reads now) with what only checks its length: the
    sym_size reads, the arithmetic on them and the runtime assertions torch.export adds on a
    data-dependent size (u0 >= 0). Anything else that reads it keeps it (and the audit refuses)."""
    import operator
    allowed = {torch.ops.aten.sym_size.int, torch.ops.aten._assert_scalar.default,
               torch.ops.aten.sym_constrain_range_for_size.default, torch.ops.aten.sym_constrain_range.default,
               operator.ge, operator.gt, operator.le, operator.lt, operator.eq, operator.ne, operator.add,
               operator.sub, operator.mul, operator.floordiv, operator.mod}
    seen, stack = [], list(node.users)
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        if n.op != "call_function" or n.target not in allowed:
            return
        seen.append(n)
        stack.extend(n.users)
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    for n in sorted(seen, key=order.get, reverse=True):
        gm.graph.erase_node(n)
    gm.graph.erase_node(node)


def export_translations(ir):
    """{ortmod::ctc_loss: its translation}: the engine's CTCLoss node, as the symbolic above
    emits it (blank and zero_infinity attributes, the mask as a fifth input)."""
    from typing import Optional
    from onnxscript import evaluator
    from onnxscript.function_libs.torch_lib.tensor_typing import TFloat, TTensor
    from ..compat import onnx_tensors as _tensors

    def ctc_loss_onnx(log_probs: TFloat, targets: TTensor, input_lengths: TTensor, target_lengths: TTensor,
                      blank: int = 0, zero_infinity: bool = False,
                      targets_mask: Optional[TTensor] = None) -> TFloat:
        # built here, not through an onnxscript Op: an optional input and an ortmod-domain op
        tracer = evaluator.default()
        inputs = [log_probs, targets, input_lengths, target_lengths]
        if targets_mask is not None:
            inputs.append(targets_mask)
        loss = _tensors.SymbolicTensor(tracer.opset)
        loss.dtype = log_probs.dtype
        node = ir.Node("ortmod", "CTCLoss", inputs,
                       attributes=[ir.AttrInt64("blank", int(blank)),
                                   ir.AttrInt64("zero_infinity", int(bool(zero_infinity)))],
                       outputs=[loss], version=1)
        tracer.nodes.append(node)
        return loss

    return {torch.ops.ortmod.ctc_loss.default: ctc_loss_onnx}
