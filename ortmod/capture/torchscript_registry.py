"""The TorchScript path's rule registry: ``semantic_export`` registers ortmod's symbolics (the
``rules`` package) over torch's while ortmod exports, wraps the exporter's graph passes (the traced
dtypes kept, clamps by a number noted) and puts torch's own rules back after."""
import contextlib
import threading

import torch

from . import compat
from .compat import JitTensorType

pass
from .onnx_util import _exporter_modules, _torch_symbolic
from .tracing import StopGradientMode
from .rules.stock_fixes import _movedim_symbolic, _squeeze_symbolic
from .rules.symbolics import _argsort_symbolic, _avg_pool_symbolic, _cdist_symbolic, _clamp_overloads_noted, _clamp_symbolic, _cosine_embedding_loss_symbolic, _dist_symbolic, _embedding_renorm_symbolic, _extremum_symbolic, _frobenius_norm_symbolic, _index_add_symbolic, _index_put_symbolic, _kl_div_symbolic, _linalg_norm_symbolic, _matrix_norm_symbolic, _norm_symbolic, _pad_symbolic, _pairwise_distance_symbolic, _sort_symbolic, _triplet_margin_loss_symbolic, _vector_norm_symbolic


# ---------------------------------------------------------------------------------------------
# float64 0-d values keep their dtype

# ONNX ops whose input dtypes torch's exporter makes agree by implicit promotion.
_PROMOTING_OPS = frozenset({"onnx::Add", "onnx::Sub", "onnx::Mul", "onnx::Div", "onnx::Pow", "onnx::Mod",
                            "onnx::Gemm", "onnx::Where"})
_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _keeping_traced_dtypes(run_symbolic):
    """Wraps the exporter's per-node conversion (C++ calls it for every aten node).

    torch's ONNX type promotion takes every 0-d float64 tensor for a wrapped Python number of
    the default dtype: ``loss + 1.0``, ``loss_a + loss_b`` on a float64 model come out as
    Cast-to-float32 and a float32 Add, so a float64 model's scalar loss was returned (and
    differentiated) in float32. The trace knows the dtype eager computed (the aten node's
    output); where the converted node is one of the promoting ops and says another float
    dtype, the traced one is put back. The promotion pass reads a node's output dtype first,
    so it then casts the node's inputs to it (a Python constant becomes a float64 constant)."""
    def run(graph, block, node, inputs, env, values_in_env, new_nodes, *rest, **kw):
        outputs = run_symbolic(graph, block, node, inputs, env, values_in_env, new_nodes, *rest, **kw)
        try:
            results = outputs if isinstance(outputs, (list, tuple)) else [outputs]
            for old, new in zip(node.outputs(), results):
                if new is None or new.node().kind() not in _PROMOTING_OPS:
                    continue
                told, tnew = old.type(), new.type()
                if not isinstance(told, JitTensorType) or not isinstance(tnew, JitTensorType):
                    continue
                want, got = told.dtype(), tnew.dtype()
                if want in _FLOAT_DTYPES and got in _FLOAT_DTYPES and want != got:
                    new.setType(tnew.with_dtype(want))
        except (RuntimeError, TypeError, AttributeError):
            pass   # a type that carries no dtype: nothing to restore
        return outputs
    run.__wrapped__ = run_symbolic
    return run


_export_lock = threading.Lock()


def _scalars_typed_as(dtype, optimize_graph):
    """Wraps the exporter's conversion of the traced graph to ONNX (not the trace itself).

    Its type inference and scalar type analysis take every 0-d floating value -- a float64
    model's 0-d input or loss -- for a Python number of torch's default dtype, and cast the op
    to float32: a float64 MSELoss on 0-d inputs came back float32. While the graph converts,
    the default dtype is the model's own floating dtype (``semantic_export``'s
    ``scalar_dtype``): in a model computing in one dtype, a Python number takes that dtype in
    eager too."""
    def run(*args, **kw):
        before = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            return optimize_graph(*args, **kw)
        finally:
            torch.set_default_dtype(before)
    run.__wrapped__ = optimize_graph
    return run


@contextlib.contextmanager
def _quiet_onnx_logging(verbose):
    enabled = compat.onnx_log_enabled()
    compat.set_onnx_log_enabled(enabled or bool(verbose))
    try:
        yield
    finally:
        compat.set_onnx_log_enabled(enabled)


@contextlib.contextmanager
def semantic_export(opset, stop_gradients=True, scalar_dtype=None):
    """Register ortmod's argument-keeping symbolics and (when the graph will be differentiated)
    the stop-gradient mode for one torch.onnx.export call; undo both afterwards.

    ``scalar_dtype``: the one floating dtype the model computes in, when it is not torch's
    default (a float64 model): untyped 0-d values take it (``_scalars_typed_as``)."""
    with _export_lock:   # also around reading torch's rules: another export may have ortmod's in
        registration = _exporter_modules()
        symbolics = {
            "aten::embedding_renorm": _embedding_renorm_symbolic,
            "aten::embedding_renorm_": _embedding_renorm_symbolic,
            "aten::movedim": _movedim_symbolic,
            "aten::kl_div": _kl_div_symbolic,
            "aten::index_add": _index_add_symbolic,
            "aten::pad": _pad_symbolic,
            "aten::sort": _sort_symbolic,
            "aten::argsort": _argsort_symbolic,
            "aten::pairwise_distance": _pairwise_distance_symbolic,
            "aten::linalg_vector_norm": _vector_norm_symbolic,
            "aten::norm": _norm_symbolic,
            "aten::frobenius_norm": _frobenius_norm_symbolic,
            "aten::triplet_margin_loss": _triplet_margin_loss_symbolic,
            "aten::cdist": _cdist_symbolic,
            "aten::cosine_embedding_loss": _cosine_embedding_loss_symbolic,
            "aten::dist": _dist_symbolic,
        }
        own_clamps = set(compat.clamp_semantics()) != {compat.CLAMP_INCLUSIVE}
        if own_clamps:
            symbolics.update({f"aten::{w}": _clamp_symbolic(w) for w in ("clamp", "clamp_min", "clamp_max")})
        matrix_norm = _torch_symbolic(registration, "aten::linalg_matrix_norm", opset)
        if matrix_norm is not None:
            symbolics["aten::linalg_matrix_norm"] = _matrix_norm_symbolic(matrix_norm)
            symbolics["aten::linalg_norm"] = _linalg_norm_symbolic(matrix_norm)
        for name, arg_op in (("aten::max", "ArgMax"), ("aten::min", "ArgMin")):
            if _torch_symbolic(registration, name, opset) is not None:
                symbolics[name] = _extremum_symbolic(arg_op, _torch_symbolic(registration, name, opset))
        # torch registers its opset-11 index_put (the one that scatters) when that module is
        # imported, which its exporter does lazily: before it, the registry holds opset 9's stub
        from .compat import ts_opset11
        ts_opset11.module()
        if _torch_symbolic(registration, "aten::index_put", opset) is not None:
            symbolics["aten::index_put"] = _index_put_symbolic(_torch_symbolic(registration, "aten::index_put", opset))
        if _torch_symbolic(registration, "aten::squeeze", opset) is not None:
            symbolics["aten::squeeze"] = _squeeze_symbolic(_torch_symbolic(registration, "aten::squeeze", opset))
        for rank in (1, 2, 3):
            name = f"aten::avg_pool{rank}d"
            if _torch_symbolic(registration, name, opset) is not None:
                symbolics[name] = _avg_pool_symbolic(rank, _torch_symbolic(registration, name, opset))
        # rules kept in their own modules: losses, and the nn layers (pools, norms) whose
        # stock rules are missing or narrower than eager
        from .rules import ctc as ctc_rules, losses as loss_rules, nearest as nearest_rules, nn as nn_rules, \
            rnn as rnn_rules, strided as strided_rules
        for rules in (loss_rules, nn_rules, nearest_rules, ctc_rules, rnn_rules, strided_rules):
            symbolics.update(rules.symbolics(registration, opset))
        # the rules written once for both paths (rules/emitter.py)
        from .rules import aten as aten_rules
        symbolics.update(aten_rules.torchscript_symbolics())
        for name, fn in symbolics.items():
            torch.onnx.register_custom_op_symbolic(name, fn, opset)
        ts = compat.ts_utils
        retype = scalar_dtype is not None and scalar_dtype != torch.get_default_dtype()
        try:
            # torch 2.x tests the function _jit_is_onnx_log_enabled, not its value, so every export
            # turned the exporter's log on: a failed export printed its whole graph to stderr
            with ts.patched("run_symbolic_function", _keeping_traced_dtypes(ts.run_symbolic_function)), \
                    ts.patched("setup_onnx_logging", _quiet_onnx_logging), \
                    ts.patched("optimize_graph", _clamp_overloads_noted(
                        _scalars_typed_as(scalar_dtype, ts.optimize_graph) if retype else ts.optimize_graph,
                        own_clamps)), \
                    (StopGradientMode() if stop_gradients else contextlib.nullcontext()):
                yield
        finally:
            for name in symbolics:
                torch.onnx.unregister_custom_op_symbolic(name, opset)
