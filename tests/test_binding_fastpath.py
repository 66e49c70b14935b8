"""The short per-step path (ortmod/_function.py, ORTModule._ortmod_call) keeps what the longer one
did: torch.autograd.Function's own behaviour where its Python wrapper is skipped, and every guard
that the per-call key and the per-engine facts learned on the first call stand for."""
import warnings

import pytest
import torch
import torch.nn as nn

from ortmod import ORTModule


def _exports(ort):
    return ort._ortmod_export_count


def test_double_backward_through_the_engine_is_an_error():
    # create_graph=True runs backward with grad mode on: the gradients must refuse a second
    # differentiation (once_differentiable) rather than act as constants (a silent zero)
    torch.manual_seed(0)
    ort = ORTModule(nn.Linear(4, 4))
    x = torch.randn(2, 4, requires_grad=True)
    y = (ort(x) * ort(x)).sum()
    g, = torch.autograd.grad(y, x, create_graph=True)
    assert g.requires_grad
    with pytest.raises(RuntimeError, match="differentiate twice"):
        g.sum().backward()


def test_first_order_gradients_match_eager_with_create_graph_and_without():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
    ort = ORTModule(net)
    x = torch.randn(5, 4, requires_grad=True)
    want, = torch.autograd.grad(net(x).square().sum(), x)
    for create_graph in (False, True):
        got, = torch.autograd.grad(ort(x).square().sum(), x, create_graph=create_graph)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_functorch_transform_is_refused_as_torch_refuses_it():
    ort = ORTModule(nn.Linear(4, 4))
    ort(torch.randn(2, 4))
    with pytest.raises(RuntimeError, match="functorch transforms"):
        torch.func.grad(lambda t: ort(t).sum())(torch.randn(2, 4))


def test_a_dead_functorch_wrapper_is_taken_as_its_tensor():
    torch.manual_seed(0)
    lin = nn.Linear(4, 4)
    ref = nn.Linear(4, 4)
    ref.load_state_dict(lin.state_dict())
    ort = ORTModule(lin)
    ort(torch.randn(2, 4))                      # exported and built: the wrapper meets the engine
    kept = []

    def f(t):
        kept.append(t)
        return t.sum()

    torch.func.grad(f)(torch.randn(2, 4))      # kept[0]: a wrapper whose transform has ended
    out = ort(kept[0])
    out.sum().backward()
    plain = torch._C._functorch.unwrap_if_dead(kept[0])
    ref(plain).sum().backward()
    torch.testing.assert_close(out, ref(plain))
    torch.testing.assert_close(lin.weight.grad, ref.weight.grad)


class TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 3)
        self.b = nn.Linear(4, 3)

    def forward(self, x):
        return self.a(x), self.b(x), self.a(x).argmax(-1)


def test_per_pattern_gradients_and_non_differentiable_outputs_on_every_call():
    # which inputs get a gradient depends on which outputs the loss uses: cached per pattern,
    # so each pattern must still give its own None / tensor split, call after call
    torch.manual_seed(0)
    net = TwoHeads()
    ort = ORTModule(net)
    x = torch.randn(5, 4)
    for _ in range(2):
        for use in ("a", "b", "ab"):
            for p in net.parameters():
                p.grad = None
            ya, yb, idx = ort(x)
            assert not idx.requires_grad and idx.dtype == torch.int64
            loss = (ya.sum() if "a" in use else 0) + (yb.sum() if "b" in use else 0)
            loss.backward()
            assert (net.a.weight.grad is not None) == ("a" in use)
            assert (net.b.weight.grad is not None) == ("b" in use)


def test_guards_still_fire_on_the_short_path():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5))
    ort = ORTModule(net)
    x = torch.randn(3, 4)
    ort(x).sum().backward()
    n = _exports(ort)
    ort(x).sum().backward()
    assert _exports(ort) == n                           # steady state: no export
    ort(x.double().float()[:, :2].repeat(1, 2))         # same schema, another tensor: no export
    assert _exports(ort) == n
    ort.eval()
    out = ort(x)
    assert _exports(ort) == n + 1                       # train/eval is in the key
    torch.testing.assert_close(out, net(x))             # eval: dropout off
    ort.train()
    with torch.no_grad():
        assert not ort(x).requires_grad                 # grad mode is in the key
    assert ort(x).requires_grad
    ort(x.double().float().unsqueeze(0))                # a new rank: export again
    assert _exports(ort) > n + 1
    m = _exports(ort)
    net[0].weight.requires_grad_(False)                 # requires_grad of a parameter: new engine
    net.zero_grad(set_to_none=True)
    ort(x).sum().backward()
    assert net[0].weight.grad is None and net[0].bias.grad is not None
    net.double()                                        # dtypes changed in place: export again
    out = ort(x.double())
    assert out.dtype == torch.float64 and _exports(ort) > m
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        net.register_buffer("extra", torch.zeros(1))    # a registration: re-checked
    ort(x.double())


# --------------------------------------------------------------------------- the steady state
#
# A call with the last call's key takes ORTModule's recorded path (ortmod/_entry.py, FastRecord): every item of
# the key is re-checked there, and each change below must reach the slow path and do what it
# does, after the record was made (two identical calls first).

def _steady(ort, *args, **kwargs):
    for _ in range(2):
        ort(*args, **kwargs)
    assert ort._ortmod_fast is not None
    return _exports(ort), ort._ortmod_engine_count


class Affine(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x, scale=1.0, shift=None, flag=False):
        y = self.lin(x) * scale
        if shift is not None:
            y = y + shift
        return -y if flag else y


def _twin(module):
    torch.manual_seed(0)
    ref = module()
    ort_net = module()
    ort_net.load_state_dict(ref.state_dict())
    return ref, ORTModule(ort_net)


def test_steady_state_matches_eager_bit_for_bit_and_the_slow_path():
    ref, ort = _twin(Affine)
    x = torch.randn(3, 4)
    slow = ort(x)                                   # the export's call: the slow path
    fast = [ort(x) for _ in range(3)]               # the record's
    for y in fast:
        assert torch.equal(y, slow)
    torch.testing.assert_close(slow, ref(x))


X, S = torch.randn(3, 4), torch.randn(4)
KEY_CHANGES = {   # name: (steady call, next call, how many exports the next call adds)
    "scale": (((X, 2.0, None), {}), ((X, 3.0, None), {}), 1),
    "scale_type": (((X, 2.0, None), {}), ((X, 2, None), {}), 1),
    "none_to_tensor": (((X, 2.0, None), {}), ((X, 2.0, S), {}), 1),
    "tensor_to_number": (((X, 2.0, S), {}), ((X, 2.0, 0.5), {}), 1),
    "flag": (((X, 2.0, None), {}), ((X, 2.0, None, True), {}), 1),
    "keyword": (((X, 2.0, None), {}), ((X,), {"scale": 2.0, "shift": None}), None),
    "keyword_name": (((X,), {"scale": 2.0}), ((X,), {"shift": 2.0}), 1),
    "keyword_order": (((X,), {"scale": 2.0, "shift": S}), ((X,), {"shift": S, "scale": 2.0}), None),
    "arity": (((X, 2.0, None), {}), ((X, 2.0), {}), None),
    "rank": (((X, 2.0, None), {}), ((X[None], 2.0, None), {}), 1),
    "requires_grad": (((X, 2.0, None), {}), ((X.clone().requires_grad_(), 2.0, None), {}), 0),
}


@pytest.mark.parametrize("change", sorted(KEY_CHANGES))
def test_every_argument_of_the_key_leaves_the_steady_state(change):
    ref, ort = _twin(Affine)
    (args0, kwargs0), (args, kwargs), added = KEY_CHANGES[change]
    n, e = _steady(ort, *args0, **kwargs0)
    out = ort(*args, **kwargs)
    torch.testing.assert_close(out, ref(*args, **kwargs))
    if added is not None:          # None: another structure of the same values, maybe the same graph
        assert _exports(ort) == n + added, change
    assert ort._ortmod_engine_count == e + 1 or added is None, change
    if change == "requires_grad":
        out.sum().backward()
        assert args[0].grad is not None
    _steady(ort, *args, **kwargs)           # and a new steady state
    assert torch.equal(ort(*args, **kwargs), out)


class Lookup(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4)

    def forward(self, idx):
        return self.emb(idx)


def test_an_input_dtype_leaves_the_steady_state():
    ref, ort = _twin(Lookup)
    idx = torch.tensor([[1, 2, 3]])
    n, _ = _steady(ort, idx)
    for dtype in (torch.int32, torch.int64):
        torch.testing.assert_close(ort(idx.to(dtype)), ref(idx.to(dtype)))
    assert _exports(ort) == n + 1


def test_parameters_changed_in_place_leave_the_steady_state():
    ref, ort = _twin(Affine)
    x = torch.randn(3, 4)
    n, e = _steady(ort, x)
    ort.module.lin.bias.requires_grad_(False)       # requires_grad of a parameter: a new engine
    ort.module.zero_grad(set_to_none=True)
    ort(x).sum().backward()
    assert ort._ortmod_engine_count == e + 1 and _exports(ort) == n
    assert ort.module.lin.bias.grad is None and ort.module.lin.weight.grad is not None
    ref, ort = _twin(Offset)
    n, e = _steady(ort, x)
    ort.module.offset.data = ort.module.offset.data.double()   # a dtype changed in place
    ref.offset.data = ref.offset.data.double()
    out = ort(x)
    assert out.dtype == torch.float64 and _exports(ort) == n + 1
    torch.testing.assert_close(out, ref(x))


class Offset(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("offset", torch.randn(4))

    def forward(self, x):
        return self.lin(x) + self.offset


def test_module_state_leaves_the_steady_state():
    ref, ort = _twin(Affine)
    x = torch.randn(3, 4)
    n, e = _steady(ort, x)
    ort.eval()                                      # train/eval
    ort(x)
    assert _exports(ort) == n + 1
    n, e = _steady(ort, x)
    with torch.no_grad():                           # grad mode
        assert not ort(x).requires_grad
    n, e = _steady(ort, x)
    ort.scale_hint = 2                              # an attribute set on the ORTModule: re-checked
    ort(x)
    assert ort._ortmod_fast is not None and _exports(ort) == n + 1
    n, e = _steady(ort, x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ort.module.lin.register_buffer("extra", torch.zeros(1))   # a registration inside: re-checked
    ort(x)
    assert _exports(ort) == n + 1
    n, e = _steady(ort, x)
    ort.module.lin.weight = nn.Parameter(torch.ones(4, 4))         # a new parameter object
    ref.lin.weight = nn.Parameter(torch.ones(4, 4))
    ref.lin.bias = ort.module.lin.bias
    torch.testing.assert_close(ort(x), ref(x))


def test_autocast_leaves_the_steady_state():
    _, ort = _twin(Affine)
    x = torch.randn(3, 4)
    n, _ = _steady(ort, x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ort(x)
        assert _exports(ort) == n + 1
        n, _ = _steady(ort, x)
    ort(x)
    assert _exports(ort) == n              # the plain export is still cached


def test_thread_count_follows_torch_in_the_steady_state():
    from ortmod import _C
    _, ort = _twin(Affine)
    x = torch.randn(3, 4)
    before = torch.get_num_threads()
    _steady(ort, x)
    try:
        torch.set_num_threads(1 if before != 1 else 2)
        ort(x)
        assert _C.get_num_threads() == torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
    ort(x)
    assert _C.get_num_threads() == before


class ItemBranch(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x) * 2 if x.sum() > 0 else self.lin(x) - 1


def test_value_guard_and_batchnorm_statistics_in_the_steady_state():
    ref, ort = _twin(ItemBranch)
    pos, neg = torch.ones(2, 4), -torch.ones(2, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        n, _ = _steady(ort, pos)
        out = ort(neg)                    # the frozen branch differs: exported again
    assert _exports(ort) == n + 1
    torch.testing.assert_close(out, ref(neg))
    torch.manual_seed(0)
    bn_ref = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    bn = ORTModule(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)))
    bn.module.load_state_dict(bn_ref.state_dict())
    for _ in range(4):
        x = torch.randn(5, 4)
        torch.testing.assert_close(bn(x), bn_ref(x))
    torch.testing.assert_close(bn.module[1].running_mean, bn_ref[1].running_mean)
    torch.testing.assert_close(bn.module[1].running_var, bn_ref[1].running_var)
    assert bn.module[1].num_batches_tracked.item() == 4


def test_the_steady_state_leaves_the_cache_order_as_the_slow_path_does():
    from ortmod import DebugOptions
    torch.manual_seed(0)
    ort = ORTModule(Affine(), debug_options=DebugOptions(max_cached_graphs=2))
    x = torch.randn(3, 4)
    for scale in (2.0, 2.0, 3.0, 3.0, 2.0, 2.0, 4.0):   # 3.0 is the least recently used at 4.0
        ort(x, scale)
    scales = sorted(k[0][0][1][1][2] for k in ort._ortmod_cache)
    assert scales == ["2.0", "4.0"]


def test_pickled_and_copied_modules_start_without_a_steady_state():
    import copy
    _, ort = _twin(Affine)
    x = torch.randn(3, 4)
    _steady(ort, x)
    clone = copy.deepcopy(ort)
    assert clone._ortmod_fast is None
    torch.testing.assert_close(clone(x), ort(x))


def test_parameters_that_deepspeed_partitions_later_leave_the_steady_state():
    # ZeRO-3's deepspeed.zero.Init marks parameters with ds_status: the slow path scans the state
    # again on every call while that marker is there without a ZeRO-3 state (here a bare marker,
    # not a partition, so the scan finds none and the call runs as before)
    _, ort = _twin(Affine)
    x = torch.randn(3, 4)
    _steady(ort, x)
    generation = ort._ortmod_generation
    next(ort.module.parameters()).ds_status = "marked"
    for i in range(2):
        ort(x)
        assert ort._ortmod_generation == generation + 1 + i


def test_the_binding_converts_tensors_itself_as_the_capsule_path_does():
    # Engine.forward/backward with to_capsule/from_capsule (what EngineFunction passes) against
    # the plain capsule calls on the same engine: the same bits, the same Nones, keep and lead
    from torch.utils.dlpack import to_dlpack
    torch.manual_seed(0)
    lin = nn.Linear(4, 3)
    ort = ORTModule(lin)
    x = torch.randn(2, 4)
    ort(x).sum().backward()
    entry = ort._ortmod_fast.entry
    engine, tensors = entry.engine, ort._ortmod_fast.inputs(ort.__dict__, (x,), {})
    caps, stash = engine.forward([to_dlpack(t) for t in tensors], True, None)
    plain = [torch.from_dlpack(c) for c in caps]
    outs, stash2 = engine.forward(tuple(tensors), True, None, to_dlpack, torch._C._from_dlpack)
    assert isinstance(outs, tuple) and all(torch.equal(a, b) for a, b in zip(outs, plain))
    g = torch.randn_like(plain[0])
    want = [None if c is None else torch.from_dlpack(c) for c in engine.backward(stash, [to_dlpack(g)], None)]
    keep = tuple(w is not None for w in want)
    got = engine.backward(stash2, (g,), None, to_dlpack, torch._C._from_dlpack, (False,) + keep[1:], 2)
    assert got[:3] == (None, None, None) and len(got) == 2 + len(want)
    for a, b in zip(got[3:], want[1:]):
        assert (a is None) == (b is None) and (a is None or torch.equal(a, b))
    _, stash3 = engine.forward(tuple(tensors), True, None, to_dlpack, torch._C._from_dlpack)
    with pytest.raises(TypeError, match="callable"):
        engine.backward(stash3, (g,), None, 3)
    with pytest.raises(ValueError, match="flags"):
        engine.backward(stash3, (g,), None, to_dlpack, torch._C._from_dlpack, (True,), 2)
    with pytest.raises(TypeError, match="from_capsule"):
        engine.backward(stash3, (g,), None, to_dlpack, None, keep, 2)
    assert engine.backward(stash3, (g,), None, to_dlpack, torch._C._from_dlpack, None, 0)[0] is None


def test_hooks_and_tracing_still_go_through_torch_call():
    # ORTModule.__call__ skips nn.Module's two call frames only where they would call forward
    _, ort = _twin(Affine)
    x = torch.randn(3, 4)
    _steady(ort, x)
    seen = []
    handle = ort.register_forward_hook(lambda m, a, out: seen.append("module"))
    ort(x)
    handle.remove()
    handle = torch.nn.modules.module.register_module_forward_pre_hook(lambda m, a: seen.append("global"))
    try:
        ort(x)
    finally:
        handle.remove()
    pre = ort.register_forward_pre_hook(lambda m, a: (a[0] * 2,))
    doubled = ort(x)
    pre.remove()
    ort(x)
    assert seen == ["module", "global"]
    torch.testing.assert_close(doubled, ort(x * 2))


def test_steady_state_checks_in_the_extension_miss_on_every_key_item():
    """_C.steady_inputs and _C.attrs_are, the C loops of the steady state: each item of a
    recorded key that changes (type, dtype, rank, requires_grad, device) is a miss (None), equal
    ones give the engine's inputs; malformed arguments are errors, not garbage."""
    from ortmod import _C
    x = torch.randn(2, 3)
    keys = ((0, torch.float32, 2, False, True, x.device),)
    template = ["w", None]

    def run(v, types=(torch.Tensor,), k=keys):
        return _C.steady_inputs((v,), types, k, template, ((1, 0),), lambda t: t)

    got = run(x)
    assert got[0] == "w" and got[1] is x and template == ["w", None]     # a copy of the template
    assert run(x.double()) is None
    assert run(x[0]) is None
    assert run(x.clone().requires_grad_()) is None
    assert run(x, types=(nn.Parameter,)) is None
    assert run(1.0, types=(float,), k=()) == ["w", 1.0]
    with pytest.raises(TypeError):
        _C.steady_inputs([x], (torch.Tensor,), keys, template, ((1, 0),), lambda t: t)
    with pytest.raises(ValueError, match="out of range"):
        _C.steady_inputs((x,), (torch.Tensor,), keys, template, ((5, 0),), lambda t: t)
    p = nn.Parameter(torch.ones(2))
    assert _C.attrs_are([p], "requires_grad", (True,)) and not _C.attrs_are([p], "requires_grad", (False,))
    assert not _C.attrs_are([p, p], "dtype", (torch.float32,))          # lengths differ
    with pytest.raises(AttributeError):
        _C.attrs_are([object()], "dtype", (torch.float32,))
