"""Tensor rules written once for both capture paths (``emitter.aten_rule``): detach, one_hot,
embedding."""
import torch

from .emitter import Tensor, aten_rule


@aten_rule("aten::detach", why="StopGradient: torch's TorchScript rule drops the node, and its gradient stop with it")
def detach(e, self: Tensor):
    """Always a node (torch's TorchScript rule drops it): on a value that needs no gradient
    anyway it is a free alias in the engine. On the torch.export path a detach() written through
    in place (_written_through) stays aten's and reaches this rule too."""
    return e.stop_gradient(self)


def _num_classes_given(a):
    if not isinstance(a.num_classes, int) or a.num_classes < 0:
        return "needs num_classes as a number (not the largest class + 1, a size read from the data)"
    return None


@aten_rule("aten::one_hot", checks=(_num_classes_given,),
           why="OneHot, a class out of range raising as eager (torch's decomposition gives a row of zeros)")
def one_hot(e, self: Tensor, num_classes: int = -1):
    """eager (one_hot): a class below 0 or at least num_classes raises. ONNX OneHot wraps a
    negative class (-1 is the last): a negative class is sent to num_classes here, out of range,
    so the engine's OneHot raises as eager does. Kept whole on the torch.export path (a translated
    op is not decomposed): torch's decomposition compares with arange(num_classes), which turns a
    class out of range into a row of zeros."""
    depth = e.const(num_classes, torch.int64)
    x = e.op("Cast", self, to=torch.int64)
    x = e.op("Where", e.op("Less", x, e.const(0, torch.int64)), depth, x)
    return e.op("OneHot", x, depth, e.ints([0, 1]), axis=-1)


def _no_frequency_scaling(a):
    return "scale_grad_by_freq is not implemented by ortmod" if a.scale_grad_by_freq else None


@aten_rule("aten::embedding", checks=(_no_frequency_scaling,),
           why="Gather; padding_idx's row gets no gradient, as eager (torch's rules drop padding_idx)")
def embedding(e, weight: Tensor, indices: Tensor, padding_idx: int = -1, scale_grad_by_freq: bool = False,
              sparse: bool = False):
    """Gather, and for padding_idx: the rows looked up at pad positions get no gradient, which
    leaves the padding row's gradient zero exactly as eager's embedding_backward does (torchlib's
    rule drops padding_idx; Gather on the torch.export path, where torchlib's general form would
    be GatherND)."""
    out = e.op("Gather", weight, indices, axis=0)
    if padding_idx is not None and padding_idx >= 0:
        pad = e.const(padding_idx, torch.int64)
        if e.dtype(indices) not in (None, torch.int64):
            pad = e.op("CastLike", pad, indices)
        is_pad = e.op("Unsqueeze", e.op("Equal", indices, pad), e.ints([-1]))
        out = e.op("Where", is_pad, e.stop_gradient(out), out)
    return out
