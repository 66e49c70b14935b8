"""Capture on torch.export: the second way a module's forward becomes the ONNX graph the engine runs.

The TorchScript exporter (``ortmod/_capture.py``) is deprecated and will be removed from torch.
This path captures with ``torch.export.export`` (non-strict: the forward runs in Python on fake
tensors, with symbolic sizes) and translates the ExportedProgram to ONNX with torch's own
torch.export -> ONNX translator (onnxscript's torchlib), with ortmod's rules where torchlib's do not
mean what eager training means. The result is the same ``_capture.Exported`` record, so the C
importer stays the one way into the engine.

Training semantics, as on the TorchScript path:

* **Stop-gradient.** The training IR keeps ``aten.detach`` and marks ``torch.no_grad()`` regions
  (``wrap_with_set_grad_enabled(False, ...)``); decomposition would turn both into plain aliases.
  Before decomposition, each becomes the opaque custom op ``ortmod::stop_gradient`` (the inputs of
  a no-grad region go through it), translated to the engine's ``ortmod::StopGradient``.
* **BatchNorm in training.** torchlib exports ``_native_batch_norm_legit_functional`` in inference
  form whatever ``training`` says (and drops the running-stat update); ortmod's rule emits
  ``BatchNormalization(training_mode=1)`` with its running-stat outputs.
* **Buffer mutations** are explicit in the graph signature (``BUFFER_MUTATION`` outputs): they
  become extra graph outputs copied into the module's buffers after each forward (running stats,
  ``num_batches_tracked``, any buffer forward updates). A forward that mutates a parameter or an
  input is refused.
* **Dropout** decomposes to ``native_dropout(x, p, train)`` -> ONNX ``Dropout(x, p, train)``: the
  engine's Dropout, random and different each step.
* **Dynamic sizes**, as torch.compile's automatic dynamic shapes: the first export holds every
  input dim static (a static trace is several times faster than a symbolic one: GPT-2's first
  call 7.7 s -> see bench/first_call.py); a call with another size there exports again with the
  dims that varied as torch.export's symbolic shapes (``Dim.AUTO``), traced size-obliviously (a
  size 1 is not specialised), so that export serves the later sizes its guards admit. What the
  export specialised (a dim fixed to its traced size, two dims made equal, a range, a runtime
  assertion or a guard on sizes) is checked on every call by ``ShapeGuard``: a call it rejects
  is exported again, never run on a stale graph.
* **Custom autograd.Function** runs its own forward and backward, by the TorchScript path's
  mechanism (ortmod/_pyop.py). torch.export would inline its forward and lose its backward: while
  it traces, a user's ``Function.apply`` becomes the opaque op ``ortmod::python_op`` (kept through
  decomposition), translated to the engine's ``ortmod::PythonOp`` node that the TorchScript path
  emits. ``inline_autograd_functions`` lets torch.export inline it, as asked. torch's own
  Functions are the engine's to compute: ``F.linear_cross_entropy``'s chunked op is traced as
  torch's reference path (_semantics.linear_cross_entropy_reference), as under torch.jit.trace;
  any other is refused by name.

Every ONNX op of the result must be one the engine implements; the engine refuses others at
import, by name.
"""
import contextlib
import functools
import itertools
import operator
import sys
import threading
import time
import warnings

import torch

from .capture import compat
from .capture.compat import pytree

from . import _capture, _export_ctc, _export_rules_rnn, _pyop, _semantics
from ._capture import (Exported, ExportError, GraphInput, UnsupportedModelError,
                       _FlatWrapper)
from ._logging import logger

ONNX_OPSET = 20

# ---------------------------------------------------------------------------------------------
# the custom op that carries a stop-gradient through decomposition


@torch.library.custom_op("ortmod::stop_gradient", mutates_args=())
def stop_gradient(x: torch.Tensor) -> torch.Tensor:
    """Identity forward with no gradient; only ever traced (the engine runs StopGradient)."""
    return x.clone()


@stop_gradient.register_fake
def _stop_gradient_fake(x):
    return torch.empty_like(x)


def _insert_stop_gradients(gm):
    """In the training IR: ``aten.detach`` -> ``ortmod.stop_gradient``; the floating tensor inputs
    of a ``torch.no_grad()`` region go through ``ortmod.stop_gradient`` first. Returns the count."""
    count = 0
    sg = torch.ops.ortmod.stop_gradient.default
    detaches = (torch.ops.aten.detach.default, torch.ops.aten.detach_.default)
    set_grad = getattr(torch.ops.higher_order, "wrap_with_set_grad_enabled", None)
    for node in list(gm.graph.nodes):
        if node.op != "call_function":
            continue
        if node.target in detaches:
            if _written_through(node):
                # a detach() changed in place changes what it aliases (nn.Embedding(max_norm=...)
                # renormalizes its weight so); a stop_gradient copy would drop that change.
                # Kept, functionalization names the change, and _check_output_kinds refuses a
                # parameter's or an argument's (a buffer's is an update, as BatchNorm's)
                continue
            node.target = sg
            count += 1
        elif set_grad is not None and node.target is set_grad and node.args and node.args[0] is False:
            args = list(node.args)
            for k in range(2, len(args)):
                a = args[k]
                val = _meta_val(a)
                if isinstance(val, torch.Tensor) and val.is_floating_point():
                    if _region_writes(gm, node, k):
                        # the region updates it in place (an EMA buffer, spectral_norm's u and v
                        # written by F.normalize(out=...)): a stop_gradient copy would take the
                        # write, and the buffer would never change. A graph input is passed as it
                        # is (functionalization names a buffer's update; _check_output_kinds
                        # refuses a parameter's or an argument's), and so is a value without a
                        # gradient; one with a gradient is refused (the capture's in-place check
                        # refuses it first, naming the op), its write would need the region's
                        # stop-gradient undone
                        if a.op != "placeholder" and val.requires_grad:
                            from ._capture import UnsupportedModelError
                            raise UnsupportedModelError(
                                f"a torch.no_grad() region writes in place into {a.name}, a value computed "
                                "in the graph: ortmod takes in-place writes in no_grad regions only into "
                                "buffers")
                        continue
                    with gm.graph.inserting_before(node):
                        s = gm.graph.call_function(sg, (a,))
                    s.meta["val"] = val
                    args[k] = s
                    count += 1
            node.args = tuple(args)
    if count:
        gm.recompile()
    return count


def _region_writes(gm, call, k):
    """Whether the no_grad region ``call`` (wrap_with_set_grad_enabled(False, submodule, *args))
    writes in place into its argument ``k`` (or a view of it), in its own ops or a nested
    region's."""
    body = getattr(gm, call.args[1].target, None) if isinstance(call.args[1], torch.fx.Node) else None
    if not isinstance(body, torch.fx.GraphModule):
        return True         # a body ortmod cannot read: assume a write rather than drop one
    placeholders = [n for n in body.graph.nodes if n.op == "placeholder"]
    if k - 2 >= len(placeholders):
        return True
    return _written_through(placeholders[k - 2], body)


def _written_through(node, gm=None):
    """Whether an op with a mutable schema writes into ``node``'s output or a view of it (through
    ops whose result aliases their input: view, detach, slice, ...)."""
    set_grad = getattr(torch.ops.higher_order, "wrap_with_set_grad_enabled", None)
    seen, todo = set(), [node]
    while todo:
        n = todo.pop()
        for user in n.users:
            if gm is not None and user.op == "call_function" and set_grad is not None and user.target is set_grad \
                    and user not in seen:
                seen.add(user)      # a nested region: what its body does to the argument
                if any(_region_writes(gm, user, k) for k, a in enumerate(user.args) if k >= 2 and a is n):
                    return True
                continue
            schema = getattr(user.target, "_schema", None)
            if user.op != "call_function" or schema is None or user in seen:
                continue
            seen.add(user)
            for k, a in enumerate(schema.arguments):
                value = user.args[k] if k < len(user.args) else user.kwargs.get(a.name)
                if value is n and a.alias_info is not None and a.alias_info.is_write:
                    return True
            if schema.returns and schema.returns[0].alias_info is not None:
                todo.append(user)
    return False


def _splits_to_slices(gm):
    """``split`` / ``split_with_sizes`` with constant sizes -> one ``slice`` per piece used. torchlib
    translates a split to an ONNX sequence (SplitToSequence and a local function per piece), which
    the engine does not take; the pieces' bounds are known here."""
    # unsafe_split: LSTMCell/GRUCell's gates (the same pieces, only autograd's view checks differ)
    targets = {torch.ops.aten.split.Tensor, torch.ops.aten.split_with_sizes.default,
               torch.ops.aten.unsafe_split.Tensor, torch.ops.aten.unsafe_split_with_sizes.default}
    changed = _unbinds_to_selects(gm)
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in targets:
            continue
        pieces = node.meta.get("val")
        x, sizes = node.args[0], node.args[1]
        dim = _const_arg(node, 2, "dim", 0)
        if not isinstance(pieces, (list, tuple)) or not isinstance(dim, int):
            continue
        if node.target in (torch.ops.aten.split.Tensor, torch.ops.aten.unsafe_split.Tensor):
            if not isinstance(sizes, int):
                continue
            bounds = [(k * sizes, (k + 1) * sizes if k + 1 < len(pieces) else sys.maxsize)
                      for k in range(len(pieces))]
        else:
            if not all(isinstance(v, int) for v in sizes):
                continue
            ends = list(itertools.accumulate(sizes))
            bounds = list(zip([0] + ends[:-1], ends))
        users = list(node.users)
        if not all(u.target is operator.getitem for u in users):
            continue
        for u in users:     # each piece becomes its slice in place (its name is in the signature)
            start, end = bounds[u.args[1]]
            u.target = torch.ops.aten.slice.Tensor
            u.args = (x, dim, start, end)
        gm.graph.erase_node(node)
        changed = True
    if changed:
        gm.recompile()


def _unbinds_to_selects(gm):
    """``unbind(x, dim)`` -> one ``select(x, dim, i)`` per piece used: torchlib's unbind is an ONNX
    sequence where the size is symbolic, and the pieces are selects in eager's meaning."""
    changed = False
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not torch.ops.aten.unbind.int:
            continue
        dim = _const_arg(node, 1, "dim", 0)
        users = list(node.users)
        if not isinstance(dim, int) or not all(u.target is operator.getitem for u in users):
            continue
        for u in users:
            u.target = torch.ops.aten.select.int
            u.args = (node.args[0], dim, u.args[1])
        gm.graph.erase_node(node)
        changed = True
    return changed


def _views_to_view_copies(gm):
    """``view`` / ``_unsafe_view`` -> ``view_copy`` in the decomposed (functional) graph. torch.export
    records a ``view`` (and drops a ``.contiguous()``) where the strides it saw allowed one: strides
    of the kernels that ran in the trace. The translator's type-promotion pass runs the graph again
    on fake tensors under ``backed_size_oblivious``, where a kernel may give another layout (CPU
    scaled_dot_product_attention with a learned mask: (B, S, H, D) strides in the trace, contiguous
    ones there), and the recorded view of its transpose is then refused ("Cannot view a tensor
    ...": T5, Swin). Strides are not part of an ONNX graph: in a graph without mutation a view and
    a copy hold the same values, and ``view_copy`` copies where a view cannot be made. A graph with
    a mutating op keeps its views (an alias there is meaning); _audit refuses such ops anyway."""
    targets = {torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default}
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    if any(isinstance(n.target, compat.OpOverload) and n.target._schema.is_mutable for n in nodes):
        return
    changed = False
    # torch 2.10 and 2.11's view_copy refuses such strides on fake tensors (its real kernel copies):
    # a contiguous clone goes first there (Identity in ONNX)
    contiguous_first = not compat.view_copy_copies_on_fakes()
    for node in nodes:
        if node.target in targets:
            node.target = torch.ops.aten.view_copy.default
            src = node.args[0]
            val = src.meta.get("val") if isinstance(src, torch.fx.Node) else None
            if contiguous_first and isinstance(val, torch.Tensor):
                with gm.graph.inserting_before(node):
                    clone = gm.graph.call_function(torch.ops.aten.clone.default, (src,),
                                                   {"memory_format": torch.contiguous_format})
                clone.meta.update({k: v for k, v in src.meta.items() if k != "val"})
                clone.meta["val"] = val.clone(memory_format=torch.contiguous_format)
                node.args = (clone,) + tuple(node.args[1:])
            changed = True
    if changed:
        gm.recompile()


def _check_output_kinds(sig):
    """Refuses outputs other than the module's own and its buffers' updates: a parameter or an
    argument changed in place."""
    from torch.export.graph_signature import OutputKind
    for spec in sig.output_specs:
        if spec.kind == OutputKind.PARAMETER_MUTATION:
            raise UnsupportedModelError(f"forward mutates parameter '{_state_name(spec.target)}' in place; the "
                                        "engine computes gradients for parameters it does not change")
        if spec.kind == OutputKind.USER_INPUT_MUTATION:
            raise UnsupportedModelError("forward mutates one of its tensor arguments in place, which ortmod does "
                                        "not reproduce; do it out of place")
        if spec.kind not in (OutputKind.USER_OUTPUT, OutputKind.BUFFER_MUTATION):
            raise UnsupportedModelError(f"torch.export output of kind {spec.kind.name} is not supported by ortmod")


def _prepare(ep, registry):
    """torch's own preparation of a program for the ONNX translator (compat.prepare_for_onnx),
    with _views_to_view_copies between decomposition and the type-promotion pass that runs the
    graph again."""
    from . import _export_rules
    # eager's clamp by a number and by a tensor differ at the bound from 2.14 (compat.clamp_semantics):
    # a number the type-promotion pass makes a tensor becomes a number again
    numbers_differ = len(set(compat.clamp_semantics())) > 1

    def each_graph(gm, fn):
        for sub in gm.modules():
            if isinstance(sub, torch.fx.GraphModule):
                fn(sub)

    def after_decomposition(gm):
        each_graph(gm, _views_to_view_copies)
        if numbers_differ:
            each_graph(gm, _export_rules.mark_number_clamps)

    def after_promotion(gm):
        if numbers_differ:
            each_graph(gm, _export_rules.number_clamps_back)
    return compat.prepare_for_onnx(ep, registry, after_decomposition, after_promotion)


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

    def embedding(weight: TFloat, indices: TTensor, padding_idx: int = -1, scale_grad_by_freq: bool = False,
                  sparse: bool = False) -> TFloat:
        # padding_idx: the rows looked up at pad positions get no gradient, so the pad row's
        # gradient stays zero as in eager (torchlib drops padding_idx); scale_grad_by_freq is
        # refused by _audit
        out = op.Gather(weight, indices, axis=0)
        if padding_idx is not None and padding_idx >= 0:
            is_pad = op.Equal(indices, op.CastLike(const(padding_idx, ir.DataType.INT64), indices)
                              if indices.dtype != ir.DataType.INT64 else const(padding_idx, ir.DataType.INT64))
            is_pad = op.Unsqueeze(is_pad, const([-1], ir.DataType.INT64))
            out = op.Where(is_pad, stop_gradient_op(out), out)
        return out

    def cosine_similarity(x1: TFloat, x2: TFloat, dim: int = 1, eps: float = 1e-8) -> TFloat:
        # eager (Distance.cpp): x1, x2 expanded to one shape, each 2-norm over dim clamped to eps
        # in place under no_grad, so autograd differentiates the norm as if unclamped; the
        # decomposition clamps with a gradient (0 below eps) instead. Here the clamped norm is
        # eps + (n - n) there: the value exactly eps, the gradient n's (as ortmod's TorchScript rule).
        dt = x1.dtype
        x1e = op.Expand(x1, op.Shape(x2))
        x2e = op.Expand(x2, op.Shape(x1))
        axes = const([dim], ir.DataType.INT64)
        eps_c = const(eps, dt)

        def clamped(n):
            lifted = op.Add(op.Sub(n, stop_gradient_op(n)), eps_c)
            return op.Where(op.Less(n, eps_c), lifted, n)

        n1 = clamped(op.ReduceL2(x1e, axes, keepdims=1))
        n2 = clamped(op.ReduceL2(x2e, axes, keepdims=1))
        return op.ReduceSum(op.Mul(op.Div(x1e, n1), op.Div(x2e, n2)), axes, keepdims=0)

    def python_op_onnx(xs: Sequence[TTensor], call: int) -> Sequence[TTensor]:
        # the TorchScript path's node (_pyop._python_op_symbolic): the tensor arguments, the
        # function_id of the call's FunctionSpec in Exported.functions, the output dtypes. Built
        # here, not through an onnxscript Op: an op schema gives a fixed number of outputs.
        from onnxscript import evaluator
        from .capture.compat import onnx_tensors as _tensors
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

    from . import _export_rules
    return {
        torch.ops.ortmod.python_op.default: python_op_onnx,
        **_export_ctc.export_translations(ir),
        **_export_rules.translations(op, ir, stop_gradient_op),
        **_export_rules_rnn.translations(op, ir, stop_gradient_op),
        **_export_rules.zoo_translations(op, ir, stop_gradient_op),
        **_export_rules.clamp_translations(op, ir, stop_gradient_op, *compat.clamp_semantics()),
        torch.ops.aten.cosine_similarity.default: cosine_similarity,
        torch.ops.aten.embedding.default: embedding,
        torch.ops.aten.sort.default: sort,
        torch.ops.aten.sort.stable: sort_stable,
        torch.ops.aten.index.Tensor: index,
        torch.ops.aten.scaled_dot_product_attention.default: sdpa,
        torch.ops.ortmod.stop_gradient.default: stop_gradient_onnx,
        # a detach() changed in place (_written_through) stays aten's: the same stop-gradient
        torch.ops.aten.detach.default: stop_gradient_onnx,
        torch.ops.aten._native_batch_norm_legit_functional.default: batch_norm_functional,
    }


# ---------------------------------------------------------------------------------------------
# shape guards


class ShapeGuard:
    """What the export assumed about the call's tensor sizes, checked per call.

    ``dims``: per input tensor, per dim, an int (specialised: must be equal) or a sympy
    expression of the export's size symbols. Plain symbols bind to the call's sizes; everything
    else (derived dims, ``range_constraints``, runtime assertions the export put in the graph, the
    guards its ShapeEnv took) is evaluated on them. A shape set that passed is remembered, so
    steady state costs one lookup."""

    def __init__(self, dims, ranges, assertions):
        self.dims = dims
        self.ranges = ranges            # symbol -> (lo, hi)
        self.assertions = assertions    # sympy booleans over the symbols
        self._passed = set()

    def holds(self, shapes):
        if shapes in self._passed:
            return True
        ok = self._check(shapes)
        if ok:
            if len(self._passed) > 256:
                self._passed.clear()
            self._passed.add(shapes)
        return ok

    def _check(self, shapes):
        import sympy
        if len(shapes) != len(self.dims):
            return False
        env, later = {}, []
        for shape, dims in zip(shapes, self.dims):
            if len(shape) != len(dims):
                return False
            for size, d in zip(shape, dims):
                if isinstance(d, int):
                    if size != d:
                        return False
                elif isinstance(d, sympy.Symbol):
                    if env.setdefault(d, size) != size:
                        return False
                else:
                    later.append((d, size))
        for sym, (lo, hi) in self.ranges.items():
            if sym in env and not (lo <= env[sym] <= hi):
                return False
        for expr, size in later:
            try:
                if int(expr.xreplace(env)) != size:
                    return False
            except TypeError:
                return False    # an expression of a symbol no input binds
        for cond in self.assertions:
            try:
                if not bool(cond.xreplace(env)):
                    return False
            except TypeError:
                return False
        return True

    def describe(self):
        return "; ".join(f"input {i}: ({', '.join(str(d) for d in dims)})" for i, dims in enumerate(self.dims))


def _size_expr(s):
    if isinstance(s, int):
        return s
    expr = s.node.expr
    return int(expr) if expr.is_number else expr


def _bound(b, infinite):
    try:
        return int(b)
    except (TypeError, ValueError, OverflowError, AttributeError):
        return infinite     # torch's int_oo, sympy's oo


def _range(vr):
    return _bound(vr.lower, -(2 ** 63)), _bound(vr.upper, 2 ** 63 - 1)


_ASSERTS = ("_assert_scalar",)


def _shape_guard(ep, n_inputs):
    from torch.export.graph_signature import InputKind
    user = [s.arg.name for s in ep.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    by_name = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    dims = []
    for name in user:
        val = by_name[name].meta["val"]
        dims.append(tuple(_size_expr(s) for s in val.shape))
    if len(dims) != n_inputs:
        raise ExportError(f"torch.export gave {len(dims)} user inputs, expected {n_inputs}")
    ranges = {}
    for sym, vr in ep.range_constraints.items():
        ranges[sym] = _range(vr)
    assertions = []
    for node in ep.graph.nodes:
        if node.op == "call_function" and getattr(node.target, "__name__", "").startswith(_ASSERTS):
            cond = _meta_val(node.args[0])
            # one over a value read from a tensor (an unbacked symbol) is a guard's (_freeze_decisions)
            if isinstance(cond, torch.SymBool) and not _free_unbacked(cond):
                assertions.append(cond.node.expr)
    # The guards the trace took on sizes that neither a range nor an assertion in the graph says
    # (``if x.size(0) == 3:`` gives Ne(s0, 3) with s0's range still [2, oo]): torch.export keeps
    # them only as its ShapeEnv's guards (ExportedProgram.module() checks them), so without them
    # a size the trace did not take its branch for would run the graph
    import sympy
    shape_env = compat.shape_env_of(ep.graph_module)
    for g in shape_env.guards if shape_env is not None else ():
        # in the placeholders' symbols (a symbol the trace found equal to another is replaced)
        cond = shape_env.simplify(g.expr)
        if cond != sympy.true and not any(str(s).startswith("u") for s in cond.free_symbols):
            assertions.append(cond)
    return ShapeGuard(dims, ranges, assertions)


# ---------------------------------------------------------------------------------------------
# values Python took from tensors: decided by the call's real values, guarded per call
#
# Non-strict torch.export runs the forward on fake tensors: a branch on a tensor's value
# (``if torch.equal(mask, causal):``, ``if x.max() > 1:``) cannot be decided and the export
# fails. The retry propagates the call's real tensors beside the fake ones, so each such value
# is read off the real tensor (an ``item`` node of the graph whose result is a constant, or an
# unbacked symbol that runtime assertions pin). The graph is then valid only for those values:
# the tensor each one is read from becomes an extra graph output, compared after every call with
# the value the export assumed (_semantics.Guard, the TorchScript path's guards), and a call that
# reads another value is exported again, never run on a stale graph.

_ITEM_OPS = ("aten::item", "aten::_local_scalar_dense")


def _data_dependent(e):
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode
    cause = e
    while cause is not None:
        if isinstance(cause, GuardOnDataDependentSymNode):
            return True
        cause = cause.__cause__ or cause.__context__
    return False


class _GradModeSemantics(torch.overrides.TorchFunctionMode):
    """While torch.export traces: what its training IR does not say about grad mode. An in-place
    op under ``torch.no_grad()`` on a tensor that requires grad reaches the IR as a plain in-place
    op (no grad-mode region marks it), which would be differentiated where eager autograd ignores
    the change: refused by name, as on the TorchScript path. ``F.gaussian_nll_loss`` does exactly
    that to ``var`` (its clamp to eps): ``var`` is lifted first, the TorchScript path's rule
    (_semantics._gaussian_nll_var_lifted), so the clamp changes nothing. ``F.linear_cross_entropy``
    with chunking ``options`` would call torch's own autograd.Function: it takes torch's
    reference path, as under torch.jit.trace (_semantics.linear_cross_entropy_reference). torch's
    CTC loss, which torch.export cannot trace (``aten._ctc_loss`` has no fake kernel), becomes
    ortmod's op for the engine's CTCLoss node (_export_ctc.traced_ctc_loss), however module code
    calls it."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        from . import _semantics
        kwargs = kwargs or {}
        if getattr(_functions, "inside", 0):       # a user's Function's forward: run in PyTorch
            return func(*args, **kwargs)
        if func in _ctc_functions():
            return _export_ctc.traced_ctc_loss(func, args, kwargs)
        if func is torch.nn.functional.gaussian_nll_loss:
            args, kwargs = _semantics._gaussian_nll_var_lifted(args, kwargs)
        if func is getattr(torch.nn.functional, "linear_cross_entropy", None):
            return _semantics.linear_cross_entropy_reference(args, kwargs)
        if not torch.is_grad_enabled():
            _semantics.refuse_in_place_without_grad(func, args)
        return func(*args, **kwargs)


@functools.lru_cache(maxsize=None)
def _ctc_functions():
    return _export_ctc.traced_functions()


@contextlib.contextmanager
def _real_values_decide():
    """torch's real-tensor propagation (what its draft_export uses), with the parameters' and
    buffers' real values: torch 2.13 gives their fakes uninitialised real tensors (a branch on a
    Linear's output was decided on garbage). Should another torch misdecide still, the guards
    catch it on the first call: the engine's value differs from the decision, and ortmod refuses."""
    def fakify_with_values(fake_mode, mod):
        fakes = fakify(fake_mode, mod)
        state = {**dict(mod.named_parameters(remove_duplicate=False)),
                 **dict(mod.named_buffers(remove_duplicate=False))}
        for name, fake in fakes.items():
            real = state.get(name)
            if real is not None and getattr(fake, "real_tensor", None) is not None:
                fake.real_tensor = real.detach().clone()
        return fakes

    export_trace = compat.export_trace
    fakify = export_trace.fakify_params_buffers
    with export_trace.patched("fakify_params_buffers", fakify_with_values), compat.propagate_real_tensors(), \
            _integer_signbit_as_lt():
        yield


@contextlib.contextmanager
def _integer_signbit_as_lt():
    """torch 2.13's prims.signbit has an integer input's dtype on fake tensors and bool on real
    ones, which real-tensor propagation refuses (MetadataMismatchError; in the trace and in the
    decomposition's re-trace, whose fake tensors keep the real values). Fake tensors with symbolic
    sizes reach it through torch's reference of integer floor division (Wav2Vec2's
    torch.div(lengths, stride, rounding_mode="floor")); there, while real values decide, signbit
    of an integer tensor is computed as x < 0, its meaning (a bool, as eager's). Only the fake
    computation changes: the graph records the op the module called."""
    decomposition_table = compat.decomposition_table()
    signbit = torch.ops.aten.signbit.default
    with _signbit_lock:
        # the table is torch's, process-wide: the first of overlapping exports (another thread's
        # decomposition runs outside _export_lock) patches it, the last puts torch's back
        if _signbit_patch["depth"] == 0:
            _signbit_patch["reference"] = reference = decomposition_table.get(signbit)
            if reference is not None:
                def integer_signbit(x):
                    if isinstance(x, torch.Tensor) and not x.is_floating_point() and x.dtype != torch.bool:
                        return torch.lt(x, 0)
                    return reference(x)
                decomposition_table[signbit] = integer_signbit
        _signbit_patch["depth"] += 1
    try:
        yield
    finally:
        with _signbit_lock:
            _signbit_patch["depth"] -= 1
            if _signbit_patch["depth"] == 0 and _signbit_patch["reference"] is not None:
                decomposition_table[signbit] = _signbit_patch["reference"]


_signbit_lock = threading.Lock()
_signbit_patch = {"depth": 0, "reference": None}


def _free_unbacked(value):
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return {str(s) for s in value.node.expr.free_symbols if str(s).startswith("u")}
    return set()


def _real_value(value, ep):
    """The value an ``item`` node took: a constant when the real value specialised it, else its
    unbacked symbol's real value (pinned to one value by the export's ranges)."""
    if isinstance(value, (bool, int, float)):
        return value
    expr = value.node.expr
    if not expr.free_symbols:       # specialised to a constant
        return {torch.SymBool: bool, torch.SymFloat: float}.get(type(value), int)(expr)
    shape_env = value.node.shape_env
    real = getattr(shape_env, "real_tensor_prop_unbacked_vals", {}) or {}
    if expr in real:
        v = real[expr]
    else:
        vr = ep.range_constraints.get(expr)
        if vr is None or vr.lower != vr.upper:
            return None
        v = vr.lower
    if isinstance(value, torch.SymBool):
        return bool(v)
    return float(v) if isinstance(value, torch.SymFloat) else int(v)


def _decided_or_asserted(val, asserted):
    decided = isinstance(val, (bool, int, float)) or (
        isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)) and not val.node.expr.free_symbols)
    # else a number the graph computes with symbolically: nothing was decided
    return decided or bool(_free_unbacked(val) & asserted)


def _freeze_decisions(module, ep, n_user_out, strict_trace):
    """The guards of an export whose data-dependent branches real values decided: each ``item``
    node that a decision rests on (a constant result, or an unbacked symbol some runtime assertion
    constrains) has its input tensor added as a user output after the module's own; returns the
    _semantics.Guard list (output indices counted over the module's outputs)."""
    import re
    from torch.export.graph_signature import OutputKind, OutputSpec, TensorArgument
    from . import _semantics
    asserted = set()
    for node in ep.graph.nodes:
        if node.op == "call_function" and getattr(node.target, "__name__", "").startswith(_ASSERTS):
            if isinstance(node.args[0], torch.fx.Node):
                asserted |= _free_unbacked(node.args[0].meta.get("val"))
    picked = []
    items = [node for node in ep.graph.nodes if node.op == "call_function" and isinstance(node.target, compat.OpOverload)
             and node.target.name().split(".")[0] in _ITEM_OPS]
    # torch 2.11 leaves a branch's Python bool read from a tensor as an unbacked SymBool (Eq(u0, 1))
    # with no runtime assertion on it: where nothing else ties the decision to a value, each such
    # bool is guarded (a bool only decides; a guard too many costs an export, never a result)
    tied = [n for n in items if _decided_or_asserted(n.meta.get("val"), asserted)]
    bools = [n for n in items if isinstance(n.meta.get("val"), torch.SymBool)]
    for node in tied or bools:
        val = node.meta.get("val")
        value = _real_value(val, ep)
        source = node.args[0]
        stack = node.meta.get("stack_trace") or ""
        where = _user_line(stack)
        # read by library code (torch's own module checks, transformers' mask checks): guarded
        # the same, but the user hears of it only when it changes (as on the TorchScript path)
        innermost = re.findall(r'File "([^"]+)", line \d+', stack)
        internal = not innermost or _semantics._is_library(innermost[-1])
        if value is None or not isinstance(source, torch.fx.Node):
            raise UnsupportedModelError(
                f"{type(module).__name__}: a branch on a tensor's value{f' (at {where})' if where else ''} "
                "could not be tied to one value for the torch.export capture path; ORTMOD_CAPTURE=torchscript "
                "guards it with the TorchScript exporter")
        picked.append((source, value, where, internal))
    if not picked:
        raise ExportError(f"torch.export capture of {type(module).__name__}: a data-dependent branch was "
                          "decided by real values, but no value read from a tensor was found to guard")
    guards = [_semantics.Guard(n_user_out + k, value, "a value read from a tensor", where or "<unknown>",
                               internal=internal)
              for k, (_, value, where, internal) in enumerate(picked)]
    hazards = [g.describe() for g in guards if not g.internal]
    if hazards and strict_trace:
        raise UnsupportedModelError(
            f"the export of {type(module).__name__} decided branches on tensor values: " + "; ".join(hazards)
            + " (strict_trace is on: compute them with tensor ops, or turn strict_trace off to let ortmod "
            "guard them)")
    # the guarded tensors become user outputs, after the module's own (graph and signature alike)
    out_node = next(n for n in ep.graph.nodes if n.op == "output")
    outs = list(out_node.args[0])
    specs = ep.graph_signature.output_specs
    last_user = max(i for i, s in enumerate(specs) if s.kind == OutputKind.USER_OUTPUT)
    for k, (source, *_) in enumerate(picked):
        outs.insert(last_user + 1 + k, source)
        specs.insert(last_user + 1 + k, OutputSpec(kind=OutputKind.USER_OUTPUT,
                                                   arg=TensorArgument(name=source.name), target=None))
    out_node.args = (tuple(outs),) + tuple(out_node.args[1:])
    # the guards check what the runtime assertions on those values did: the assertions go, and
    # with them the item nodes and the symbolic arithmetic that only fed them
    for node in list(ep.graph.nodes):
        if node.op == "call_function" and getattr(node.target, "__name__", "").startswith(_ASSERTS):
            cond = _meta_val(node.args[0])
            if cond is None or not isinstance(cond, torch.SymBool) or _free_unbacked(cond) or \
                    not cond.node.expr.free_symbols:
                ep.graph.erase_node(node)
    ep.graph.eliminate_dead_code()
    ep.graph_module.recompile()
    # the call signature's output structure too: decomposition calls the program through it
    for entry in ep.module_call_graph:
        if entry.fqn == "" and entry.signature is not None:
            entry.signature.outputs.extend(TensorArgument(name=source.name) for source, *_ in picked)
            entry.signature.out_spec = pytree.tree_structure(
                tuple(range(n_user_out + len(picked))))
    return guards


# ---------------------------------------------------------------------------------------------
# a user's autograd.Function: one opaque op per call, the TorchScript path's ortmod::PythonOp in ONNX
#
# torch.export would inline a Function's forward and lose its backward. While it traces,
# Function.apply is replaced: a user's Function becomes ``ortmod::python_op(tensors, call)``, an
# op that decomposition leaves alone, whose fake kernel runs the user's forward on the fake
# tensors (the output shapes, symbolic sizes included, are the forward's own). The call's record
# is _pyop's FunctionSpec, kept by a _pyop.FunctionRecorder as on the TorchScript path; the ONNX
# translation gives the node that path gives, so the engine and _pyop.FunctionRunner run it.

_functions = threading.local()     # .recorder: the FunctionRecorder of the export in progress


@torch.library.custom_op("ortmod::python_op", mutates_args=())
def python_op(xs: list[torch.Tensor], call: int) -> list[torch.Tensor]:
    """Call ``call`` of the export in progress: the user's forward on ``xs``."""
    return _run_function(xs, call)


@python_op.register_fake
def _python_op_fake(xs, call):
    return _run_function(xs, call)


def _run_function(xs, call):
    recorder = getattr(_functions, "recorder", None)
    if recorder is None:
        raise RuntimeError("ortmod::python_op stands for a user's autograd.Function only while ortmod captures "
                           "a module with torch.export")
    spec = recorder.calls[call]
    # grad enabled, on copies that require grad where the call's arguments did: the outputs'
    # requires_grad is then eager's (mark_non_differentiable, integer outputs)
    copies = [x.detach().requires_grad_(rg) for x, rg in zip(xs, spec.requires_grad)]
    versions = [c._version for c in copies]
    fake_mode = compat.detect_fake_mode(xs)
    shape_env = getattr(fake_mode, "shape_env", None)
    _functions.inside = getattr(_functions, "inside", 0) + 1
    try:
        # a number the forward takes from a tensor (.item()) is a fresh unbacked symbol that no
        # output holds (checked below): the forward runs in PyTorch, the graph never sees it
        with torch.enable_grad(), (shape_env.ignore_fresh_unbacked_symbols() if shape_env is not None
                                   else contextlib.nullcontext()):
            ys = _unpatched_apply(spec.cls)(*spec.args(copies))
    except UnsupportedModelError:
        raise
    except Exception as e:
        if any(c._version != v for c, v in zip(copies, versions)):
            raise _refuse_in_place(spec) from e
        raise UnsupportedModelError(
            f"{spec.name} (called at {spec.where}): its forward does not run on torch.export's fake tensors, "
            f"from which ortmod takes its output shapes ({type(e).__name__}: {str(e).splitlines()[0][:300]}); "
            "ORTMOD_CAPTURE=torchscript captures it with the TorchScript exporter") from e
    finally:
        _functions.inside -= 1
    if any(c._version != v for c, v in zip(copies, versions)):
        raise _refuse_in_place(spec)
    returns_tuple = isinstance(ys, tuple)
    ys = ys if returns_tuple else (ys,)
    if not ys or not all(isinstance(y, torch.Tensor) for y in ys):
        raise UnsupportedModelError(f"{spec.cls.__qualname__}.apply (at {spec.where}) returns something other than "
                                    "tensors; ortmod runs Functions that return a tensor or a tuple of tensors")
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
    if free_unbacked_symbols([y.shape for y in ys]):
        raise UnsupportedModelError(
            f"{spec.name} (called at {spec.where}) returns a tensor whose size depends on tensor values; on the "
            "torch.export path ortmod plans a Function's outputs from their sizes (ORTMOD_CAPTURE=torchscript "
            "captures it with the TorchScript exporter)")
    if spec.out_dtypes is None and issubclass(spec.cls, _OpCall):
        # autograd does not record below python_op's dispatch, where a custom op's own autograd
        # runs: its floating outputs are differentiable as eager's are (an op without a registered
        # backward raises in eager's backward, and in the runner's, naming the op)
        spec.set_outputs(ys, returns_tuple, [y.is_floating_point() and any(spec.requires_grad) for y in ys])
    elif spec.out_dtypes is None:
        differentiable = [y.requires_grad for y in ys]
        if any(spec.requires_grad) and not any(differentiable) and not _autograd_records(copies, spec):
            raise RuntimeError(f"ortmod: autograd does not record inside the fake kernel of {spec.name}, so which "
                               "of its outputs are differentiable cannot be told (ortmod bug for this torch)")
        spec.set_outputs(ys, returns_tuple, differentiable)
    elif [y.dtype for y in ys] != spec.out_dtypes:
        raise RuntimeError(f"{spec.name}: its forward gave other dtypes when traced again (ortmod bug)")
    # fresh tensors: an op's outputs alias neither its inputs nor each other; contiguous, as the
    # engine hands them back
    return [y.detach().clone(memory_format=torch.contiguous_format) for y in ys]


def _autograd_records(copies, spec):
    probe = next(c for c, rg in zip(copies, spec.requires_grad) if rg)
    with torch.enable_grad():
        return (probe * 1).requires_grad


def _refuse_in_place(spec):
    return UnsupportedModelError(
        f"{spec.name} (called at {spec.where}) changes one of its arguments in place (ctx.mark_dirty); ortmod "
        "runs a Function on copies of its arguments, so the change would not reach the caller's tensor")


def _concrete(value):
    """A number computed from a symbolic size, as eager passes it: a plain number. Asking for
    its value specialises the sizes it comes from, which the ShapeGuard then checks per call (a
    call with other sizes is exported again)."""
    if isinstance(value, torch.SymInt):
        return int(value)
    if isinstance(value, torch.SymFloat):
        return float(value)
    if isinstance(value, torch.SymBool):
        return bool(value)
    return value


_original_apply = compat.function_apply()
_OWN_OP_FUNCTIONS = "GeneratedBackwardFor_ortmod_"     # torch._library.autograd's class names


def _export_apply(cls, *args, **kwargs):
    recorder = getattr(_functions, "recorder", None)
    if recorder is None or getattr(_functions, "inside", 0) or cls.__name__.startswith(_OWN_OP_FUNCTIONS):
        # another thread, a Function called by a user's forward (eager runs it as plain code), or
        # the autograd wrapper torch.library gives ortmod's own ops (ortmod::ctc_loss: the graph
        # keeps the op, and the engine differentiates its node)
        return compat.call_apply(_original_apply, cls, *args, **kwargs)
    if not (issubclass(cls, _OpCall) or recorder.keeps(cls)):
        raise _pyop.refuse_torch_function(cls)
    if kwargs:
        raise _pyop.refuse_keywords(cls)
    from ._semantics import user_frame
    where = user_frame(2)
    args = tuple(a if isinstance(a, torch.Tensor) else pytree.tree_map(_concrete, a) for a in args)
    spec = _pyop.FunctionSpec(cls, args, None, where, grad_enabled=torch.is_grad_enabled())
    call = len(recorder.calls)
    recorder.calls.append(spec)
    outs = torch.ops.ortmod.python_op.default([a for a in args if isinstance(a, torch.Tensor)], call)
    if spec.out_differentiable is None:
        raise RuntimeError(f"ortmod: the fake kernel of {spec.name} did not run while torch.export traced it "
                           "(ortmod bug for this torch)")
    # an output eager gives no history (mark_non_differentiable, a call under no_grad) gets no
    # gradient: detach, which becomes a stop-gradient in the graph (_insert_stop_gradients)
    outs = [o.detach() if not d and o.is_floating_point() else o for o, d in zip(outs, spec.out_differentiable)]
    return tuple(outs) if spec.returns_tuple else outs[0]


@contextlib.contextmanager
def _function_records(recorder):
    """For one export, from torch.export to the ONNX translation: the recorder whose calls the
    op's kernels and its translation read."""
    _functions.recorder = recorder
    try:
        yield recorder
    finally:
        _functions.recorder = None


# ---- a library's custom op (torch.library): a callback node like a user's Function ----------
#
# torch.export keeps a custom op as one node of the graph, which the engine cannot run. Its
# forward and its registered backward are the library's code, so each call becomes
# ortmod::python_op as a Function's does: the op stands where the Function class would (an
# _OpCall class whose ``apply`` calls it); at run time _pyop.FunctionRunner calls the op with
# grad enabled and differentiates it through its registered autograd. An op without one fails
# in its backward as in eager, naming the op.

# torch's own namespaces: the translation and the audit deal with these ops
_TORCH_NAMESPACES = frozenset({"aten", "prims", "ortmod", "higher_order", "_c10d_functional", "c10d", "profiler",
                               "_c10d_functional_autograd", "_dtensor", "quantized_decomposed", "onnx", "rngprims",
                               "debugprims", "inductor", "quantized", "_quantized", "_export", "mkldnn", "sparse"})


class _OpCall:
    """Stands where a Function class does in a _pyop.FunctionSpec (subclassed per op)."""
    op = None

    @classmethod
    def apply(cls, *args):
        return cls.op(*args)


_OP_CALLS = {}


def _op_call_class(op):
    cls = _OP_CALLS.get(op)
    if cls is None:
        cls = _OP_CALLS[op] = type(str(op), (_OpCall,), {"op": op, "__module__": op.namespace,
                                                         "__qualname__": f"{op._opname}.{op._overloadname}"})
    return cls


def _library_op(func):
    """func as the OpOverload of a library's custom op, else None."""
    if isinstance(func, compat.OpOverloadPacket) and func.overloads() == ["default"]:
        func = func.default
    if isinstance(func, compat.OpOverload) and func.namespace not in _TORCH_NAMESPACES:
        return func
    return None


class _LibraryOpCalls(torch.overrides.TorchFunctionMode):
    """While torch.export traces: a call of a library's custom op becomes ortmod::python_op."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        op = _library_op(func)
        if op is None or getattr(_functions, "inside", 0) or getattr(_functions, "recorder", None) is None:
            return func(*args, **kwargs)
        if kwargs:
            raise UnsupportedModelError(f"the custom op {op} is called with keyword arguments; ortmod captures a "
                                        "custom op's positional arguments only")
        return _export_apply(_op_call_class(op), *args)


def _unpatched_apply(cls):
    """cls.apply as torch defines it, while ortmod's interception is in place."""
    if issubclass(cls, _OpCall):
        return cls.apply
    return functools.partial(compat.call_apply, _original_apply, cls)


@contextlib.contextmanager
def _intercepting_apply(recorder):
    """While torch.export traces: a user's Function.apply, and a library's custom op, become
    ortmod::python_op. With ``recorder.inline_all`` apply is left alone, and torch.export inlines
    every Function, as asked (a custom op stays an op, which the audit refuses by name)."""
    if recorder.inline_all:
        yield
        return
    with compat.patched_function_apply(_export_apply), _LibraryOpCalls():
        yield


_export_lock = threading.Lock()

# torch dtype -> ONNX element type
_ONNX_TYPES = {torch.float32: 1, torch.uint8: 2, torch.int8: 3, torch.int16: 5, torch.int32: 6, torch.int64: 7,
               torch.bool: 9, torch.float16: 10, torch.float64: 11, torch.bfloat16: 16}


# ---------------------------------------------------------------------------------------------
# the export


class _ExportWrapper(_FlatWrapper):
    """_FlatWrapper for torch.export. Non-strict export restores the state a traced forward
    changes on the module (even in a dict it holds) and warns of a tensor assigned to it, so the
    output structure and the guarded numbers go into a process-wide table under the wrapper's
    number, and nothing of the call is kept on the wrapper (the TorchScript path's eager_out)."""

    _tokens = itertools.count()
    _seen = {}

    def __init__(self, module, flat):
        super().__init__(module, flat)
        self.__dict__["_token"] = next(self._tokens)
        self.guards = _semantics.TraceGuards()

    def expand(self, out):
        # no eager run comes first: a number torch.export traced symbolically (``x.shape[0]``, an
        # int eager returns) is eager's number by its value for this call, guarded as the
        # TorchScript path guards the 0-d tensor its trace makes of one
        return _capture.expand_objects(out, guards=self.guards, number=_symbolic_number)

    def forward(self, *tensors):
        # taken inside the trace, where torch has put its fakes in for the parameters (an RNN's
        # _flat_weights holds them too): what forward itself sets is what changes from here
        attributes = _user_attributes(self.module)
        plain = _capture.plain_attributes(self.module)
        outs = super().forward(*tensors)
        # (plain attributes forward changed are read here: torch.export puts them back after)
        _ExportWrapper._seen[self._token] = (self.out_spec, self.out_leaves, self.out_tensor_positions,
                                             [(kind, value, where, internal)
                                              for _, kind, value, where, internal in self.guards.records],
                                             _set_to_trace_values(self.module, attributes),
                                             _capture.changed_attributes(plain))
        return outs

    def take_structure(self):
        """The output structure of the last trace; returns its guarded numbers ((kind, value,
        where, internal) per extra output after the module's tensors), the module's attributes
        that held values of the trace when forward returned, and the plain attributes forward
        changed (_capture.changed_attributes)."""
        seen = _ExportWrapper._seen.pop(self._token, None)
        self.guards.reset()         # no traced tensor kept alive
        if seen is None:
            return [], [], []
        self.out_spec, self.out_leaves, self.out_tensor_positions, numbers, assigned, changed = seen
        return numbers, assigned, changed


# per symbolic number type: the dtype of its 0-d tensor in the graph and the Python type eager has
_SYMBOLIC_TYPES = {torch.SymInt: (torch.int64, int), torch.SymFloat: (torch.float64, float),
                   torch.SymBool: (torch.bool, bool)}


def _symbolic_number(value, reference=None):
    """torch.export's stand-in for a Python number computed from sizes (a SymInt for
    ``x.shape[0]``, whose value the user's int would be): (eager's number, the symbolic value as a
    0-d tensor of the graph) where ``value`` is one; else None. Its value for the traced call is
    its symbols' hint, read without the guard that int() would add (it would make the size
    static)."""
    if type(value) not in _SYMBOLIC_TYPES:
        return None
    dtype, python_type = _SYMBOLIC_TYPES[type(value)]
    hint = value.node.hint if value.node.has_hint() else None
    if hint is None:
        raise UnsupportedModelError(
            f"the module returns a {type(value).__name__.replace('Sym', '').lower()} computed from a tensor's "
            f"value ({value.node.expr}) that the torch.export capture path cannot give back as a number; "
            "return it as a tensor, or use ORTMOD_CAPTURE=torchscript, which guards it")
    return python_type(hint), torch.scalar_tensor(value, dtype=dtype)


def available():
    """Whether this torch has what this path uses (torch.export and its ONNX translator)."""
    try:
        compat.onnx_core.module(), compat.onnx_registration.module()
        import onnxscript  # noqa: F401
    except (ImportError, compat.TorchFeatureMissing):
        return False
    return hasattr(torch, "export")


def export(module, flat, strict_trace=False, inline_functions=False, dynamic=None):
    """Export ``module`` called as ``flat`` describes with torch.export; the same record as
    ``_capture.export``. ``dynamic``: the (tensor input, dim) pairs exported as symbolic sizes
    (None: none; ``Exported.static_dims`` lists the others, and a call that changes one of them
    exports again with it dynamic)."""
    recorder = _pyop.FunctionRecorder(inline_all=inline_functions)
    with _function_records(recorder):
        return _export(module, flat, recorder, strict_trace, dynamic or frozenset())


def _without_grad(t):
    if not (t.is_leaf or t.retains_grad) or t.grad is None:
        return t
    return t.detach().requires_grad_(t.requires_grad)


def _export(module, flat, recorder, strict_trace, dynamic):
    t0 = time.perf_counter()
    try:    # once per process, with torch.export's own (torch._dynamo) below: ~3 s of a first call
        import onnx
        _core = compat.onnx_core
        _core.module()
        import onnx_ir
    except (ImportError, compat.TorchFeatureMissing) as e:
        raise ExportError(f"the torch.export capture path needs torch's ONNX translator and onnxscript: {e}") from e
    timings = {"imports": time.perf_counter() - t0}
    # BatchNorm(momentum=None) in training: refused by name, as on the TorchScript path (its
    # factor 1/num_batches_tracked is a Python number read from a buffer, on which torch.export
    # fails with a data-dependent guard)
    _capture._batchnorm_buffers(module)
    wrapper = _ExportWrapper(module, flat)
    tensor_indices = flat.tensor_indices()
    # the call's tensors without their .grad: torch.export guards on a gradient an input
    # carries (one left by an earlier backward), and its decomposition re-trace, on fresh fake
    # inputs without one, then fails ('NoneType' object has no attribute 'size')
    tensors = tuple(_without_grad(flat.leaves[i]) for i in tensor_indices)
    dims = tuple({d: torch.export.Dim.AUTO for d in range(t.dim()) if (k, d) in dynamic}
                 for k, t in enumerate(tensors))

    def trace(inputs, real_values, size_oblivious):
        # size-oblivious, as torch.onnx exports dynamic shapes: torch.export otherwise
        # specialises a dim whose sample size is 0 or 1 ("0/1 specialization") and excludes
        # 0 and 1 from one traced at another size, so batches of 1 and of n would export in
        # turn; where the graph does depend on a size being 1, its guard says so (ShapeGuard)
        with _intercepting_apply(recorder), _export_rules_rnn.static_projection_lengths(module), \
                (_real_values_decide() if real_values else contextlib.nullcontext()), _GradModeSemantics(), \
                compat.size_oblivious(size_oblivious):
            return torch.export.export(wrapper, inputs, dynamic_shapes=(dims,), strict=False)

    def capture(size_oblivious):
        """The exported program, and whether real values decided data-dependent branches."""
        recorder.calls.clear()
        try:
            return trace(tensors, False, size_oblivious), False
        except UnsupportedModelError:
            raise
        except Exception as e:
            if not _data_dependent(e):
                raise _export_error(module, "torch.export.export", e) from e
        # Python branched on a tensor's value (`if torch.equal(mask, causal):`): export again,
        # deciding such branches with the call's real values; each decision is then guarded
        # (_freeze_decisions), as the TorchScript path guards what its trace froze
        recorder.calls.clear()
        # the real tensors are copied beside the fake ones, which an input whose elements
        # share memory (an expand()ed one) cannot be: those go in as dense copies, same values
        real = tuple(t.contiguous() if compat.has_internal_overlap(t) == 1 else t for t in tensors)
        try:
            return trace(real, True, size_oblivious), True
        except UnsupportedModelError:
            raise
        except Exception as e2:
            raise _export_error(module, "torch.export.export", e2) from e2

    attributes = _attribute_names(module)
    with _export_lock, _capture._preserved_state(module, _capture.cuda_devices(module, flat)), \
            _removing_trace_values(module, attributes):
        # Size-oblivious tracing takes a dynamic size for one that is not 1 where it decides
        # something by it, which a size 1 in the sample can contradict (a size 1 dim broadcast
        # against another dynamic one): then the trace fails, or the export does not hold for
        # its own sample, and it is traced again with torch's 0/1 specialisation.
        ep = None
        if dynamic:
            try:
                ep, frozen = capture(size_oblivious=True)
                guard = _shape_guard(ep, len(tensors))
            except ExportError as e:
                logger.info("size-oblivious export failed (%s); exporting with 0/1 specialisation", e)
            else:
                if not guard.holds(tuple(tuple(t.shape) for t in tensors)):
                    ep = None
        if ep is None:
            ep, frozen = capture(size_oblivious=False)
            guard = _shape_guard(ep, len(tensors))
    timings["torch.export"] = time.perf_counter() - t0 - timings["imports"]
    numbers, assigned, changed = wrapper.take_structure()
    _capture.warn_attribute_changes(module, changed, strict_trace)
    if assigned:
        # eager leaves each call's value there; ortmod runs forward only when it exports
        raise UnsupportedModelError(
            f"{type(module).__name__}.forward sets {', '.join(assigned)} to a value computed in the call (a "
            "tensor, or a number from a size): eager leaves each call's value there, but ortmod runs forward "
            "only when it exports, so the attribute would not follow later calls; return the value as an "
            "output instead")
    if not wrapper.out_tensor_positions:
        raise UnsupportedModelError("the module returned no tensors; there is nothing to run")
    _capture.check_output_leaves(wrapper)

    from torch.export.graph_signature import InputKind, OutputKind
    sig = ep.graph_signature
    _check_output_kinds(sig)
    n_user_out = sum(1 for s in sig.output_specs if s.kind == OutputKind.USER_OUTPUT)
    # the module's tensors, then its guarded numbers (the wrapper's), then what real values decided
    n_tensors = len(wrapper.out_tensor_positions)
    if n_user_out != n_tensors + len(numbers):
        raise ExportError(f"the exported program has {n_user_out} outputs, expected {n_tensors} tensors and "
                          f"{len(numbers)} guarded numbers")
    guards = [_semantics.Guard(n_tensors + k, value, kind, where, internal)
              for k, (kind, value, where, internal) in enumerate(numbers)]
    if frozen:
        guards += _freeze_decisions(module, ep, n_user_out, strict_trace)
    _insert_stop_gradients(ep.graph_module)
    for gm in ep.graph_module.modules():
        if isinstance(gm, torch.fx.GraphModule) and gm is not ep.graph_module:
            _insert_stop_gradients(gm)
    from . import _export_rules
    for gm in ep.graph_module.modules():
        if isinstance(gm, torch.fx.GraphModule):
            _export_rules.unbatched_nll_loss_forward(gm)
            _export_rules.unbatched_cross_entropy_loss(gm)
            _export_rules.keep_whole(gm)
            _export_ctc.masked_targets(gm)

    t1 = time.perf_counter()
    registry = _registry()
    timings["registry"] = time.perf_counter() - t1
    t1 = time.perf_counter()
    try:
        # an export that real values decided carries them into decomposition's re-trace too
        with _integer_signbit_as_lt() if frozen else contextlib.nullcontext(), _without_torch_deprecations():
            ep = _prepare(ep, registry)
    except Exception as e:
        raise _export_error(module, "decomposing the exported program", e) from e
    timings["decompose"] = time.perf_counter() - t1
    # again on the decomposed program: the training IR keeps in-place ops as they are, and only
    # decomposition's functionalization names what they mutate (nn.Embedding(max_norm=...)
    # renormalizes its weight in place through a detach(): no mutation before, a
    # PARAMETER_MUTATION after, which the outputs kept below would drop without a word)
    _check_output_kinds(ep.graph_signature)
    for gm in ep.graph_module.modules():
        if isinstance(gm, torch.fx.GraphModule):
            _splits_to_slices(gm)
    _audit(module, ep)
    # Mutated buffers: torch's translator drops them ("TODO: decide if we should keep mutated
    # buffers"); as user outputs they stay, after the module's own, in signature order.
    sig = ep.graph_signature
    mutations = [s for s in sig.output_specs if s.kind == OutputKind.BUFFER_MUTATION]
    user_specs = [s for s in sig.output_specs if s.kind == OutputKind.USER_OUTPUT]
    if len(user_specs) != n_tensors + len(guards):
        raise ExportError("decomposition changed the exported program's outputs")
    for s in mutations:
        s.kind = OutputKind.USER_OUTPUT
    sig.output_specs[:] = user_specs + mutations
    t1 = time.perf_counter()
    try:
        with _without_torch_deprecations():
            program = _core.exported_program_to_onnx_program(ep, registry=registry)
    except Exception as e:
        raise _export_error(module, "translating the exported program to ONNX", e) from e
    timings["translate"] = time.perf_counter() - t1
    model_ir = program.model
    # torch's translator declares the default domain at torchlib's opset (18) whatever the
    # registry's, and torch.onnx.export converts afterwards; the rules here are opset 20's (Gelu
    # is 20's), the version the TorchScript path exports and the engine reads. Declared so, a
    # saved graph (save_onnx, the runner) is valid ONNX.
    model_ir.opset_imports[""] = ONNX_OPSET
    # Parameters and buffers are graph inputs, read where torch keeps them (state_dict names);
    # lifted constants stay initializers.
    state_kinds = {}
    for s in sig.input_specs:
        if s.kind in (InputKind.PARAMETER, InputKind.BUFFER):
            state_kinds[s.target] = s.kind
    graph = model_ir.graph
    for name in list(graph.initializers):
        if name in state_kinds:
            value = graph.initializers.pop(name)
            value.const_value = None
            graph.inputs.append(value)
    user_inputs = [v.name for v in graph.inputs if v.name not in state_kinds]
    if len(user_inputs) != len(tensors):
        raise ExportError(f"the ONNX translation has {len(user_inputs)} call inputs, expected {len(tensors)}")
    renames = {}
    for k, v in enumerate(list(graph.inputs)):
        if v.name not in state_kinds:
            renames[v.name] = f"input_{user_inputs.index(v.name)}"
    for v in graph.inputs:
        if v.name in renames:
            v.name = renames[v.name]
    proto = onnx_ir.serde.serialize_model(model_ir)
    _lower_cast_like(proto)
    _check_ops(module, proto)
    outs_meta = _output_vals(ep, n_user_out)
    _check_output_dtypes(module, proto, outs_meta)

    _drop_unread_state(proto, state_kinds)
    graph_inputs = {}
    for gi in proto.graph.input:
        if gi.name in state_kinds:
            graph_inputs[gi.name] = GraphInput(gi.name, "state", state_name=_state_name(gi.name))
        else:
            k = int(gi.name[len("input_"):])
            graph_inputs[gi.name] = GraphInput(gi.name, "input", leaf_index=tensor_indices[k])
    if len(proto.graph.output) != n_tensors + len(guards) + len(mutations):
        raise ExportError(f"the ONNX translation has {len(proto.graph.output)} outputs, expected "
                          f"{n_tensors}, {len(guards)} guards and {len(mutations)} buffer updates")
    updates = [(n_tensors + len(guards) + k, _state_name(s.target)) for k, s in enumerate(mutations)]
    output_deps = _capture._output_dependencies(proto)
    onnx_bytes = proto.SerializeToString()
    timings["total"] = time.perf_counter() - t0
    exported = Exported(onnx_bytes, graph_inputs, wrapper.out_spec, wrapper.out_leaves,
                        wrapper.out_tensor_positions, updates, [], output_deps, guards=guards,
                        hazards=list(dict.fromkeys(g.describe() for g in guards if not g.internal)),
                        functions=list(recorder.specs))
    exported.shape_guard = guard
    exported.static_dims = tuple((k, d, t.shape[d]) for k, t in enumerate(tensors) for d in range(t.dim())
                                 if (k, d) not in dynamic)
    exported.capture = "export"
    exported.timings = timings
    return exported


@contextlib.contextmanager
def _without_torch_deprecations():
    """torch's own deprecation warnings while it decomposes and translates (run_decompositions
    deep-copies pytree specs, and each LeafSpec copied warns): nothing the user can act on, and
    the TorchScript path's capture ignores the same categories."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        yield


def _attribute_names(module):
    """The names in each submodule's __dict__, before the trace."""
    return {id(m): set(m.__dict__) for m in module.modules()}


def _is_trace_value(v):
    return isinstance(v, _capture._SYMBOLIC_NUMBERS) or (isinstance(v, torch.Tensor) and compat.is_fake(v))


def _user_attributes(module):
    """{(submodule name, attribute): (value, whether it holds a value the trace computed)} for the
    attributes of the module and its submodules that are not nn.Module's own. The parameters and
    buffers themselves (torch's fakes of them, which an RNN's _flat_weights lists) are no such
    value."""
    modules = list(module.named_modules(remove_duplicate=False))
    state = {id(t) for _, m in modules for t in (*m._parameters.values(), *m._buffers.values())}

    def computed(v):
        return _is_trace_value(v) and id(v) not in state
    return {(name, key): (value, _capture.holds(value, computed))
            for name, m in modules for key, value in list(m.__dict__.items()) if key not in _capture.MODULE_ATTRIBUTES}


def _set_to_trace_values(module, before):
    """``sub.name`` of each attribute that holds a value of the trace (a fake tensor or a symbolic
    number, in a container or an object it holds included) and did not before (``before``:
    _user_attributes), or holds another object now: what forward set."""
    changed = []
    for (name, key), (value, traced) in _user_attributes(module).items():
        old = before.get((name, key))
        if traced and (old is None or old[0] is not value or not old[1]):
            changed.append(f"{name + '.' if name else ''}{key}")
    return list(dict.fromkeys(changed))


@contextlib.contextmanager
def _removing_trace_values(module, before):
    """torch.export puts back the module's attributes that existed before the trace, and leaves
    an attribute the forward added with the trace's fake tensor or symbolic number in the user's
    module: such attributes are removed again, whatever the export's outcome (a forward that
    sets them is refused by name: _ExportWrapper reports them)."""
    try:
        yield
    finally:
        for m in module.modules():
            known = before.get(id(m), ())
            for key in [k for k, v in m.__dict__.items()
                        if k not in known and _capture.holds(v, _is_trace_value)]:
                del m.__dict__[key]


def _state_name(target):
    return target[len(_FlatWrapper.PREFIX):] if target.startswith(_FlatWrapper.PREFIX) else target


def _export_error(module, stage, e):
    cause = e
    while cause is not None and not isinstance(cause, UnsupportedModelError):
        cause = cause.__cause__ or cause.__context__
    if cause is not None:
        return cause
    first = str(e).strip().split("\n", 1)[0]
    first = first[:500] + (" ..." if len(first) > 500 else "")
    branch = _data_dependent_branch(e)
    if branch:
        # e.g. F.gaussian_nll_loss's `if torch.any(var < 0): raise ...`: the trace runs on fake
        # tensors, which have no values to branch on
        first = (f"the forward branches on tensor values at {branch}, which torch.export cannot trace "
                 f"(it does not guard on data-dependent values: {first})")
    return ExportError(f"torch.export capture of {type(module).__name__} failed in {stage}: "
                       f"{type(e).__name__}: {first} (full error in __cause__)")


def _data_dependent_branch(e):
    """'file:line: code' of the Python line whose branch on a tensor's value stopped the trace:
    the innermost frame of the traceback outside torch's tracing machinery and ortmod."""
    import os
    import traceback
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode
    if not isinstance(e, GuardOnDataDependentSymNode):
        return None
    root = os.path.dirname(torch.__file__)
    machinery = tuple(os.path.join(root, d) for d in ("_", "fx", "export", "utils", "overrides.py", "_ops.py",
                                                       "_tensor.py", "__init__.py"))
    own = os.path.dirname(__file__)
    for f in reversed(traceback.extract_tb(e.__traceback__)):
        name = f.filename
        if name.startswith(own) or name.startswith(machinery) or name.startswith("<"):
            continue
        return f"{name}:{f.lineno}: {(f.line or '').strip()}"
    return None


def _drop_unread_state(proto, state_kinds):
    """Removes the parameter and buffer inputs no node reads (torch.export lists every one; the
    TorchScript exporter only those the graph uses): such a parameter is then no input of the
    engine's autograd node, as in eager, where a head the loss leaves out is never reached.
    Passed in, it had a gradient edge that delivered nothing, on which DeepSpeed ZeRO-3's gradient
    hook still ran (and failed on the missing .grad)."""
    read = set()

    def collect(graph):
        for node in graph.node:
            read.update(node.input)
            for attr in node.attribute:
                for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                    collect(sub)
        read.update(o.name for o in graph.output)
    collect(proto.graph)
    keep = [gi for gi in proto.graph.input if gi.name not in state_kinds or gi.name in read]
    if len(keep) != len(proto.graph.input):
        del proto.graph.input[:]
        proto.graph.input.extend(keep)


def _output_vals(ep, n):
    """The traced values of the first ``n`` outputs in signature order, the order the translation
    gives the graph's outputs (the output node's own order can put buffer updates first)."""
    nodes = {node.name: node for node in ep.graph.nodes}
    return [_meta_val(nodes.get(getattr(spec.arg, "name", None))) for spec in ep.graph_signature.output_specs[:n]]


def _check_output_dtypes(module, proto, vals):
    import onnx
    for j, (out, v) in enumerate(zip(proto.graph.output, vals)):
        elem = out.type.tensor_type.elem_type
        if not elem or not isinstance(v, torch.Tensor):
            continue
        want = _ONNX_TYPES.get(v.dtype)
        if want != elem:
            raise UnsupportedModelError(
                f"the torch.export capture of {type(module).__name__} computes output {j} as "
                f"{onnx.TensorProto.DataType.Name(elem)} where eager returns {v.dtype}")


def _engine_ops():
    from . import _C
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


def _lower_cast_like(proto):
    """torchlib's CastLike(x, like) -> Cast(x, to=dtype of like) where that dtype is known (the
    engine has Cast, not CastLike, an opset-15 op)."""
    from onnx import helper
    types = {}
    for vi in itertools.chain(proto.graph.input, proto.graph.value_info, proto.graph.output):
        if vi.type.tensor_type.elem_type:
            types[vi.name] = vi.type.tensor_type.elem_type
    for init in proto.graph.initializer:
        types[init.name] = init.data_type
    for node in proto.graph.node:
        if node.op_type == "Constant":
            for a in node.attribute:
                if a.name == "value":
                    types[node.output[0]] = a.t.data_type
                elif a.name in ("value_float", "value_floats"):
                    types[node.output[0]] = 1
                elif a.name in ("value_int", "value_ints"):
                    types[node.output[0]] = 7
        if node.op_type == "CastLike" and node.domain in ("", "ai.onnx") and node.input[1] in types:
            to = types[node.input[1]]
            node.op_type = "Cast"
            del node.input[1:]
            del node.attribute[:]
            node.attribute.append(helper.make_attribute("to", to))
        if node.op_type == "Cast":
            for a in node.attribute:
                if a.name == "to":
                    types[node.output[0]] = a.i


def _check_ops(module, proto):
    """Refuse, by name, ONNX ops the engine does not implement (also inside local functions,
    which the engine's importer does not inline)."""
    if proto.functions:
        names = ", ".join(sorted({f.name for f in proto.functions}))
        raise ExportError(f"the torch.export capture of {type(module).__name__} holds ONNX local functions "
                          f"({names}), which ortmod's engine does not take")


# ---------------------------------------------------------------------------------------------
# the ops this path takes: each reviewed against torchlib's translation for what eager training
# means (an argument torchlib drops is refused or handled by ortmod's own rule)

def _meta_val(arg):
    """The traced value (a FakeTensor, SymInt, ...) of an FX argument; None for a constant."""
    return arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None


def _const_arg(node, k, name, default):
    if k < len(node.args):
        return node.args[k]
    return node.kwargs.get(name, default)


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


def _check_embedding(node):
    if _const_arg(node, 3, "scale_grad_by_freq", False):
        return "scale_grad_by_freq is not implemented by ortmod"
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
    if not one_mask or not isinstance(values, torch.Tensor) or not all(isinstance(d, int) and d == 1 for d in values.shape):
        return ("boolean-mask index assignment is taken only as x[mask] = v (one mask, one value); "
                "other forms need NonZero, which the engine does not have")
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
    # layout (a channels-last input with more than 3 channels takes nearest_idx); ortmod's rule
    # follows the layout the trace gives an NCHW-contiguous tensor
    val = _meta_val(node.args[0])
    if not isinstance(val, torch.Tensor) or val.dim() < 4:
        return None
    from torch.fx.experimental.symbolic_shapes import guard_or_false
    try:
        standard = guard_or_false(val.is_contiguous())
    except Exception:
        standard = False
    if not standard:
        return ("an input not contiguous in NCHW order (channels-last): eager picks its kernel's index arithmetic "
                "by memory layout, which ortmod follows for NCHW-contiguous inputs only")
    return None


# ---- norms and recurrent layers (issue 16) ----------------------------------------------------

def _check_instance_norm(node):
    # instance_norm(input, weight, bias, running_mean, running_var, use_input_stats, ...): the
    # TorchScript path's refusals (ortmod/_semantics.py _instance_norm_symbolic)
    stats = node.args[3] is not None and node.args[4] is not None
    if _const_arg(node, 5, "use_input_stats", True):
        if stats:
            return ("InstanceNorm with track_running_stats=True in training: ortmod does not update instance "
                    "norm's running statistics")
    elif not stats:
        return "instance_norm without input statistics needs running statistics"
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
        if not 0 < steps <= _export_rules_rnn.MAX_UNROLL:
            return (f"nn.LSTM(proj_size > 0) with a sequence of {steps} steps: ortmod unrolls 1 to "
                    f"{_export_rules_rnn.MAX_UNROLL}")
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


def _check_elu(node):
    # eager: x <= 0 ? scale alpha (exp(x input_scale) - 1) : scale x. torchlib scales x by
    # input_scale before Elu: the linear branch too, and the branch taken follows x input_scale.
    # nn.ELU, F.elu, CELU and SELU never pass it.
    if _const_arg(node, 3, "input_scale", 1.0) != 1:
        return "input_scale other than 1 is applied to both branches by the ONNX translation"
    return None


def _check_nll_loss_forward(node):
    if _getitem_users(node, 1):
        return "its total_weight output is read, which the ONNX translation does not compute"
    return None


def _check_celu(node):
    import numpy as np
    alpha = _const_arg(node, 1, "alpha", 1.0)
    val = _meta_val(node.args[0])
    if isinstance(val, torch.Tensor) and val.dtype == torch.float64 and alpha < 0 \
            and float(np.float32(alpha)) != float(alpha):
        return "a negative alpha that float32 cannot hold is not reproduced exactly in float64 by ortmod"
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
    "aten::embedding": _check_embedding,
    "aten::cosine_similarity": _check_one_float_dtype, "aten::cdist": _check_one_float_dtype,
    "aten::_cdist_forward": _check_one_float_dtype,
    # norms and recurrent layers (issue 16)
    "aten::instance_norm": _check_instance_norm,
    "aten::_native_batch_norm_legit": _check_batch_norm,     # .no_stats: its saved mean / invstd
    # _check_rnn_layout ends with _check_rnn (the dropout and proj_size refusals)
    "aten::lstm": _check_rnn_layout, "aten::gru": _check_rnn_layout, "aten::rnn_tanh": _check_rnn_layout,
    "aten::rnn_relu": _check_rnn_layout,
    # activations and elementwise losses (issue 16, helper "act")
    "aten::elu": _check_elu, "aten::celu": _check_celu, "aten::nll_loss_forward": _check_nll_loss_forward,
}

AUDIT_LOG = None     # a set: while set, every op the audit sees is added (to grow the reviewed list)


def _user_line(stack):
    """'file:line' of the innermost frame of a node's stack trace outside torch and ortmod."""
    import os
    import re
    own = (os.path.dirname(torch.__file__), os.path.dirname(__file__))
    frames = re.findall(r'File "([^"]+)", line (\d+)', stack)
    for name, line in reversed(frames):
        if not name.startswith(own) and not name.startswith("<"):
            return f"{name}:{line}"
    return f"{frames[-1][0]}:{frames[-1][1]}" if frames else ""


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
    # ortmod's rule: StopGradient, as ortmod::stop_gradient (what _insert_stop_gradients makes of
    # every other detach)
    "aten::detach",
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
    "aten::_log_softmax", "aten::embedding", "aten::index.Tensor",
    "aten::_native_batch_norm_legit_functional", "aten::_native_batch_norm_legit_no_training",
    "aten::scaled_dot_product_attention", "ortmod::stop_gradient", "aten::pad",
    "ortmod::python_op",     # a user's autograd.Function (its own forward and backward, in PyTorch)
    # torch's CTC loss: the engine's CTCLoss node (_export_ctc.py; eager's reduction traced around it)
    "ortmod::ctc_loss",
    # a clamp by numbers where eager's number and tensor kernels differ at the bound (2.14): the
    # number kernel's rule, its bounds 0-d tensors of the clamped dtype (_export_rules.number_clamps_back)
    "ortmod::clamp_number",
    # selection and norms (TopK, ortmod's Sort, ReduceLogSumExp; clamp_min is Clip);
    # linalg_vector_norm: ortmod's rule, every order with eager's gradient at zeros (the
    # TorchScript path's _p_norm), keepdim without a dim, dtype
    "aten::topk", "aten::sort", "aten::sort.stable", "aten::linalg_vector_norm", "aten::logsumexp", "aten::clamp_min",
    "aten::cosine_similarity",     # ortmod's rule (eager's straight-through clamp of the norms)
    # ortmod's rules (_export_rules.py): .item() without a gradient, scatter_add of a larger src,
    # a stable log_sigmoid, var/std dividing by max(0, N - correction)
    "aten::_local_scalar_dense", "aten::scatter_add", "aten::log_sigmoid", "prims::var",
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
    # any / all: ortmod's rules (_export_rules.zoo_translations), 0/1 values reduced with
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
    # ortmod's rules (_export_rules.py), the TorchScript path's decomposition: group_norm;
    # instance_norm (eval reads running stats; training with them refused by _CHECKS); BatchNorm
    # without running stats (batch statistics, differentiated through)
    "aten::group_norm", "aten::instance_norm", "aten::_native_batch_norm_legit.no_stats",
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
    # ortmod's rules (_export_rules.zoo_translations):
    # - scalar_tensor (listed above; every number the type-promotion pass makes a tensor), where
    #   and fill with a number: the number in the tensor's dtype from its int64 or double
    #   (torchlib's reach the graph as float32 constants: 0.1 in float64 was 0.10000000149);
    # - fill with a tensor (torchlib's is a local function); ceil (an int is its own ceiling);
    # - hardtanh, relu6: the engine's HardTanh, hardtanh's gradient (0 at the bounds);
    # - remainder: Mod(fmod=0), eager's fmod-and-adjust (torchlib's a - floor(a / b) * b rounds
    #   otherwise); the engine refuses a divisor's gradient by name;
    # - baddbmm: beta=0 does not read self (alpha=0 refused by _CHECKS);
    # - view_copy: a view in the decomposed graph (_views_to_view_copies), torchlib's view rule
    "aten::where.ScalarOther", "aten::where.ScalarSelf", "aten::hardtanh", "aten::relu6", "aten::remainder.Scalar", "aten::remainder.Tensor",
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
    # (what F.nll_loss traces to) by the same rule, kept whole (_export_rules.py), and
    # nll_loss_forward (unbatched inputs; its total_weight output is torchlib's placeholder:
    # _CHECKS refuses a graph that reads it)
    "aten::nll_loss", "aten::nll_loss_nd", "aten::nll_loss_forward",
    # Expand(0) in self's shape and dtype: eager's contents are unspecified; HingeEmbeddingLoss
    # and CosineEmbeddingLoss fill it before reading
    "aten::empty_like",
    # ortmod's rules (_export_rules.py): torchlib's are ONNX local functions, compute float64 in
    # float32 (celu), lose small values (log1p), give xlogy(0, 0) a NaN gradient, or decompose
    # losses whose backward is not their forward's derivative (binary_cross_entropy,
    # soft_margin_loss)
    # (leaky_relu, elu, celu, selu, hardsigmoid: float64 exact where the engine's float32
    # attribute is not; elu's input_scale other than 1 is refused by _CHECKS)
    "aten::leaky_relu", "aten::elu", "aten::hardsigmoid", "aten::softplus", "aten::celu", "aten::selu", "aten::hardswish",
    "aten::mish", "aten::glu", "aten::log1p", "aten::xlogy.Tensor", "aten::binary_cross_entropy", "aten::soft_margin_loss",
    # ortmod's rules: torch's decompositions divide by beta 0 (smooth_l1_loss: NaN gradients) or
    # give a gradient at z == 0 where eager's margin kernels test z > 0
    "aten::smooth_l1_loss", "aten::multi_margin_loss", "aten::multilabel_margin_loss", "ortmod::multi_margin_loss",
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
})
