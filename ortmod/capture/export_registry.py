"""The torch.export path's rule registry: torchlib's translations plus ortmod's (the ``rules``
package's onnxscript functions, and the few that sit here: the stop-gradient and PythonOp nodes,
BatchNorm in training, attention, sort, index). Built once per
process."""
import functools

import torch

from . import compat

from .rules import aten as aten_rules, ctc as ctc_rules, onnxscript as onnxscript_rules, rnn_onnxscript
from .rules import (activations_onnxscript, distances_onnxscript, elementwise_onnxscript, indexing_onnxscript,
                    losses_onnxscript, norms_onnxscript, pools_onnxscript, reductions_onnxscript, upsample_onnxscript)
from .onnx_util import ONNX_OPSET
from .function_apply import _functions


# ---------------------------------------------------------------------------------------------
# ortmod's translations (onnxscript, traced by torch's exporter)


@functools.lru_cache(maxsize=None)
def _registry():
    """torchlib's registry plus ortmod's rules. Built once per process."""
    from onnxscript import opset18 as op    # noqa: F401  (the exporter's traced functions use it)
    registry = _torchlib_registry(ONNX_OPSET)
    for target, fn in _translations().items():
        registry.register_op(target, fn)
    return registry


_torchlib_registry = compat.torchlib_registry

# ortmod's onnxscript rules, one module per family (they were one function of closures,
# the former single translations function): each module's ``translations`` gives its {aten op: rule}
_FAMILIES = (elementwise_onnxscript, indexing_onnxscript, reductions_onnxscript, pools_onnxscript,
             distances_onnxscript, losses_onnxscript, upsample_onnxscript, norms_onnxscript, activations_onnxscript)


def _family_translations(op, ir, stop_gradient):
    out = {}
    for family in _FAMILIES:
        out.update(family.translations(op, ir, stop_gradient))
    out.update(aten_rules.export_translations(op, ir, stop_gradient))     # written once for both paths
    return out


def _translations():
    import onnxscript
    from onnxscript import opset18 as op
    from onnxscript.function_libs.torch_lib.tensor_typing import TFloat, TTensor
    from typing import Optional, Sequence, Tuple
    import onnx
    import onnx_ir as ir
    schema = onnx.defs.OpSchema(
        "StopGradient", "ortmod", 1, doc="identity forward, no gradient (the engine's op)",
        inputs=[onnx.defs.OpSchema.FormalParameter("x", "T")],
        outputs=[onnx.defs.OpSchema.FormalParameter("y", "T")],
        type_constraints=[("T", [f"tensor({t})" for t in ("float", "double", "float16", "bfloat16", "int64",
                                                           "int32", "int16", "int8", "uint8", "bool")], "")])
    stop_gradient_op = onnxscript.values.Op(onnxscript.values.Opset("ortmod", 1), "StopGradient", schema)

    def stop_gradient_onnx(x: TTensor) -> TTensor:
        return stop_gradient_op(x)

    def batch_norm_functional(input: TFloat, weight: Optional[TFloat] = None, bias: Optional[TFloat] = None,
                              running_mean: Optional[TFloat] = None, running_var: Optional[TFloat] = None,
                              training: bool = False, momentum: float = 0.9,
                              eps: float = 1e-05) -> Tuple[TFloat, TFloat, TFloat, TFloat, TFloat]:
        # outputs: (y, save_mean, save_invstd, new running_mean, new running_var). save_mean and
        # save_invstd only feed a backward, which the engine builds itself: _audit refuses a graph
        # that reads them, so the running stats stand in for them here.
        if running_mean is None or running_var is None:
            raise NotImplementedError("ortmod: BatchNorm without running stats on this path")
        channels = op.Shape(input, start=1, end=2)
        if weight is None:     # affine=False
            weight = op.Expand(op.Constant(value=ir.tensor([1.0], dtype=input.dtype)), channels)
        if bias is None:
            bias = op.Expand(op.Constant(value=ir.tensor([0.0], dtype=input.dtype)), channels)
        if not training:
            y = op.BatchNormalization(input, weight, bias, running_mean, running_var, epsilon=eps)
            return y, running_mean, running_var, running_mean, running_var
        # torch's momentum weighs the batch; ONNX's (and the engine's) weighs the running value.
        # The engine's training BatchNormalization updates running_var with the unbiased batch
        # variance, as torch does (csrc/ops/norm.c).
        y, new_mean, new_var = op.BatchNormalization(input, weight, bias, running_mean, running_var,
                                                     epsilon=eps, momentum=1.0 - momentum, training_mode=1)
        return y, new_mean, new_var, new_mean, new_var

    import onnx_ir as ir

    def sdpa(query: TFloat, key: TFloat, value: TFloat, attn_mask: Optional[TTensor] = None,
             dropout_p: float = 0.0, is_causal: bool = False, scale: Optional[float] = None,
             enable_gqa: bool = False) -> TFloat:
        # the node chain of ortmod's TorchScript symbolic (_capture._sdpa_symbolic), which the
        # engine's attention fusion matches, typed in the query's dtype throughout. torchlib's
        # splits sqrt(scale) over query and key, and its Dropout has no training_mode input:
        # ONNX's default (false) would drop nothing where eager applies dropout_p.
        dtype = query.dtype

        def const(v, dt=dtype):
            return op.Constant(value=ir.tensor(v, dtype=dt))

        rank = len(key.shape)
        if enable_gqa and len(query.shape) >= 3 and query.shape[-3] != key.shape[-3]:
            # eager repeats each key/value head for Hq / Hkv query heads (repeat_interleave on
            # dim -3): Unsqueeze, Expand, Reshape, whose gradient sums over the repeats, as eager's
            hq, hkv = query.shape[-3], key.shape[-3]
            if not (isinstance(hq, int) and isinstance(hkv, int)) or hkv == 0 or hq % hkv:
                raise NotImplementedError(f"ortmod: scaled_dot_product_attention(enable_gqa=True) with {hq} query "
                                          f"and {hkv} key heads")

            def repeated(t):
                i64 = ir.DataType.INT64
                outer, inner = op.Shape(t, end=-3), op.Shape(t, start=-2)
                wide = op.Expand(op.Unsqueeze(t, const([rank - 2], i64)),
                                 op.Concat(outer, const([hkv, hq // hkv], i64), inner, axis=0))
                return op.Reshape(wide, op.Concat(outer, const([hq], i64), inner, axis=0))
            key, value = repeated(key), repeated(value)
        if scale is None:
            wide = ir.DataType.DOUBLE if dtype == ir.DataType.DOUBLE else ir.DataType.FLOAT
            e = op.Cast(op.Shape(query, start=-1), to=wide)
            s = op.Cast(op.Div(const([1.0], wide), op.Sqrt(e)), to=dtype)
        else:
            s = const(scale)
        perm = list(range(rank))
        perm[-1], perm[-2] = perm[-2], perm[-1]
        scores = op.MatMul(op.Mul(query, s), op.Transpose(key, perm=perm))
        zero, neg_inf = const([0.0]), const([-float("inf")])
        guard_nan = False
        if is_causal:
            size = op.Concat(op.Shape(query, start=-2, end=-1), op.Shape(key, start=-2, end=-1), axis=0)
            tril = op.Trilu(op.Expand(const([1.0]), size), upper=0)
            scores = op.Add(scores, op.Where(op.Equal(tril, zero), neg_inf, zero))
        elif attn_mask is not None:
            # a fully masked row (all False, or all -inf in a float mask) gives NaN in the
            # softmax: 0, as torch's kernels give (math: _safe_softmax, the CPU flash kernel too)
            guard_nan = True
            if attn_mask.dtype == ir.DataType.BOOL:
                attn_mask = op.Where(attn_mask, zero, neg_inf)
            elif attn_mask.dtype != dtype:
                attn_mask = op.Cast(attn_mask, to=dtype)
            scores = op.Add(scores, attn_mask)
        weights = op.Softmax(scores, axis=-1)
        if guard_nan:
            weights = op.Where(op.IsNaN(weights), zero, weights)
        if dropout_p != 0:
            weights, _ = op.Dropout(weights, const(dropout_p, ir.DataType.FLOAT), const(True, ir.DataType.BOOL))
        return op.MatMul(weights, value)

    # torch.sort / torch.argsort (argsort decomposes to sort): torchlib's rule gives TopK(k = the
    # axis size), whose ties eager torch.topk orders differently from eager torch.sort, and it
    # has none for stable=True; the engine's Sort keeps sort's own order (csrc/ops/topk.c)
    sort_schema = onnx.defs.OpSchema(
        "Sort", "ortmod", 1, doc="torch.sort along axis (the engine's op)",
        inputs=[onnx.defs.OpSchema.FormalParameter("x", "T")],
        outputs=[onnx.defs.OpSchema.FormalParameter("values", "T"),
                 onnx.defs.OpSchema.FormalParameter("indices", "I")],
        type_constraints=[("T", [f"tensor({t})" for t in ("float", "double", "float16", "bfloat16", "int64",
                                                           "int32")], ""),
                          ("I", ["tensor(int64)"], "")],
        attributes=[onnx.defs.OpSchema.Attribute(a, onnx.defs.OpSchema.AttrType.INT, "")
                    for a in ("axis", "descending", "stable")])
    sort_op = onnxscript.values.Op(onnxscript.values.Opset("ortmod", 1), "Sort", sort_schema)

    def sort(self: TTensor, dim: int = -1, descending: bool = False) -> Tuple[TTensor, TTensor]:
        return sort_op(self, axis=dim, descending=int(bool(descending)), stable=0)

    def sort_stable(self: TTensor, stable: Optional[bool] = None, dim: int = -1,
                    descending: bool = False) -> Tuple[TTensor, TTensor]:
        return sort_op(self, axis=dim, descending=int(bool(descending)), stable=int(bool(stable)))

    from onnxscript.function_libs.torch_lib.ops import core as torchlib_core

    def const(v, dt):
        return op.Constant(value=ir.tensor(v, dtype=dt))

    def index(self: TTensor, indices: Sequence[Optional[TTensor]]) -> TTensor:
        # one integer index tensor (x[:, :, idx]): a Gather on its axis, an op the engine has
        # (torchlib's general form is GatherND, which it does not)
        given = [k for k, i in enumerate(indices) if i is not None]
        if any(indices[k].dtype == ir.DataType.BOOL for k in given):
            return torchlib_core.aten_index(self, indices)
        if len(given) == 1:
            return op.Gather(self, indices[given[0]], axis=given[0])
        if given == list(range(len(given))):
            # x[i0, .., ik-1] on the leading dims: one Gather on the flattened leading dims, at
            # the linear index sum_j i_j * stride_j (negative indices counted from the end, as torch)
            k = len(given)
            shape = op.Shape(self)
            linear = None
            for j in range(k):
                size = op.Shape(self, start=j, end=j + 1)
                i = op.Cast(indices[j], to=ir.DataType.INT64)
                i = op.Where(op.Less(i, const([0], ir.DataType.INT64)), op.Add(i, size), i)
                linear = i if linear is None else op.Add(op.Mul(linear, size), i)
            flat = op.Reshape(self, op.Concat(const([-1], ir.DataType.INT64), op.Slice(
                shape, const([k], ir.DataType.INT64), const([2 ** 62], ir.DataType.INT64)), axis=0))
            return op.Gather(flat, linear, axis=0)
        return torchlib_core.aten_index(self, indices)

    def python_op_onnx(xs: Sequence[TTensor], call: int) -> Sequence[TTensor]:
        # the TorchScript path's node (python_op._python_op_symbolic): the tensor arguments, the
        # function_id of the call's FunctionSpec in Exported.functions, the output dtypes. Built
        # here, not through an onnxscript Op: an op schema gives a fixed number of outputs.
        from onnxscript import evaluator
        from .compat import onnx_tensors as _tensors
        recorder = _functions.recorder
        spec = recorder.calls[call]
        dtypes = spec.onnx_dtypes()
        function_id = len(recorder.specs)
        recorder.specs.append(spec)
        tracer = evaluator.default()
        node = ir.Node("ortmod", "PythonOp", list(xs),
                       attributes=[ir.AttrInt64("function_id", function_id), ir.AttrInt64s("output_dtypes", dtypes)],
                       outputs=[_tensors.SymbolicTensor(tracer.opset) for _ in dtypes], version=1)
        tracer.nodes.append(node)
        return tuple(node.outputs)

    return {
        torch.ops.ortmod.python_op.default: python_op_onnx,
        **ctc_rules.export_translations(ir),
        **_family_translations(op, ir, stop_gradient_op),
        **rnn_onnxscript.translations(op, ir, stop_gradient_op),
        **onnxscript_rules.zoo_translations(op, ir, stop_gradient_op),
        **onnxscript_rules.clamp_translations(op, ir, stop_gradient_op, *compat.clamp_semantics()),
        torch.ops.aten.sort.default: sort,
        torch.ops.aten.sort.stable: sort_stable,
        torch.ops.aten.index.Tensor: index,
        torch.ops.aten.scaled_dot_product_attention.default: sdpa,
        torch.ops.ortmod.stop_gradient.default: stop_gradient_onnx,
        torch.ops.aten._native_batch_norm_legit_functional.default: batch_norm_functional,
    }
