"""Functional patterns real training code uses, as small modules, through the same harness.

    python -m tests.conformance.patterns [--all|--fast] [--json out.json] [names...]
    python -m tests.conformance.patterns --case 'pat:gather|float32|train|0'

module_db covers nn.Module classes one at a time; training code also glues them together
with tensor functions, Python values and autograd tricks. Each pattern below is a module and
the inputs to call it with (float inputs require grad, integer and bool ones are data). Case
ids are ``pat:<name>|<dtype>|<mode>|0``; mode is train, or eval+grad for a module in eval mode
that is still trained through.
"""
import math
import zlib

import torch
import torch.nn as nn
import torch.nn.functional as F

from .harness import Case

PREFIX = "pat:"
DTYPES = {"float32": torch.float32, "float64": torch.float64}
PATTERNS = {}          # name -> (factory returning (module, args), mode)


def pattern(name, mode="train"):
    def register(factory):
        PATTERNS[name] = (factory, mode)
        return factory
    return register


def names():
    return list(PATTERNS)


# Patterns that pass; tests/test_conformance.py runs them (float32) with the module_db fast
# subset. The others are the known failures listed there.
FAST = [
    "detach", "no_grad_block", "frozen_parameter", "item_scale", "embedding_padding_idx", "tied_weights",
    "arange_positions", "masked_fill_bool", "causal_attention", "where", "gather", "index_select",
    "scatter_add_duplicates", "cross_entropy_ignore_index", "masked_mean", "bce_pos_weight", "chunk_split",
    "expand_contiguous", "permute_reshape", "negative_index_slice", "python_loop_unrolled", "dropout_zero",
    "stack_cat", "unbatched_inputs", "odd_sizes_conv_pool", "pad_modes", "cumsum", "clamp", "manual_layernorm",
    "einsum_matmul_broadcast", "reused_module", "buffer_in_forward", "dict_and_tuple_outputs",
    "index_add_duplicates", "eval_with_grad",
]


def fast_case_ids():
    return [f"{PREFIX}{name}|float32|{PATTERNS[name][1]}|0" for name in FAST]


def case_ids(selected, dtypes=("float32", "float64")):
    return [f"{PREFIX}{name}|{dt}|{PATTERNS[name][1]}|0" for name in selected for dt in dtypes]


def build(case_id):
    name, dt, mode, _ = case_id[len(PREFIX):].split("|")
    factory, _ = PATTERNS[name]
    dtype = DTYPES[dt]
    torch.manual_seed(zlib.crc32(name.encode()))
    module, args = factory()
    module.to(dtype)
    module.train(mode == "train")
    args = tuple(a.to(dtype).requires_grad_() if isinstance(a, torch.Tensor) and a.is_floating_point() else a
                 for a in args)
    return Case(case_id, module, (args, {}), dtype, training=mode == "train",
                desc=(factory.__doc__ or "").strip().splitlines()[0] if factory.__doc__ else "",
                backprop=True)


def _fn(forward, **modules):
    """A module whose forward is ``forward(self, *args)``, owning ``modules``."""
    cls = type("Pattern", (nn.Module,), {"forward": forward})
    m = cls()
    for k, v in modules.items():
        setattr(m, k, v)
    return m


def _r(*shape):
    return torch.randn(*shape)


# --------------------------------------------------------------------------- stop-gradients

@pattern("detach")
def _():
    """b(h) * h.detach() + h"""
    return _fn(lambda s, x: s.b(s.a(x)) * s.a(x).detach() + s.a(x), a=nn.Linear(6, 6), b=nn.Linear(6, 6)), (_r(4, 6),)


@pattern("no_grad_block")
def _():
    """a target computed under torch.no_grad()"""
    def forward(s, x):
        h = torch.tanh(s.a(x))
        with torch.no_grad():
            target = s.b(h) * h.abs().mean(-1, keepdim=True)
        return (h - target) ** 2
    return _fn(forward, a=nn.Linear(6, 6), b=nn.Linear(6, 6)), (_r(4, 6),)


@pattern("frozen_parameter")
def _():
    """one layer's parameters have requires_grad=False"""
    m = _fn(lambda s, x: s.b(torch.relu(s.a(x))), a=nn.Linear(5, 7), b=nn.Linear(7, 3))
    m.a.requires_grad_(False)
    return m, (_r(4, 5),)


@pattern("item_scale")
def _():
    """h * h.mean().item(): a Python number from a tensor (the trace freezes it)"""
    return _fn(lambda s, x: s.a(x) * s.a(x).mean().item(), a=nn.Linear(4, 4)), (_r(3, 4),)


@pattern("eval_with_grad", mode="eval+grad")
def _():
    """model.eval() (dropout off, batchnorm frozen) and still trained through: fine-tuning"""
    m = _fn(lambda s, x: s.c(s.drop(torch.relu(s.bn(s.a(x))))),
            a=nn.Linear(5, 6), bn=nn.BatchNorm1d(6), drop=nn.Dropout(0.3), c=nn.Linear(6, 2))
    return m, (_r(8, 5),)


# --------------------------------------------------------------------------- embeddings, masks, indices

@pattern("embedding_padding_idx")
def _():
    """nn.Embedding(padding_idx=0) and F.embedding(padding_idx=3)"""
    def forward(s, ids):
        return s.lin(s.emb(ids) + F.embedding(ids, s.emb.weight, padding_idx=3))
    ids = torch.tensor([[0, 3, 5, 0, 7], [2, 3, 3, 9, 11]])
    return _fn(forward, emb=nn.Embedding(12, 6, padding_idx=0), lin=nn.Linear(6, 3)), (ids,)


@pattern("tied_weights")
def _():
    """output projection shares the embedding matrix (a tied LM head)"""
    def forward(s, ids):
        h = torch.tanh(s.mix(s.emb(ids)))
        return F.linear(h, s.emb.weight)
    return _fn(forward, emb=nn.Embedding(10, 4), mix=nn.Linear(4, 4)), (torch.randint(0, 10, (3, 5)),)


@pattern("arange_positions")
def _():
    """position ids from torch.arange(x.size(1)), as in a transformer embedding"""
    def forward(s, x):
        pos = torch.arange(x.size(1), device=x.device)
        return s.lin(x + s.pos(pos))
    return _fn(forward, pos=nn.Embedding(16, 6), lin=nn.Linear(6, 6)), (_r(2, 7, 6),)


@pattern("masked_fill_bool")
def _():
    """scores.masked_fill(bool mask, -1e4) then softmax"""
    def forward(s, x, mask):
        return torch.softmax(s.a(x).masked_fill(mask, -1e4), dim=-1)
    return _fn(forward, a=nn.Linear(6, 6)), (_r(3, 6), torch.rand(3, 6) > 0.6)


@pattern("causal_attention")
def _():
    """q k^T / sqrt(d) with a triu -inf mask, softmax, @ v"""
    def forward(s, x):
        q, k, v = s.qkv(x).chunk(3, dim=-1)
        att = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
        t = x.size(1)
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool, device=x.device), diagonal=1)
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        return s.out(att @ v)
    return _fn(forward, qkv=nn.Linear(8, 24), out=nn.Linear(8, 8)), (_r(2, 5, 8),)


@pattern("cross_attention")
def _():
    """nn.MultiheadAttention(query=f(tgt), key=value=memory), batch_first: a decoder's cross-attention"""
    def forward(s, tgt, memory):
        return s.att(s.q(tgt), memory, memory, need_weights=False)[0]
    return _fn(forward, q=nn.Linear(8, 8), att=nn.MultiheadAttention(8, 2, batch_first=True)), \
        (_r(2, 3, 8), _r(2, 5, 8))


@pattern("cross_attention_unbatched")
def _():
    """cross-attention of unbatched (L, E) inputs, the query scaled by a learned gain (LayerScale)"""
    def forward(s, tgt, memory):
        return s.att(tgt * s.gain, memory, memory, need_weights=False)[0]
    m = _fn(forward, att=nn.MultiheadAttention(4, 2))
    m.gain = nn.Parameter(torch.rand(4) + 0.5)
    return m, (_r(3, 4), _r(5, 4))


@pattern("where")
def _():
    """torch.where(x > 0, a(x), b(x))"""
    return _fn(lambda s, x: torch.where(x > 0, s.a(x), s.b(x) * 2), a=nn.Linear(5, 5), b=nn.Linear(5, 5)), (_r(4, 5),)


@pattern("gather")
def _():
    """log_probs.gather(1, idx): picking the target's score"""
    def forward(s, x, idx):
        return torch.log_softmax(s.a(x), -1).gather(1, idx)
    return _fn(forward, a=nn.Linear(5, 7)), (_r(4, 5), torch.randint(0, 7, (4, 2)))


@pattern("index_select")
def _():
    """index_select of rows, with a repeated index"""
    return _fn(lambda s, x, idx: s.a(x).index_select(0, idx) * 2, a=nn.Linear(3, 4)), \
        (_r(5, 3), torch.tensor([4, 0, 2, 2, 1]))


@pattern("index_add_duplicates")
def _():
    """index_add with repeated indices: the rows must add up"""
    return _fn(lambda s, x, idx: torch.zeros_like(s.a(x)).index_add(0, idx, s.a(x) * 2), a=nn.Linear(3, 4)), \
        (_r(5, 3), torch.tensor([4, 0, 2, 2, 1]))


@pattern("scatter_add_duplicates")
def _():
    """scatter_add along dim 1 with repeated indices (a segment sum)"""
    def forward(s, x, idx):
        return torch.zeros(x.size(0), 3, dtype=x.dtype).scatter_add(1, idx, s.a(x))
    return _fn(forward, a=nn.Linear(4, 5)), (_r(2, 4), torch.tensor([[0, 2, 2, 1, 0], [1, 1, 1, 0, 2]]))


@pattern("max_dim")
def _():
    """values and indices of h.max(dim=1)"""
    def forward(s, x):
        v, i = s.a(x).max(dim=1)
        return v * 2, i
    return _fn(forward, a=nn.Linear(4, 6)), (_r(5, 4),)


@pattern("topk")
def _():
    """values and indices of topk(3)"""
    return _fn(lambda s, x: s.a(x).topk(3, dim=1), a=nn.Linear(4, 6)), (_r(5, 4),)


@pattern("argmax_accuracy")
def _():
    """(logits.argmax(-1) == target).float().mean() next to the loss: an accuracy metric"""
    def forward(s, x, target):
        logits = s.a(x)
        return F.cross_entropy(logits, target), (logits.argmax(-1) == target).float().mean()
    return _fn(forward, a=nn.Linear(4, 6)), (_r(5, 4), torch.randint(0, 6, (5,)))


@pattern("cross_entropy_ignore_index")
def _():
    """F.cross_entropy with ignore_index=-100 targets in the batch"""
    return _fn(lambda s, x, t: F.cross_entropy(s.a(x), t, ignore_index=-100), a=nn.Linear(5, 6)), \
        (_r(7, 5), torch.tensor([1, -100, 5, 0, -100, 2, 3]))


@pattern("cross_entropy_label_smoothing")
def _():
    """F.cross_entropy(label_smoothing=0.1)"""
    return _fn(lambda s, x, t: F.cross_entropy(s.a(x), t, label_smoothing=0.1), a=nn.Linear(5, 6)), \
        (_r(7, 5), torch.tensor([1, 4, 5, 0, 1, 2, 3]))


@pattern("masked_mean")
def _():
    """(h * mask).sum(1) / mask.sum(1): mean over the non-padded positions"""
    def forward(s, x, mask):
        m = mask.unsqueeze(-1).to(x.dtype)
        return (s.a(x) * m).sum(1) / m.sum(1).clamp(min=1)
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
    return _fn(forward, a=nn.Linear(3, 5)), (_r(3, 4, 3), mask)


@pattern("bce_pos_weight")
def _():
    """F.binary_cross_entropy_with_logits with pos_weight and per-element weight"""
    def forward(s, x, y):
        return F.binary_cross_entropy_with_logits(s.a(x), y, weight=s.w, pos_weight=s.pw)
    m = _fn(forward, a=nn.Linear(4, 3))
    m.register_buffer("w", torch.rand(3) + 0.5)
    m.register_buffer("pw", torch.tensor([1.0, 2.0, 0.5]))
    return m, (_r(6, 4), (torch.rand(6, 3) > 0.5).float())


# --------------------------------------------------------------------------- shapes

@pattern("chunk_split")
def _():
    """chunk and split with uneven sizes"""
    def forward(s, x):
        a, b, c = s.a(x).chunk(3, dim=-1)
        p, q, r = torch.split(x, [2, 3, 1], dim=1)
        return a * b + c, p.sum(1, keepdim=True) * q, r
    return _fn(forward, a=nn.Linear(6, 9)), (_r(4, 6),)


@pattern("expand_contiguous")
def _():
    """bias.view(1, -1).expand(B, -1).contiguous() * x"""
    def forward(s, x):
        return s.bias.view(1, -1).expand(x.size(0), -1).contiguous() * s.a(x)
    m = _fn(forward, a=nn.Linear(5, 5))
    m.bias = nn.Parameter(torch.randn(5))
    return m, (_r(3, 5),)


@pattern("permute_reshape")
def _():
    """view / permute / reshape / transpose / flatten of an intermediate"""
    def forward(s, x):
        h = s.a(x)                                   # (2, 3, 8)
        h = h.view(2, 3, 2, 4).permute(0, 2, 1, 3).reshape(2, 2, 12)
        return h.transpose(0, 1).flatten(1) * 1.5
    return _fn(forward, a=nn.Linear(5, 8)), (_r(2, 3, 5),)


@pattern("negative_index_slice")
def _():
    """out[:, -1], x[..., ::2] and x[:, 1:-1]: the last step of a sequence, strided slices"""
    def forward(s, x):
        h = s.a(x)
        return h[:, -1] * 2, h[..., ::2], h[:, 1:-1].sum(1)
    return _fn(forward, a=nn.Linear(4, 6)), (_r(2, 5, 4),)


@pattern("python_loop_unrolled")
def _():
    """a Python for-loop over time steps (an RNN written by hand)"""
    def forward(s, x):
        h = torch.zeros(x.size(0), 5, dtype=x.dtype)
        outs = []
        for t in range(x.size(1)):
            h = torch.tanh(s.ih(x[:, t]) + s.hh(h))
            outs.append(h)
        return torch.stack(outs, 1)
    return _fn(forward, ih=nn.Linear(3, 5), hh=nn.Linear(5, 5, bias=False)), (_r(2, 4, 3),)


@pattern("dropout_zero")
def _():
    """nn.Dropout(p=0.0) and F.dropout(training=False) in training mode: identities"""
    def forward(s, x):
        return s.drop(s.a(x)) + F.dropout(x, p=0.5, training=False)
    return _fn(forward, a=nn.Linear(4, 4), drop=nn.Dropout(0.0)), (_r(3, 4),)


@pattern("stack_cat")
def _():
    """torch.stack and torch.cat of branches"""
    def forward(s, x):
        a, b = s.a(x), s.b(x)
        return torch.cat([a, b * 2], dim=-1), torch.stack([a, b], dim=0).mean(0)
    return _fn(forward, a=nn.Linear(4, 3), b=nn.Linear(4, 3)), (_r(5, 4),)


@pattern("unbatched_inputs")
def _():
    """Conv1d on (C, L) and Linear on a 1-D vector: inputs without a batch dimension"""
    def forward(s, x, v):
        return s.conv(x).sum(-1) + s.lin(v)
    return _fn(forward, conv=nn.Conv1d(3, 4, 3), lin=nn.Linear(5, 4)), (_r(3, 9), _r(5))


@pattern("odd_sizes_conv_pool")
def _():
    """batch 1, 7x13 image, stride 2, padding, ceil_mode max pooling"""
    net = nn.Sequential(nn.Conv2d(3, 5, 3, stride=2, padding=1), nn.ReLU(),
                        nn.MaxPool2d(2, ceil_mode=True), nn.Conv2d(5, 2, 1))
    return net, (_r(1, 3, 7, 13),)


@pattern("interpolate_nearest")
def _():
    """F.interpolate(scale_factor=2, mode='nearest') after a conv"""
    return _fn(lambda s, x: F.interpolate(s.c(x), scale_factor=2, mode="nearest"), c=nn.Conv2d(2, 3, 3)), \
        (_r(2, 2, 6, 5),)


@pattern("interpolate_bilinear_odd")
def _():
    """F.interpolate(size=(7, 5), mode='bilinear'), align_corners False and True"""
    def forward(s, x):
        h = s.c(x)
        return F.interpolate(h, size=(7, 5), mode="bilinear", align_corners=False), \
            F.interpolate(h, size=(9, 4), mode="bilinear", align_corners=True)
    return _fn(forward, c=nn.Conv2d(2, 3, 1)), (_r(2, 2, 4, 6),)


@pattern("pad_modes")
def _():
    """F.pad reflect, replicate and constant on an intermediate"""
    def forward(s, x):
        h = s.c(x)
        return F.pad(h, (1, 2), mode="reflect") + F.pad(h, (2, 1), mode="replicate") + F.pad(h, (0, 3), value=0.5)
    return _fn(forward, c=nn.Conv1d(2, 3, 1)), (_r(2, 2, 6),)


# --------------------------------------------------------------------------- arithmetic

@pattern("inplace_on_intermediate")
def _():
    """h += 1, h[:, :2] *= 2, h.relu_() on an intermediate (in an order eager can differentiate)"""
    def forward(s, x):
        h = s.a(x)
        h += 1
        h[:, :2] *= 2
        h.relu_()
        return s.b(h)
    return _fn(forward, a=nn.Linear(5, 5), b=nn.Linear(5, 3)), (_r(4, 5),)


@pattern("cumsum")
def _():
    """cumsum along the sequence"""
    return _fn(lambda s, x: s.a(x).cumsum(1) * 0.5, a=nn.Linear(4, 4)), (_r(2, 6, 4),)


@pattern("clamp")
def _():
    """clamp(-0.5, 0.5) and clamp_min: gradients cut outside the range"""
    return _fn(lambda s, x: s.a(x).clamp(-0.5, 0.5) + s.a(x).clamp_min(0.1) * 2, a=nn.Linear(5, 5)), (_r(6, 5),)


@pattern("manual_layernorm")
def _():
    """(x - mean) / sqrt(var + eps), var and std written out"""
    def forward(s, x):
        h = s.a(x)
        mu = h.mean(-1, keepdim=True)
        var = h.var(-1, keepdim=True, unbiased=False)
        return (h - mu) / torch.sqrt(var + 1e-5) * s.g + h.std(-1, keepdim=True)
    m = _fn(forward, a=nn.Linear(6, 6))
    m.g = nn.Parameter(torch.ones(6) + 0.1 * torch.randn(6))
    return m, (_r(4, 6),)


@pattern("normalize_norm")
def _():
    """F.normalize and x.norm(dim): cosine-similarity heads"""
    def forward(s, x):
        h = s.a(x)
        return F.normalize(h, dim=-1) @ F.normalize(s.w, dim=-1).t() * h.norm(dim=-1, keepdim=True)
    m = _fn(forward, a=nn.Linear(5, 6))
    m.w = nn.Parameter(torch.randn(4, 6))
    return m, (_r(3, 5),)


@pattern("einsum_matmul_broadcast")
def _():
    """einsum('bij,bjk->bik') and a broadcasting matmul against a parameter"""
    def forward(s, x, y):
        return torch.einsum("bij,bjk->bik", x, y) @ s.w + torch.matmul(x, s.v)
    m = _fn(forward)
    m.w, m.v = nn.Parameter(torch.randn(4, 3)), nn.Parameter(torch.randn(5, 3))
    return m, (_r(2, 3, 5), _r(2, 5, 4))


@pattern("reused_module")
def _():
    """the same Linear applied twice (its gradient sums both uses)"""
    return _fn(lambda s, x: s.a(torch.tanh(s.a(x))), a=nn.Linear(4, 4)), (_r(3, 4),)


@pattern("buffer_in_forward")
def _():
    """a registered buffer (a constant scale) used in forward"""
    m = _fn(lambda s, x: s.a(x) * s.scale + s.shift, a=nn.Linear(3, 3))
    m.register_buffer("scale", torch.tensor([0.5, 2.0, -1.0]))
    m.register_buffer("shift", torch.randn(3), persistent=False)
    return m, (_r(4, 3),)


@pattern("dict_and_tuple_outputs")
def _():
    """forward returns a dict holding a tuple, next to an int"""
    def forward(s, x):
        h = s.a(x)
        return {"logits": h, "extra": (h.sum(-1), torch.relu(h)), "n": 3}
    return _fn(forward, a=nn.Linear(4, 5)), (_r(2, 4),)


@pattern("pairwise_distance_orders")
def _():
    """nn.PairwiseDistance of orders 3 and 1 (keepdim) and inf between two embeddings"""
    def forward(s, x, y):
        a, b = s.a(x), s.a(y)
        return s.d3(a, b) + s.d1(a, b).squeeze(-1) + F.pairwise_distance(a, b.flip(0), p=math.inf)
    m = _fn(forward, a=nn.Linear(5, 6), d3=nn.PairwiseDistance(p=3), d1=nn.PairwiseDistance(p=1, keepdim=True))
    return m, (_r(4, 5), _r(4, 5))


@pattern("triplet_margin_swap")
def _():
    """nn.TripletMarginLoss(p=3, swap=True) on a shared embedding net"""
    loss = nn.TripletMarginLoss(margin=1.0, p=3, swap=True)
    m = _fn(lambda s, a, p, n: s.loss(s.a(a), s.a(p), s.a(n)), a=nn.Linear(5, 6), loss=loss)
    return m, (_r(6, 5), _r(6, 5), _r(6, 5))


@pattern("cosine_similarity_zero_vector")
def _():
    """nn.CosineSimilarity where one embedding is a zero vector (ReLU of a negative row)"""
    def forward(s, x, y):
        return s.cos(torch.relu(s.a(x) - 10.0 * (x[:, :1] < 0)), s.a(y))
    m = _fn(forward, a=nn.Linear(5, 6), cos=nn.CosineSimilarity(dim=1))
    x = _r(4, 5)
    x[1, 0] = -1.0
    return m, (x, _r(4, 5))


@pattern("cdist_orders")
def _():
    """torch.cdist of orders 1, 2 and 3 between a batch and learned prototypes"""
    def forward(s, x):
        h = s.a(x)
        return torch.cdist(h, s.w, p=1) + torch.cdist(h, s.w) + torch.cdist(h, s.w, p=3)
    m = _fn(forward, a=nn.Linear(5, 6))
    m.w = nn.Parameter(torch.randn(3, 6))
    return m, (_r(4, 5),)


@pattern("normalize_p3_zero_row")
def _():
    """F.normalize(p=3) of rows one of which is zero (the norm's subgradient at 0)"""
    def forward(s, x):
        h = s.a(x) * (x[:, :1] > -1.0)
        return F.normalize(h, p=3, dim=-1) * s.g
    m = _fn(forward, a=nn.Linear(5, 6))
    m.g = nn.Parameter(torch.randn(6))
    x = _r(4, 5)
    x[2, 0] = -2.0
    return m, (x,)


def main(argv=None):
    from . import runner
    return runner.main(argv, source="patterns")


if __name__ == "__main__":
    raise SystemExit(main())
