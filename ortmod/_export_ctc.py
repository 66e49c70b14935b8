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
registers them only while ortmod exports."""
import torch

# eager's at::Reduction: None, Mean, Sum
_REDUCTIONS = {0: "none", 1: "mean", 2: "sum"}
_INDEX_DTYPES = (torch.int32, torch.int64)


def symbolics(registration, opset):
    return {"aten::ctc_loss": _ctc_loss_symbolic}


def _lengths(g, what, v):
    """input_lengths / target_lengths as an int64 (or int32) tensor value: a constant list, a
    list built in the trace, or a tensor (eager takes any integral dtype: cast to int64)."""
    from torch.onnx import symbolic_helper as sh
    from ._semantics import _const, _dtype_of, _onnx_dtype, _refuse
    c = sh._maybe_get_const(v, "is")
    if not sh._is_value(c):
        return _const(g, [int(x) for x in (c if isinstance(c, (list, tuple)) else [c])], torch.int64)
    if sh._is_packed_list(v):
        items = [g.op("Cast", g.op("Reshape", x, _const(g, [1], torch.int64)), to_i=_onnx_dtype(torch.int64))
                 for x in sh._unpack_list(v)]
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
    from torch.onnx import symbolic_helper as sh
    node = targets.node()
    if node.kind() != "onnx::GatherND" or (node.hasAttribute("batch_dims") and sh._node_get(node, "batch_dims") != 0):
        return None
    x, idx = list(node.inputs())
    tr = idx.node()
    if tr.kind() != "onnx::Transpose" or list(sh._node_get(tr, "perm")) != [1, 0]:
        return None
    nz = next(tr.inputs()).node()
    if nz.kind() != "onnx::NonZero":
        return None
    mask = next(nz.inputs())
    return x, mask


def _ctc_loss_symbolic(g, log_probs, targets, input_lengths, target_lengths, blank, reduction, zero_infinity):
    from torch.onnx import symbolic_helper as sh
    from ._semantics import _const, _dtype_of, _onnx_dtype, _refuse
    blank = sh._maybe_get_const(blank, "i")
    reduction = sh._maybe_get_const(reduction, "i")
    zero_infinity = sh._maybe_get_const(zero_infinity, "b")
    if sh._is_value(blank) or sh._is_value(reduction) or sh._is_value(zero_infinity):
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
    rank = sh._get_tensor_rank(log_probs)
    if isinstance(log_probs.type(), torch._C.TensorType) and rank in (2, 3):
        sizes = sh._get_tensor_sizes(log_probs)
        loss.setType(log_probs.type().with_sizes([sizes[1]] if rank == 3 else []))
    mode = _REDUCTIONS[int(reduction)]
    if mode == "none":
        return loss
    if mode == "sum":
        return g.op("ReduceSum", loss, keepdims_i=0)
    # mean: at::tensor(target_lengths, res.options()).clamp_min(1): the lengths in the loss's dtype
    den = g.op("Max", g.op("Cast", tl, to_i=_onnx_dtype(dtype)), _const(g, 1.0, dtype))
    return g.op("ReduceMean", g.op("Div", loss, den), keepdims_i=0)
