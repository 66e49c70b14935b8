"""What a torch.export capture assumed about the call's sizes (``ShapeGuard``), checked per call:
specialised dims, derived dims, range constraints and the runtime assertions the export left in the
graph. A call it rejects is exported again, never run on a stale graph."""

import torch

from . import compat

pass
from .errors import ExportError
from .fx_passes import _meta_val


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
# the value the export assumed (tracing.Guard, the TorchScript path's guards), and a call that
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


def _free_unbacked(value):
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return {str(s) for s in value.node.expr.free_symbols if str(s).startswith("u")}
    return set()
