"""Whole models on CUDA: ORTModule on the GPU against eager PyTorch on the GPU (loss and
gradients after a few SGD steps), and no CPU<->GPU synchronization in a step."""
import copy

import pytest
import torch
import torch.nn as nn

from ortmod import ORTModule


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.LayerNorm(64), nn.Linear(64, 10))

    def forward(self, x, y):
        return nn.functional.cross_entropy(self.net(x), y)


def _train(model, batches, steps=3):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for x, y in batches[:steps]:
        loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def test_mlp_cuda_matches_eager_cuda():
    torch.manual_seed(0)
    ref = MLP().cuda()
    ort = MLP().cuda()
    ort.load_state_dict(ref.state_dict())
    ort = ORTModule(ort)
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(16, 32, generator=g).cuda(), torch.randint(0, 10, (16,), generator=g).cuda()) for _ in range(3)]
    a, b = _train(ref, batches), _train(ort, batches)
    assert ort._ortmod_export_count == 1
    for x, y in zip(a, b):
        assert abs(x - y) < 1e-4 * max(1.0, abs(x)), (a, b)


def test_gpt2_tiny_cuda_matches_eager_cuda():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=64, resid_pdrop=0.0,
                                  embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False)
    torch.manual_seed(0)
    ref = transformers.GPT2LMHeadModel(cfg).cuda()
    ort = transformers.GPT2LMHeadModel(cfg).cuda()
    ort.load_state_dict(ref.state_dict())
    ort = ORTModule(ort)
    ids = torch.randint(0, 256, (4, 16), device="cuda")
    l_ref = ref(input_ids=ids, labels=ids).loss
    l_ort = ort(input_ids=ids, labels=ids).loss
    l_ref.backward()
    l_ort.backward()
    torch.testing.assert_close(l_ort, l_ref, rtol=1e-4, atol=1e-4)
    for (n, p), q in zip(ref.named_parameters(), ort.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-3, atol=1e-4, msg=n)


def test_no_sync_in_a_step():
    model = ORTModule(MLP().cuda())
    x, y = torch.randn(16, 32, device="cuda"), torch.randint(0, 10, (16,), device="cuda")
    model(x, y).backward()                     # export + plan (uploads are allowed here)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")    # any torch-initiated sync in the step raises
    try:
        loss = model(x, y)
        loss.backward()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    import ctypes
    import os
    lib = ctypes.CDLL(os.path.join(os.path.dirname(__import__("ortmod").__file__), "libortmod_cuda.so"))
    lib.om_cuda_sync_count.restype = ctypes.c_uint64
    before = lib.om_cuda_sync_count()
    model(x, y).backward()
    assert lib.om_cuda_sync_count() == before, "the engine synchronized the host inside a step"


# ---- CNN (Conv, BatchNormalization, MaxPool, GlobalAveragePool) and RNNs (LSTM, GRU) on CUDA ----------

@pytest.fixture
def exact_fp32():
    """Eager's cuDNN convolutions may use TF32; the engine computes fp32 exactly: compare like with like."""
    old = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = old


def _parity_cuda(make, batches, steps=3, rtol=1e-4, atol=1e-4):
    """Eager CUDA and ORTModule CUDA copies of one model, SGD with momentum: the first step's
    gradients, every loss and the final buffers (BatchNorm's running statistics) agree."""
    torch.manual_seed(0)
    base = make().cuda()
    ref, ort = copy.deepcopy(base).train(), ORTModule(copy.deepcopy(base)).train()
    opt_r = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
    opt_o = torch.optim.SGD(ort.parameters(), lr=0.05, momentum=0.9)
    for step in range(steps):
        x, y = (t.cuda() for t in batches[step % len(batches)])
        l_ref, l_ort = ref(x, y), ort(x, y)
        l_ref.backward()
        l_ort.backward()
        torch.testing.assert_close(l_ort, l_ref, rtol=rtol, atol=atol, msg=f"loss at step {step}")
        if step == 0:
            for (n, p), q in zip(ref.named_parameters(), ort.parameters()):
                torch.testing.assert_close(q.grad, p.grad, rtol=1e-3, atol=atol, msg=f"gradient of {n}")
        for opt in (opt_r, opt_o):
            opt.step()
            opt.zero_grad(set_to_none=True)
    for (n, b), c in zip(ref.named_buffers(), ort.buffers()):
        torch.testing.assert_close(c, b, rtol=rtol, atol=atol, msg=f"buffer {n}")
    assert ort._ortmod_export_count == 1


def test_cnn_cuda_matches_eager_cuda(exact_fp32):
    from test_models_cnn import TinyResNet, make_batches
    _parity_cuda(TinyResNet, make_batches())


@pytest.mark.parametrize("cell", [nn.LSTM, nn.GRU], ids=["LSTM", "GRU"])
@pytest.mark.parametrize("bidirectional", [False, True], ids=["1dir", "bidir"])
def test_rnn_cuda_matches_eager_cuda(exact_fp32, cell, bidirectional):
    from test_models_rnn import RNNClassifier, make_batches
    _parity_cuda(lambda: RNNClassifier(cell, num_layers=1 if bidirectional else 2, bidirectional=bidirectional),
                 make_batches())
