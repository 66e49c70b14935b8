"""One rule for both capture paths (issue 36): a rule is written once, against the small emitter
interface below, and ``aten_rule`` registers it on the TorchScript path (a symbolic bound to
``g.op``) and on the torch.export path (a translation bound to onnxscript's opset), with its
argument checks and its review mark.

A rule is ``fn(e, <the aten schema's arguments>)``, each argument annotated: ``Tensor`` or
``Optional[Tensor]`` (a graph value), else ``int``, ``float``, ``bool``, ``str``, ``Sequence[int]``
(a number the rule reads in Python). The TorchScript path hands constants as graph values and the
export path as Python values: the binding below makes both Python values before the rule sees
them, and refuses by name one that is not a constant. Parameter names are the aten schema's (the
export path passes keyword arguments by them).

``e`` is the emitter:

- ``e.op(name, *inputs, outputs=1, **attrs)``: one ONNX node; attributes spelled as ONNX names them
  (``axis=1``: the TorchScript binding adds the type suffix ``axis_i``); a ``torch.dtype`` value
  (``to=torch.float32``) is its ONNX type;
- ``e.const(value, dtype)``: a constant of a ``torch.dtype``; ``e.ints(values)``: a 1-d int64 one;
- ``e.dtype(x)`` (a ``torch.dtype``, None when the graph does not know it), ``e.rank(x)``;
- ``e.stop_gradient(x)``: the engine's StopGradient (identity forward, no gradient).

Checks: functions of the arguments (a namespace: tensors as ``TensorInfo(dtype, rank)``, the rest
as Python values) returning None or the reason the rule refuses; the TorchScript path runs them
as it converts the node, the torch.export path in its audit (``audit._CHECKS``), before
translation, naming the user's line. The review mark (``why``) replaces the rule's line in
``audit.REVIEWED``.

A leaf under the rules: it imports nothing of ortmod but compat, errors and onnx_util, and nothing
of onnxscript until a translation is built."""
import collections.abc
import inspect
import typing
from collections import namedtuple
from types import SimpleNamespace

import torch

from ..errors import UnsupportedModelError
from ..onnx_util import _stop_gradient


class Tensor:
    """Annotation of a rule's tensor argument (an ONNX input on both paths)."""


TensorInfo = namedtuple("TensorInfo", "dtype rank")   # what a check sees of a tensor

# torch dtype -> ONNX TensorProto type (the numbers both paths' ONNX uses)
_ONNX_TYPES = {torch.float32: 1, torch.uint8: 2, torch.int8: 3, torch.int16: 5, torch.int32: 6, torch.int64: 7,
               torch.bool: 9, torch.float16: 10, torch.float64: 11, torch.bfloat16: 16}
_TORCH_TYPES = {v: k for k, v in _ONNX_TYPES.items()}


def onnx_type(dtype):
    if dtype not in _ONNX_TYPES:
        raise UnsupportedModelError(f"ortmod's rules take no {dtype} constants")
    return _ONNX_TYPES[dtype]


def refuse(what, why):
    raise UnsupportedModelError(f"{what}: {why}")


# ---------------------------------------------------------------------------------------------
# the two emitters

class TorchScriptEmitter:
    """The emitter bound to a TorchScript graph (``g.op``)."""

    def __init__(self, g):
        self.g = g

    def op(self, name, *inputs, outputs=1, **attrs):
        spelled = dict(_ts_attr(k, v) for k, v in attrs.items())
        if outputs != 1:
            spelled["outputs"] = outputs
        out = self.g.op(name, *inputs, **spelled)
        if "::" in name and outputs == 1:
            # an ortmod op: the exporter's shape inference does not know it; its output is typed
            # as its first input (the engine's ops that rules emit keep it)
            out.setType(inputs[0].type())
        return out

    def const(self, value, dtype):
        return self.g.op("Constant", value_t=torch.tensor(value, dtype=dtype))

    def ints(self, values):
        return self.const(list(values), torch.int64)

    def dtype(self, x):
        from ..compat import ts_type_utils
        try:
            return ts_type_utils.JitScalarType.from_value(x).dtype()
        except Exception:       # a value the graph carries no dtype for
            return None

    def rank(self, x):
        from ..compat import symbolic_helper as sh
        return sh.get_tensor_rank(x)

    def stop_gradient(self, x):
        return _stop_gradient(self.g, x)


def _ts_attr(key, value):
    """(key with TorchScript's type suffix, value as g.op takes it)."""
    if isinstance(value, torch.dtype):
        return f"{key}_i", onnx_type(value)
    if isinstance(value, bool):
        return f"{key}_i", int(value)
    if isinstance(value, int):
        return f"{key}_i", value
    if isinstance(value, float):
        return f"{key}_f", value
    if isinstance(value, str):
        return f"{key}_s", value
    if isinstance(value, torch.Tensor):
        return f"{key}_t", value
    if isinstance(value, (list, tuple)):
        if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return f"{key}_i", list(value)
        return f"{key}_f", [float(v) for v in value]
    raise TypeError(f"attribute {key}={value!r}: no ONNX attribute type for it")


class OnnxscriptEmitter:
    """The emitter bound to onnxscript's opset, traced by torch's ONNX translator."""

    def __init__(self, op, ir, stop_gradient):
        self._op, self._ir, self._stop = op, ir, stop_gradient

    def op(self, name, *inputs, outputs=1, **attrs):
        # onnxscript reads the output count from the op's schema
        spelled = {k: self._attr(v) for k, v in attrs.items()}
        if "::" in name:
            return self._domain_op(name, inputs, outputs, spelled)
        return getattr(self._op, name)(*inputs, **spelled)

    def _domain_op(self, name, inputs, outputs, attrs):
        """An ortmod op (no onnxscript schema): the node appended to the translator's trace, its
        output typed as its first input, as the TorchScript binding types it."""
        from onnxscript import evaluator
        from ..compat import onnx_tensors
        if outputs != 1:
            raise NotImplementedError(f"{name}: ortmod ops of several outputs are not bound on this path")
        domain, op_type = name.split("::", 1)
        tracer = evaluator.default()
        out = onnx_tensors.SymbolicTensor(tracer.opset)
        out.dtype = inputs[0].dtype
        out.shape = None if inputs[0].shape is None else self._ir.Shape(inputs[0].shape)
        node = self._ir.Node(domain, op_type, list(inputs), attributes=[
            self._ir.convenience.convert_attribute(k, v) for k, v in attrs.items()], outputs=[out], version=1)
        tracer.nodes.append(node)
        return out

    def _attr(self, value):
        if isinstance(value, torch.dtype):
            return self._ir.DataType(onnx_type(value))
        if isinstance(value, bool):
            return int(value)
        return value

    def const(self, value, dtype):
        return self._op.Constant(value=self._ir.tensor(value, dtype=self._ir.DataType(onnx_type(dtype))))

    def ints(self, values):
        return self.const(list(values), torch.int64)

    def dtype(self, x):
        return None if x.dtype is None else _TORCH_TYPES.get(int(x.dtype))

    def rank(self, x):
        return None if x.shape is None else len(x.shape)

    def stop_gradient(self, x):
        return self._stop(x)


# ---------------------------------------------------------------------------------------------
# the rules and their bindings

_KINDS = {int: "i", float: "f", bool: "b", str: "s"}


def _kind(annotation):
    """(kind, optional) of an argument's annotation: kind is "tensor", "is" (Sequence[int]) or
    symbolic_helper's code of a scalar ("i", "f", "b", "s")."""
    optional = False
    if typing.get_origin(annotation) is typing.Union:
        rest = [a for a in typing.get_args(annotation) if a is not type(None)]
        optional, annotation = True, rest[0]
    if annotation is Tensor:
        return "tensor", optional
    if annotation in _KINDS:
        return _KINDS[annotation], optional
    if typing.get_origin(annotation) in (list, tuple, collections.abc.Sequence) \
            and typing.get_args(annotation)[:1] == (int,):
        return "is", optional
    raise TypeError(f"a rule's argument annotated {annotation!r}: use Tensor, Optional[Tensor], int, float, bool, "
                    "str or Sequence[int]")


class Rule:
    def __init__(self, fn, targets, checks, why):
        self.fn, self.targets, self.checks, self.why = fn, tuple(targets), tuple(checks), why
        self.what = fn.__name__
        params = list(inspect.signature(fn).parameters.values())[1:]      # after the emitter
        hints = typing.get_type_hints(fn)
        self.params = [(p.name, *_kind(hints[p.name]), p.default) for p in params]

    # ---- checks ----

    def refusal(self, args, infos):
        """The first check's reason to refuse, or None. ``infos``: {tensor argument: TensorInfo}."""
        view = SimpleNamespace(**{**args, **infos})
        for check in self.checks:
            why = check(view)
            if why:
                return why
        return None

    # ---- TorchScript ----

    def torchscript_symbolic(self):
        def symbolic(g, *values):
            e = TorchScriptEmitter(g)
            args = self._from_values(values)
            infos = {name: TensorInfo(e.dtype(v), e.rank(v)) for name, kind, _, _ in self.params
                     if kind == "tensor" and args[name] is not None for v in [args[name]]}
            why = self.refusal(args, infos)
            if why:
                refuse(self.what, why)
            return self.fn(e, **args)
        symbolic.__name__ = f"{self.what}_symbolic"
        return symbolic

    def _from_values(self, values):
        from ..compat import symbolic_helper as sh
        self._no_more_than_the_schema(values)
        args = {}
        for k, (name, kind, optional, default) in enumerate(self.params):
            if k >= len(values):
                if default is inspect.Parameter.empty:
                    refuse(self.what, f"ortmod's rule was given no {name}")
                args[name] = default
                continue
            v = values[k]
            if v is None or sh.is_none(v):
                if not optional and kind != "tensor":
                    refuse(self.what, f"ortmod's rule needs {name}")
                args[name] = None
            elif kind == "tensor":
                args[name] = v
            else:
                const = sh.maybe_get_const(v, kind)
                if sh.is_value(const):
                    refuse(self.what, f"ortmod keeps {name} only as a constant")
                args[name] = _python(kind, const)
        return args

    def _no_more_than_the_schema(self, values):
        # an argument the rule does not know (another torch's schema) would be dropped silently
        if len(values) > len(self.params):
            refuse(self.what, f"{len(values)} arguments where ortmod's rule knows {len(self.params)} "
                   f"({', '.join(p[0] for p in self.params)})")

    # ---- torch.export ----

    def export_translation(self, op, ir, stop_gradient):
        from onnxscript.function_libs.torch_lib.tensor_typing import TTensor
        e = OnnxscriptEmitter(op, ir, stop_gradient)
        names = [name for name, _, _, _ in self.params]

        def translation(*args, **kwargs):
            self._no_more_than_the_schema(args)
            unknown = set(kwargs) - set(names)
            if unknown:
                refuse(self.what, f"arguments {sorted(unknown)} that ortmod's rule does not know")
            given = dict(zip(names, args), **kwargs)
            values = {}
            for name, kind, _, default in self.params:
                v = given.get(name, default)
                values[name] = v if kind == "tensor" or v is None else _python(kind, v)
            return self.fn(e, **values)

        annotations, params = {}, []
        for name, kind, optional, default in self.params:
            ann = TTensor if kind == "tensor" else {"i": int, "f": float, "b": bool, "s": str,
                                                   "is": typing.Sequence[int]}[kind]
            annotations[name] = typing.Optional[ann] if optional else ann
            params.append(inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default))
        annotations["return"] = TTensor
        translation.__signature__ = inspect.Signature(params)
        translation.__annotations__ = annotations
        translation.__name__ = translation.__qualname__ = self.what
        return translation

    def audit_check(self, node):
        """The checks on an fx node of one of the rule's targets (torch.export's audit)."""
        if node.target.name() not in self.targets:
            return None
        given = dict(zip([p[0] for p in self.params], node.args), **node.kwargs)
        args, infos = {}, {}
        for name, kind, _, default in self.params:
            v = given.get(name, default)
            if kind == "tensor":
                val = v.meta.get("val") if isinstance(v, torch.fx.Node) else None
                args[name] = v
                if v is not None:
                    ok = isinstance(val, torch.Tensor)
                    infos[name] = TensorInfo(val.dtype if ok else None, val.dim() if ok else None)
            else:
                if isinstance(v, torch.fx.Node):
                    v = v.meta.get("val")
                args[name] = v
        return self.refusal(args, infos)


def _python(kind, v):
    if kind == "f" and isinstance(v, (int, float)):
        return float(v)
    if kind == "i" and isinstance(v, (int, bool)):
        return int(v)
    if kind == "b":
        return bool(v)
    if kind == "is":
        return [int(x) for x in v]
    return v


RULES = []


def aten_rule(*targets, checks=(), why):
    """Register the decorated function as ortmod's rule for ``targets`` (aten names as the
    torch.export audit names them: ``"aten::smooth_l1_loss"``, an overload ``"aten::sort.stable"``;
    ortmod's own ops, ``"ortmod::<name>"``, are the export path's), on both paths.

    ``checks``: argument checks (None or a reason to refuse); ``why``: the review, one line."""
    def register(fn):
        # a family module imported again (importlib.reload) replaces its rules, never doubles them
        RULES[:] = [r for r in RULES if (r.fn.__module__, r.what) != (fn.__module__, fn.__name__)]
        RULES.append(Rule(fn, targets, checks, why))
        return fn
    return register


def torchscript_symbolics():
    """{aten name: symbolic} of every rule (overloads share one TorchScript name)."""
    out = {}
    for rule in RULES:
        for target in rule.targets:
            if target.startswith("aten::"):
                out[target.split(".", 1)[0]] = rule.torchscript_symbolic()
    return out


def _overload(target):
    ns, rest = target.split("::", 1)
    name, _, overload = rest.partition(".")
    return getattr(getattr(getattr(torch.ops, ns), name), overload or "default")


def export_translations(op, ir, stop_gradient):
    """{torch op overload: translation} of every rule."""
    out = {}
    for rule in RULES:
        fn = rule.export_translation(op, ir, stop_gradient)
        for target in rule.targets:
            out[_overload(target)] = fn
    return out


def reviewed():
    """The aten names the rules review (each rule's ``why``)."""
    return frozenset(t for rule in RULES for t in rule.targets)


def audit_checks():
    """{base name: check(node)} for the audit's ``_CHECKS``."""
    out = {}
    for rule in RULES:
        if not rule.checks:
            continue
        for target in rule.targets:
            base = target.split(".", 1)[0]
            assert base not in out, f"two rules check {base}"
            out[base] = rule.audit_check
    return out
