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

    def __init__(self, vocab=4096, d=256, heads=4, layers=4, max_len=128):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(max_len, d)
        self.blocks = nn.ModuleList(Block(d, heads, max_len) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.register_buffer("pos", torch.arange(max_len), persistent=False)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(self.pos[:T])
        for b in self.blocks:
            x = b(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


class MLP(nn.Module):
    def __init__(self, d_in=1024, width=1024, layers=4, classes=10):
        super().__init__()
        dims = [d_in] + [width] * layers
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.head = nn.Linear(width, classes)

    def forward(self, x, y):
        for l in self.layers:
            x = F.relu(l(x))
        return F.cross_entropy(self.head(x), y)


def gpt_batch(batch=8, seq=128, vocab=4096, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, vocab, (batch, seq), generator=g), torch.randint(0, vocab, (batch, seq), generator=g))


def mlp_batch(batch=256, d_in=1024, classes=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, d_in, generator=g), torch.randint(0, classes, (batch,), generator=g))
