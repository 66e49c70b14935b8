"""What both capture paths' rules build ONNX with: the opset, typed constants, a refusal by name,
torch's own rule for an op, a symbolic size made a plain number.

A leaf below the rules: it imports nothing of ortmod but compat and errors. The names keep the
leading underscore they had in ortmod._semantics so the rules read as before; they are this
package's shared helpers, not private to this file."""
import torch

from .compat import JitTensorType
from .errors import UnsupportedModelError

ONNX_OPSET = 20     # both paths export opset 20


# ---------------------------------------------------------------------------------------------
# symbolics that keep arguments torch's drop

_SCALAR_DTYPES = {"Float": torch.float32, "Double": torch.float64, "Half": torch.float16,
                  "BFloat16": torch.bfloat16}


def _dtype_of(value, default=torch.float32):
    t = value.type()
    if isinstance(t, JitTensorType):
        return _SCALAR_DTYPES.get(t.scalarType(), default)
    return default


def _const(g, v, dtype):
    return g.op("Constant", value_t=torch.tensor(v, dtype=dtype))


def _refuse(what, why):
    raise UnsupportedModelError(f"{what}: {why}")


def _input_rank(x, what):
    from .compat import symbolic_helper as sh
    rank = sh.get_tensor_rank(x)
    if rank is None or rank < 2:
        _refuse(what, "ortmod needs the input's rank (at least 2) at export")
    return rank


# ---- p-norms, pairwise_distance, cosine_similarity ------------------------------------------

def _stop_gradient(g, x):
    out = g.op("ortmod::StopGradient", x)
    out.setType(x.type())
    return out


def _float_const_arg(value, what, name):
    from .compat import symbolic_helper as sh
    v = sh.maybe_get_const(value, "f")
    if sh.is_value(v) or not isinstance(v, (int, float)):
        _refuse(what, f"ortmod keeps {name} only as a constant")
    return float(v)


def _input_rank_or_none(x):
    from .compat import symbolic_helper as sh
    return sh.get_tensor_rank(x)


def _onnx_dtype(dtype):
    from .compat import ts_type_utils as _type_utils
    return _type_utils.JitScalarType.from_dtype(dtype).onnx_type()


_LOSS_REDUCTIONS = {0: None, 1: "ReduceMean", 2: "ReduceSum"}


def _loss_reduction(g, out, reduction, what):
    from .compat import symbolic_helper as sh
    r = sh.maybe_get_const(reduction, "i")
    if r not in _LOSS_REDUCTIONS:
        _refuse(what, f"reduction {r!r} is not one of none, mean, sum")
    return out if r == 0 else g.op(_LOSS_REDUCTIONS[r], out, keepdims_i=0)


# ---------------------------------------------------------------------------------------------
# the export context: our symbolics and the stop-gradient pass, only while ortmod exports

def _exporter_modules():
    from .compat import ts_registration
    return ts_registration


_TORCH_SYMBOLICS = {}


def _torch_symbolic(registration, name, opset):
    """torch's own rule for ``name``, as it was before ortmod registered one over it (the
    registry then answers with ortmod's)."""
    if name not in _TORCH_SYMBOLICS:
        group = registration.registry.get_function_group(name)
        _TORCH_SYMBOLICS[name] = None if group is None else group.get(opset)
    return _TORCH_SYMBOLICS[name]


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
