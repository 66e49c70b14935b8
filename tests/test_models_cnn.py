"""A ResNet-style CNN trains through the engine (3x32x32 inputs).

Conv2d with stride, padding and groups, BatchNorm2d in training mode, ReLU, MaxPool2d,
a residual add, AdaptiveAvgPool2d(1) and Linear. BatchNorm's running_mean, running_var
and num_batches_tracked must be updated in the module's own buffers — the same tensor
objects, in place — with the values eager computes.
"""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from modelparity import assert_close, call_or_xfail, train_parity, train_with_dropout
from ortmod.capture import torchscript, flatten
from ortmod import ORTModule


class Block(nn.Module):
    """Residual block: 3x3 conv (groups) -> BN -> ReLU -> 3x3 conv -> BN, + skip."""

    def __init__(self, cin, cout, stride, groups):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, groups=groups, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.skip = None
        if stride != 1 or cin != cout:
            self.skip = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        h = self.bn2(self.conv2(h))
        return F.relu(h + (x if self.skip is None else self.skip(x)))


class TinyResNet(nn.Module):
    def __init__(self, classes=10, p=0.0):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, stride=1, padding=1), nn.BatchNorm2d(8),
                                  nn.ReLU(), nn.MaxPool2d(2))                     # 8x16x16
        self.layer1 = Block(8, 8, stride=1, groups=2)
        self.layer2 = Block(8, 16, stride=2, groups=4)                           # 16x8x8
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.drop = nn.Dropout(p)
        self.fc = nn.Linear(16, classes)

    def forward(self, x, y):
        h = self.layer2(self.layer1(self.stem(x)))
        logits = self.fc(self.drop(torch.flatten(self.pool(h), 1)))
        return F.cross_entropy(logits, y)


def make_batches(n=3, b=8, seed=3):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(b, 3, 32, 32, generator=g), torch.randint(0, 10, (b,), generator=g))
            for _ in range(n)]


@pytest.fixture(autouse=True)
def two_threads():
    """The 10-step parity runs near a tie (one value flips at step 7 under any change of
    summation order: eager at 1 thread against eager at 2 fails it the same way). Both sides
    run at 2 threads, so the result does not depend on how many cores the machine has."""
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(old)


def ce(model, batch):
    return model(*batch)


def bn_buffers(model):
    return {n: b for n, b in model.named_buffers()
            if n.endswith(("running_mean", "running_var", "num_batches_tracked"))}


def test_cnn_parity_10_steps_and_batchnorm_buffers_in_place():
    batches = make_batches()
    # the buffers' identity and storage must survive training: updated in place
    eager, ort, _ = train_parity(TinyResNet, batches, ce)
    for n, b in bn_buffers(ort).items():
        if n.endswith("num_batches_tracked"):
            assert b.item() == 10, f"{n} = {b.item()} after 10 training steps"
    # eval mode uses the running statistics: same outputs as eager
    ort.eval()
    eager.eval()
    x, y = batches[0]
    assert_close("eval loss", ort(x, y), eager(x, y))


def test_cnn_batchnorm_updates_the_same_buffer_objects():
    torch.manual_seed(0)
    inner = TinyResNet()
    eager = copy.deepcopy(inner)
    model = ORTModule(inner)
    before = {n: (b, b.data_ptr()) for n, b in bn_buffers(inner).items()}
    x, y = make_batches(1)[0]
    call_or_xfail(lambda: model(x, y)).backward()
    eager(x, y).backward()
    with torch.no_grad():                      # train mode without grad: eager updates too
        model(x, y)
        eager(x, y)
    after = bn_buffers(inner)
    for n, (b, ptr) in before.items():
        assert after[n] is b and b.data_ptr() == ptr, f"{n} was replaced, not updated in place"
    for (n, be), bo in zip(eager.named_buffers(), inner.buffers()):
        assert_close(f"buffer {n}", bo, be)
    assert inner.stem[1].num_batches_tracked.item() == 2


def test_cnn_trains_with_dropout():
    train_with_dropout(lambda: TinyResNet(p=0.3), make_batches(), ce, steps=12, lr=1e-2)


def test_batchnorm_running_stats_become_graph_outputs():
    """What the wrapper relies on, checked on the exported graph (no engine needed): each
    training-mode BatchNormalization's new running stats are extra graph outputs mapped to
    the module's buffers, and each BN's num_batches_tracked is counted."""
    import onnx
    model = TinyResNet().train()
    x, y = make_batches(1)[0]
    exported = torchscript.export(model, flatten.flatten_inputs((x, y), {}))
    graph = onnx.load_from_string(exported.onnx_bytes).graph
    bns = [n for n, m in model.named_modules() if isinstance(m, nn.BatchNorm2d)]
    assert len(bns) == 6
    names = sorted(name for _, name in exported.state_updates)
    assert names == sorted(f"{p}.{s}" for p in bns for s in ("running_mean", "running_var"))
    assert sorted(exported.counters) == sorted(f"{p}.num_batches_tracked" for p in bns)
    n_user = len(exported.output_tensor_positions)
    # between them: the guards of values the trace froze (each BN's batch-size check)
    n_guards = len(exported.guards)
    assert all(g.internal for g in exported.guards) and not exported.hazards
    assert n_user == 1 and len(graph.output) == 1 + n_guards + 2 * len(bns)
    assert sorted(i for i, _ in exported.state_updates) == list(range(1 + n_guards, 1 + n_guards + 2 * len(bns)))
    # eval mode: inference BN, nothing to update
    model.eval()
    exported = torchscript.export(model, flatten.flatten_inputs((x, y), {}))
    assert exported.state_updates == [] and exported.counters == []


# ---- transformers' ResNet: a ReLU kink, not a wrong gradient ----------------------------------

def _hf_resnet_stem_and_stage():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.ResNetConfig(num_labels=10, embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1],
                                    layer_type="basic")
    m = transformers.ResNetForImageClassification(cfg).train()
    return nn.Sequential(m.resnet.embedder, m.resnet.encoder.stages[0])


def _grad_error_against(referee, model, x, dy):
    """The largest parameter-gradient error of model against referee (float64), relative to
    each gradient's own size."""
    (model(x) * dy).sum().backward()
    return max(float((p.grad.double() - r.grad).abs().max() / r.grad.abs().max())
               for p, r in zip(model.parameters(), referee.parameters()))


def test_hf_resnet_batchnorm_gradient_is_eagers_up_to_a_relu_kink():
    """The issue's repro: ortmod's float32 gradient of the stage's first BatchNorm bias is 2.7e-2
    off the float64 referee on one channel, eager's 2e-6. The cause is one element: that
    BatchNorm's output is 1.7e-7 in float64; eager's float32 (oneDNN's convolution) rounds it
    to +9e-7, ortmod's to -1.0e-6 -- both within 2.7e-6 of float64, the same precision -- so
    the ReLU after it lets the element's gradient through in eager and stops it in ortmod. Eager
    itself, with its own (non-oneDNN) convolution, lands on ortmod's side and ortmod's gradient.
    What the engine computes is exact: in float64 it is eager's to 1e-12."""
    base = _hf_resnet_stem_and_stage()
    x = torch.randn(4, 3, 64, 64, generator=torch.Generator().manual_seed(3))
    dy = torch.randn(4, 16, 16, 16, generator=torch.Generator().manual_seed(0))
    ref = copy.deepcopy(base).double()
    (ref(x.double()) * dy.double()).sum().backward()
    # float64: the engine's arithmetic, no kink can flip
    assert _grad_error_against(ref, ORTModule(copy.deepcopy(base).double()), x.double(), dy.double()) <= 1e-12
    # float32: within what eager's own float32 algorithms span on this input
    eager = [_grad_error_against(ref, copy.deepcopy(base), x, dy)]
    with torch.backends.mkldnn.flags(enabled=False):
        eager.append(_grad_error_against(ref, copy.deepcopy(base), x, dy))
    ours = _grad_error_against(ref, ORTModule(copy.deepcopy(base)), x, dy)
    assert ours <= 1.5 * max(eager), (ours, eager)
    # and the kink is the whole story: the element whose sign differs is the one near zero
    trunc = nn.Sequential(base[0], base[1].layers[0].layer[0].convolution, base[1].layers[0].layer[0].normalization)
    y64 = copy.deepcopy(trunc).double()(x.double())
    y32 = ORTModule(copy.deepcopy(trunc))(x).detach()
    flipped = (y32 > 0) != (y64 > 0)
    assert flipped.sum() >= 1 and float(y64[flipped].abs().max()) < 1e-5
