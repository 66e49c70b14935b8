"""Graph surgery on torch.export's FX programs, before and after decomposition: stop-gradients
carried as the opaque ``ortmod::stop_gradient`` op, ``no_grad`` regions and ``detach`` made
explicit, splits, unbinds and views made copies the translator and the engine take, and the
``CastLike`` lowering of the ONNX result."""
import itertools
import operator
import sys

import torch

from . import compat

pass
from .flatten import _FlatWrapper
from .errors import UnsupportedModelError

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


def _state_name(target):
    return target[len(_FlatWrapper.PREFIX):] if target.startswith(_FlatWrapper.PREFIX) else target


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
