"""Models shared by the benchmarks: written here, random init, no downloads."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):
    def __init__(self, d, heads, max_len):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        mask = torch.full((max_len, max_len), float("-inf")).triu(1)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q = q.reshape(B, T, self.heads, C // self.heads).transpose(1, 2)
        k = k.reshape(B, T, self.heads, C // self.heads).transpose(1, 2)
        v = v.reshape(B, T, self.heads, C // self.heads).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // self.heads)) + self.mask[:T, :T]
        y = att.softmax(dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class Block(nn.Module):
    def __init__(self, d, heads, max_len):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = Attention(d, heads, max_len)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    """A GPT-2-style decoder; forward(idx, targets) returns the mean cross-entropy."""

    def __init__(self, vocab=4096, d=256, heads=4, layers=4, max_len=128, tie=False):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(max_len, d)
        self.blocks = nn.ModuleList(Block(d, heads, max_len) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        if tie:   # GPT-2's own: the output projection is the token embedding
            self.head.weight = self.wte.weight
        self.register_buffer("pos", torch.arange(max_len), persistent=False)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(self.pos[:T])
        for b in self.blocks:
            x = b(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


class MLP(nn.Module):
    def __init__(self, d_in=1024, width=1024, layers=4, classes=10, act=F.relu):
        super().__init__()
        dims = [d_in] + [width] * layers
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.head = nn.Linear(width, classes)
        self.act = act

    def forward(self, x, y):
        for l in self.layers:
            x = self.act(l(x))
        return F.cross_entropy(self.head(x), y)


def gpt_batch(batch=8, seq=128, vocab=4096, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, vocab, (batch, seq), generator=g), torch.randint(0, vocab, (batch, seq), generator=g))


def mlp_batch(batch=256, d_in=1024, classes=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, d_in, generator=g), torch.randint(0, classes, (batch,), generator=g))


class ResBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(cout)
        self.skip = None
        if stride != 1 or cin != cout:
            self.skip = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.b1(self.c1(x)))
        y = self.b2(self.c2(y))
        return F.relu(y + (x if self.skip is None else self.skip(x)))


class ResNet(nn.Module):
    """A small ResNet-style CNN for 3x32x32 images; forward(x, y) returns the cross-entropy."""

    def __init__(self, classes=10, width=32):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
                                  nn.MaxPool2d(2))
        self.layers = nn.Sequential(ResBlock(width, width, 1), ResBlock(width, 2 * width, 2),
                                    ResBlock(2 * width, 4 * width, 2))
        self.head = nn.Linear(4 * width, classes)

    def forward(self, x, y):
        x = self.layers(self.stem(x))
        x = x.mean(dim=(2, 3))
        return F.cross_entropy(self.head(x), y)


class EncoderLayer(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x, bias):
        B, T, C = x.shape
        h = C // self.heads
        q, k, v = self.qkv(x).split(C, dim=2)
        q = q.reshape(B, T, self.heads, h).transpose(1, 2)
        k = k.reshape(B, T, self.heads, h).transpose(1, 2)
        v = v.reshape(B, T, self.heads, h).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(h)) + bias
        y = (att.softmax(dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
        x = self.ln1(x + self.proj(y))                       # post-LN, as BERT
        return self.ln2(x + self.out(F.gelu(self.fc(x))))


class BERT(nn.Module):
    """A tiny BERT-style encoder (post-LN, erf GELU, padding mask); forward(ids, mask, labels)
    returns the masked-LM cross-entropy over every position."""

    def __init__(self, vocab=8192, d=128, heads=2, layers=2, max_len=128):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(max_len, d)
        self.ln = nn.LayerNorm(d)
        self.layers = nn.ModuleList(EncoderLayer(d, heads) for _ in range(layers))
        self.head = nn.Linear(d, vocab)
        self.register_buffer("positions", torch.arange(max_len), persistent=False)

    def forward(self, ids, mask, labels):
        T = ids.shape[1]
        x = self.ln(self.tok(ids) + self.pos(self.positions[:T]))
        bias = (1.0 - mask[:, None, None, :].to(x.dtype)) * -10000.0
        for layer in self.layers:
            x = layer(x, bias)
        logits = self.head(x)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


def cnn_batch(batch=64, classes=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, 3, 32, 32, generator=g), torch.randint(0, classes, (batch,), generator=g))


def bert_batch(batch=16, seq=128, vocab=8192, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, seq), generator=g)
    mask = torch.ones(batch, seq, dtype=torch.int64)
    mask[batch // 2:, seq * 3 // 4:] = 0                       # some padded rows
    return (ids, mask, torch.randint(0, vocab, (batch, seq), generator=g))


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(d)), eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class LlamaAttention(nn.Module):
    """Grouped-query attention with rotary embeddings, written as Llama's reference code does
    (the key/value heads repeated to the query heads)."""

    def __init__(self, d, heads, kv_heads, max_len):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, d // heads
        self.q = nn.Linear(d, d, bias=False)
        self.kv = nn.Linear(d, 2 * kv_heads * self.hd, bias=False)
        self.o = nn.Linear(d, d, bias=False)
        inv = 1.0 / (10000 ** (torch.arange(0, self.hd, 2).float() / self.hd))
        ang = torch.outer(torch.arange(max_len).float(), inv)
        ang = torch.cat((ang, ang), dim=-1)
        self.register_buffer("cos", ang.cos(), persistent=False)
        self.register_buffer("sin", ang.sin(), persistent=False)

    def forward(self, x):
        B, T, C = x.shape
        q = self.q(x).reshape(B, T, self.heads, self.hd).transpose(1, 2)
        k, v = self.kv(x).reshape(B, T, 2 * self.kv_heads, self.hd).transpose(1, 2).chunk(2, dim=1)
        cos, sin = self.cos[:T], self.sin[:T]
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        rep = self.heads // self.kv_heads
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(B, T, C))


class LlamaBlock(nn.Module):
    def __init__(self, d, heads, kv_heads, ffn, max_len):
        super().__init__()
        self.n1, self.n2 = RMSNorm(d), RMSNorm(d)
        self.attn = LlamaAttention(d, heads, kv_heads, max_len)
        self.gate, self.up, self.down = nn.Linear(d, ffn, bias=False), nn.Linear(d, ffn, bias=False), \
            nn.Linear(ffn, d, bias=False)

    def forward(self, x):
        x = x + self.attn(self.n1(x))
        h = self.n2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(nn.Module):
    """A Llama-style decoder (RMSNorm, RoPE, SwiGLU, grouped-query attention, untied head);
    forward(idx, targets) returns the mean cross-entropy."""

    def __init__(self, vocab=4096, d=256, heads=4, kv_heads=2, ffn=688, layers=4, max_len=128):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(LlamaBlock(d, heads, kv_heads, ffn, max_len) for _ in range(layers))
        self.norm = RMSNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx, targets):
        x = self.emb(idx)
        for b in self.blocks:
            x = b(x)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


# name -> (constructor, batch function); the benchmark's model list. The first five are
# `make bench`'s default; the others are the same kinds at sizes nobody tuned for
BENCH_MODELS = {
    "mlp": (MLP, mlp_batch),
    "gpt2": (GPT, gpt_batch),
    "resnet": (ResNet, cnn_batch),
    "bert": (BERT, bert_batch),
    "llama": (Llama, gpt_batch),
    "mlp-gelu": (lambda: MLP(d_in=768, width=768, act=F.gelu), lambda: mlp_batch(batch=192, d_in=768)),
    "gpt2-192": (lambda: GPT(d=192, heads=4, max_len=96), lambda: gpt_batch(batch=6, seq=96)),
    "resnet-w48": (lambda: ResNet(width=48), lambda: cnn_batch(batch=48)),
    # GPT-2 124M as released (50257 tokens, 1024 positions, 12 x 768, tied head), batch 4 x 256:
    # seconds a step on a few cores, so bench_train.py runs it for few steps (HEAVY there)
    "gpt2-124m": (lambda: GPT(vocab=50257, d=768, heads=12, layers=12, max_len=1024, tie=True),
                  lambda: gpt_batch(batch=4, seq=256, vocab=50257)),
}
DEFAULT_MODELS = ("mlp", "gpt2", "resnet", "bert", "llama")
