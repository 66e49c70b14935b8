"""Random training models from a grammar of what real models compose, as JSON-able specs.

A spec is a dict::

    {"seed": 7, "dtype": "float32", "capture": "torchscript", "steps": 2, "eval_after": true,
     "input": {"kind": "img2", "shape": [2, 3, 7, 5], "grad": true},
     "layers": [{"op": "conv", "out": 4, "k": 3, ...}, {"op": "residual", "body": [...]}, ...],
     "head": {"op": "ce", "ignore_index": -100, ...}}

``build(spec)`` turns it into an ``nn.Module`` (``FuzzModel``) and its forward arguments, the
same every time (the weights and inputs come from ``spec["seed"]``), so a case can be saved,
replayed and shrunk. ``generate(seed)`` draws a spec.

A value flows through the layers in one of five kinds:

    tok  (B, L)        token ids (only as the input: an embedding reads them)
    img2 (B, C, H, W)  2-d convolutions, norms and pools
    img1 (B, C, L)     1-d convolutions, norms and pools
    seq  (B, L, E)     linears, layer/RMS norms, attention
    vec  (B, F)        linears, batch/layer norms

Each op is one entry of OPS: the kinds it reads, a generator of its parameters (given the
shape it reads and a ``mode``: None, "same" — keep the shape, for a residual body — or "chan"
— keep all but the channel dim, for a concat branch) and a builder returning a module and the
kind it writes. Shapes are not computed by hand: the builder's module runs once on a sample
(in training mode, on a copy), so a generated layer that eager PyTorch cannot run is never kept.
"""
import copy
import json
import random

import torch
import torch.nn as nn
import torch.nn.functional as F

KINDS = ("img2", "img1", "seq", "vec")
CHANNEL_DIM = {"img2": 1, "img1": 1, "seq": -1, "vec": -1}
MAX_NUMEL = 4096        # no intermediate value larger than this (speed: thousands of models)


class InvalidSpec(Exception):
    """The spec does not describe a model eager PyTorch can run (a generator's or shrinker's
    candidate to drop, never a finding about ortmod)."""


# --------------------------------------------------------------------------- small modules

class Fn(nn.Module):
    """A stateless layer: ``f(x)``. The function is a closure over the layer's parameters."""

    def __init__(self, name, f):
        super().__init__()
        self.name, self.f = name, f

    def forward(self, x):
        return self.f(x)

    def extra_repr(self):
        return self.name


class Seq(nn.Module):
    def __init__(self, mods):
        super().__init__()
        self.mods = nn.ModuleList(mods)

    def forward(self, x):
        for m in self.mods:
            x = m(x)
        return x


class Residual(nn.Module):
    def __init__(self, body, how, alpha):
        super().__init__()
        self.body, self.how, self.alpha = body, how, alpha

    def forward(self, x):
        y = self.body(x)
        if self.how == "mul":
            return x * y
        if self.how == "gate":
            return x * torch.sigmoid(y)
        return x + self.alpha * y


class Concat(nn.Module):
    def __init__(self, branches, dim):
        super().__init__()
        self.branches, self.dim = nn.ModuleList(branches), dim

    def forward(self, x):
        return torch.cat([b(x) for b in self.branches], dim=self.dim)


class Permuted(nn.Module):
    """A channels-last norm on an image: permute C last, norm, permute back (ConvNeXt)."""

    def __init__(self, inner, ndim):
        super().__init__()
        self.inner, self.ndim = inner, ndim

    def forward(self, x):
        if self.ndim == 4:
            return self.inner(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        return self.inner(x.transpose(1, 2)).transpose(1, 2)


class Attention(nn.Module):
    """Self-attention through F.scaled_dot_product_attention: q/k/v projections, H query heads
    over Hkv key/value heads (GQA by enable_gqa or by repeat_interleave), a mask or is_causal."""

    def __init__(self, p, E, L, gen):
        super().__init__()
        H, Hkv, D = p["heads"], p["kv_heads"], p["head_dim"]
        self.p = p
        self.q = nn.Linear(E, H * D, bias=p["bias"])
        self.k = nn.Linear(E, Hkv * D, bias=p["bias"])
        self.v = nn.Linear(E, Hkv * D, bias=p["bias"])
        self.o = nn.Linear(H * D, p["out"], bias=p["bias"])
        mask = p["mask"]
        if mask == "bool":
            m = torch.rand(L, L, generator=gen) > p.get("mask_p", 0.3)
            m |= torch.eye(L, dtype=torch.bool)      # no row fully masked (eager would give NaN)
            self.register_buffer("mask", m, persistent=False)
        elif mask == "float":
            m = torch.randn(L, L, generator=gen)
            m = m.masked_fill(torch.rand(L, L, generator=gen) < 0.3, float("-inf"))
            m.fill_diagonal_(0.0)
            self.register_buffer("mask", m, persistent=False)
        else:
            self.mask = None

    def forward(self, x):
        p = self.p
        B, L, _ = x.shape
        H, Hkv, D = p["heads"], p["kv_heads"], p["head_dim"]
        q = self.q(x).view(B, L, H, D).transpose(1, 2)
        k = self.k(x).view(B, L, Hkv, D).transpose(1, 2)
        v = self.v(x).view(B, L, Hkv, D).transpose(1, 2)
        kw = {}
        if Hkv != H:
            if p["gqa"] == "enable_gqa":
                kw["enable_gqa"] = True
            else:
                k = k.repeat_interleave(H // Hkv, dim=1)
                v = v.repeat_interleave(H // Hkv, dim=1)
        if p.get("scale") is not None:
            kw["scale"] = p["scale"]
        mask = self.mask.to(x.dtype) if self.mask is not None and self.mask.is_floating_point() else self.mask
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=p["mask"] == "causal", **kw)
        return self.o(y.transpose(1, 2).reshape(B, L, H * D))


class MHA(nn.Module):
    def __init__(self, p, E, L, B, gen):
        super().__init__()
        self.p = p
        self.mha = nn.MultiheadAttention(E, p["heads"], bias=p["bias"], add_bias_kv=p["add_bias_kv"],
                                         add_zero_attn=p["add_zero_attn"], batch_first=p["batch_first"])
        if p["mask"] == "bool":
            m = torch.rand(L, L, generator=gen) > 0.7      # True: not allowed
            m &= ~torch.eye(L, dtype=torch.bool)
            self.register_buffer("attn_mask", m, persistent=False)
        elif p["mask"] == "causal":
            self.register_buffer("attn_mask", torch.ones(L, L, dtype=torch.bool).triu(1), persistent=False)
        else:
            self.attn_mask = None
        if p["key_padding"]:
            m = torch.rand(B, L, generator=gen) > 0.7
            m[:, 0] = False
            self.register_buffer("kpm", m, persistent=False)
        else:
            self.kpm = None

    def forward(self, x):
        p = self.p
        if not p["batch_first"]:
            x = x.transpose(0, 1)
        y, _ = self.mha(x, x, x, key_padding_mask=self.kpm, need_weights=p["need_weights"],
                        attn_mask=self.attn_mask, is_causal=p["mask"] == "causal" and self.attn_mask is not None)
        if not p["batch_first"]:
            y = y.transpose(0, 1)
        return y


class TiedHead(nn.Module):
    """Logits through the embedding's own weight (GPT-2's tied LM head)."""

    def __init__(self, emb):
        super().__init__()
        self.emb = emb

    def forward(self, x):
        return x @ self.emb.weight.t()


class SwiGLU(nn.Module):
    def __init__(self, E, hidden, out, bias, act):
        super().__init__()
        self.up = nn.Linear(E, 2 * hidden, bias=bias)
        self.down = nn.Linear(hidden, out, bias=bias)
        self.act = act

    def forward(self, x):
        a, b = self.up(x).chunk(2, dim=-1)
        return self.down(ACTS[self.act](a) * b)


class TokenEmbedding(nn.Module):
    def __init__(self, p, L, gen):
        super().__init__()
        self.emb = nn.Embedding(p["vocab"], p["dim"], padding_idx=p["padding_idx"])
        self.pos = nn.Parameter(torch.randn(L, p["dim"], generator=gen) * 0.1) if p["pos"] else None

    def forward(self, t):
        x = self.emb(t)
        return x + self.pos if self.pos is not None else x


class Head(nn.Module):
    """The loss (or none: the output goes back and the loss is the caller's)."""

    def __init__(self, p, kind, weight=None, pos_weight=None):
        super().__init__()
        self.p, self.kind = p, kind
        if weight is not None:
            self.register_buffer("class_weight", weight, persistent=False)
        else:
            self.class_weight = None
        if pos_weight is not None:
            self.register_buffer("pos_weight", pos_weight, persistent=False)
        else:
            self.pos_weight = None

    def logits(self, x):
        """(N, C, ...) logits for the class losses: the channel dim of images, the last of seq/vec."""
        if self.kind == "seq":
            return x.reshape(-1, x.shape[-1]) if self.p.get("flat", True) else x.transpose(1, 2)
        return x

    def forward(self, x, target=None):
        p = self.p
        op = p["op"]
        if op == "none":
            return x
        red = p.get("reduction", "mean")
        if op == "mse":
            loss = F.mse_loss(x, target, reduction=red)
        elif op == "l1":
            loss = F.l1_loss(x, target, reduction=red)
        elif op == "smooth_l1":
            loss = F.smooth_l1_loss(x, target, reduction=red, beta=p["beta"])
        elif op == "huber":
            loss = F.huber_loss(x, target, reduction=red, delta=p["delta"])
        elif op == "ce":
            loss = F.cross_entropy(self.logits(x), target, weight=self.class_weight, ignore_index=p["ignore_index"],
                                   reduction=red, label_smoothing=p["label_smoothing"])
        elif op == "nll":
            loss = F.nll_loss(F.log_softmax(self.logits(x), dim=1), target, weight=self.class_weight,
                              ignore_index=p["ignore_index"], reduction=red)
        elif op == "soft_ce":
            loss = F.cross_entropy(self.logits(x), target, reduction=red, label_smoothing=p["label_smoothing"])
        elif op == "bce":
            loss = F.binary_cross_entropy_with_logits(x, target, reduction=red, pos_weight=self.pos_weight)
        elif op == "kl":
            lp = F.log_softmax(self.logits(x), dim=1)
            loss = F.kl_div(lp, target, reduction=p["reduction"], log_target=p["log_target"])
        else:
            raise InvalidSpec(f"unknown head {op!r}")
        return (loss, x) if p.get("return_output") else loss


class FuzzModel(nn.Module):
    def __init__(self, embed, layers, head):
        super().__init__()
        self.embed = embed
        self.layers = nn.ModuleList(layers)
        self.head = head

    def forward(self, x, target=None):
        if self.embed is not None:
            x = self.embed(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(x, target)


# --------------------------------------------------------------------------- activations

def _clamp(x):
    return x.clamp(-0.5, 0.7)


ACTS = {
    "relu": F.relu, "relu6": F.relu6, "leaky_relu": lambda x: F.leaky_relu(x, 0.1), "elu": F.elu, "selu": F.selu,
    "celu": lambda x: F.celu(x, 0.7),
    "gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu, "mish": F.mish,
    "tanh": torch.tanh, "sigmoid": torch.sigmoid, "softplus": F.softplus, "hardswish": F.hardswish,
    "hardsigmoid": F.hardsigmoid, "hardtanh": F.hardtanh, "softsign": F.softsign, "logsigmoid": F.logsigmoid,
    "abs": torch.abs, "clamp": _clamp, "square": lambda x: x * x, "tanhshrink": F.tanhshrink,
    "hardshrink": lambda x: F.hardshrink(x, 0.3), "softshrink": lambda x: F.softshrink(x, 0.3),
}
# elementwise ops with a kink (a derivative that jumps): rounding near the kink flips gradients
KINKED_ACTS = {"relu", "relu6", "leaky_relu", "hardswish", "hardsigmoid", "hardtanh", "abs", "clamp",
               "hardshrink", "softshrink", "celu", "elu", "selu"}


# --------------------------------------------------------------------------- the op table

OPS = {}


def op(name, kinds, weight=1.0, modes=(None,)):
    """Register an op: ``gen(rng, kind, shape, mode) -> params | None`` and
    ``build(p, kind, shape, ctx) -> (module, out_kind)``."""
    def deco(cls):
        OPS[name] = dict(kinds=kinds, weight=weight, modes=modes, gen=cls.gen, build=cls.build)
        return cls
    return deco


def _divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def _spatial(kind, shape):
    return list(shape[2:]) if kind in ("img2", "img1") else []


@op("act", KINDS, 3.0, (None, "same", "chan"))
class _Act:
    @staticmethod
    def gen(rng, kind, shape, mode):
        fn = rng.choice(sorted(ACTS) + ["prelu"])
        return {"op": "act", "fn": fn, **({"per_channel": rng.random() < 0.5} if fn == "prelu" else {})}

    @staticmethod
    def build(p, kind, shape, ctx):
        if p["fn"] == "prelu":
            n = shape[1] if p.get("per_channel") and kind in ("img2", "img1", "vec") else 1
            m = nn.PReLU(n, init=0.2)
            return m, kind
        return Fn(p["fn"], ACTS[p["fn"]]), kind


@op("conv", ("img2", "img1"), 3.0, (None, "same", "chan"))
class _Conv:
    @staticmethod
    def gen(rng, kind, shape, mode):
        C = shape[1]
        groups = rng.choice([1, 1, 1] + _divisors(C))
        out = C if mode == "same" else groups * rng.randint(1, max(1, 8 // groups))
        k = rng.choice([1, 2, 3, 3, 3, 4, 5])
        dil = rng.choice([1, 1, 1, 2])
        stride = 1 if mode else rng.choice([1, 1, 2, 3])
        if mode or rng.random() < 0.3:
            padding = "same" if stride == 1 else 0
        else:
            padding = rng.randint(0, (k - 1) * dil // 2 + 1)
        pm = rng.choice(["zeros", "zeros", "zeros", "reflect", "replicate", "circular"])
        p = {"op": "conv", "out": out, "k": k, "stride": stride, "dilation": dil, "padding": padding,
             "groups": groups, "bias": rng.random() < 0.7, "padding_mode": pm}
        if kind == "img2" and rng.random() < 0.2:
            p["k"] = [k, rng.choice([1, 2, 3])]
        return p

    @staticmethod
    def build(p, kind, shape, ctx):
        cls = nn.Conv2d if kind == "img2" else nn.Conv1d
        k = p["k"] if kind == "img2" or isinstance(p["k"], int) else p["k"][0]
        return cls(shape[1], p["out"], k, stride=p["stride"], padding=p["padding"], dilation=p["dilation"],
                   groups=p["groups"], bias=p["bias"], padding_mode=p["padding_mode"]), kind


@op("convT", ("img2", "img1"), 1.0)
class _ConvT:
    @staticmethod
    def gen(rng, kind, shape, mode):
        C = shape[1]
        groups = rng.choice([1, 1] + _divisors(C))
        stride = rng.choice([1, 2, 2, 3])
        dil = rng.choice([1, 1, 2])
        k = rng.choice([1, 2, 3, 4])
        return {"op": "convT", "out": groups * rng.randint(1, max(1, 6 // groups)), "k": k, "stride": stride,
                "padding": rng.randint(0, (k - 1) * dil // 2), "output_padding": rng.randint(0, max(stride, dil) - 1),
                "dilation": dil, "groups": groups, "bias": rng.random() < 0.7}

    @staticmethod
    def build(p, kind, shape, ctx):
        cls = nn.ConvTranspose2d if kind == "img2" else nn.ConvTranspose1d
        return cls(shape[1], p["out"], p["k"], stride=p["stride"], padding=p["padding"],
                   output_padding=p["output_padding"], groups=p["groups"], bias=p["bias"],
                   dilation=p["dilation"]), kind


@op("batchnorm", ("img2", "img1", "vec"), 2.0, (None, "same", "chan"))
class _BatchNorm:
    @staticmethod
    def gen(rng, kind, shape, mode):
        return {"op": "batchnorm", "affine": rng.random() < 0.8, "track": rng.random() < 0.85,
                "momentum": rng.choice([0.1, 0.1, 0.01, 0.5]), "eps": rng.choice([1e-5, 1e-3])}

    @staticmethod
    def build(p, kind, shape, ctx):
        cls = nn.BatchNorm2d if kind == "img2" else nn.BatchNorm1d
        return cls(shape[1], eps=p["eps"], momentum=p["momentum"], affine=p["affine"],
                   track_running_stats=p["track"]), kind


@op("groupnorm", ("img2", "img1"), 1.0, (None, "same", "chan"))
class _GroupNorm:
    @staticmethod
    def gen(rng, kind, shape, mode):
        return {"op": "groupnorm", "groups": rng.choice(_divisors(shape[1])), "affine": rng.random() < 0.8,
                "eps": rng.choice([1e-5, 1e-6])}

    @staticmethod
    def build(p, kind, shape, ctx):
        return nn.GroupNorm(p["groups"], shape[1], eps=p["eps"], affine=p["affine"]), kind


@op("instancenorm", ("img2", "img1"), 0.5, (None, "same", "chan"))
class _InstanceNorm:
    @staticmethod
    def gen(rng, kind, shape, mode):
        return {"op": "instancenorm", "affine": rng.random() < 0.5}

    @staticmethod
    def build(p, kind, shape, ctx):
        cls = nn.InstanceNorm2d if kind == "img2" else nn.InstanceNorm1d
        return cls(shape[1], affine=p["affine"]), kind


@op("layernorm", KINDS, 2.0, (None, "same", "chan"))
class _LayerNorm:
    @staticmethod
    def gen(rng, kind, shape, mode):
        how = rng.choice(["last", "whole"]) if kind in ("img2", "img1") else "last"
        return {"op": "layernorm", "how": how, "affine": rng.random() < 0.8, "bias": rng.random() < 0.8,
                "eps": rng.choice([1e-5, 1e-6, 1e-12])}

    @staticmethod
    def build(p, kind, shape, ctx):
        if kind in ("img2", "img1"):
            if p["how"] == "whole":
                return nn.LayerNorm(list(shape[1:]), eps=p["eps"], elementwise_affine=p["affine"], bias=p["bias"]), kind
            return Permuted(nn.LayerNorm(shape[1], eps=p["eps"], elementwise_affine=p["affine"], bias=p["bias"]),
                            len(shape)), kind
        return nn.LayerNorm(shape[-1], eps=p["eps"], elementwise_affine=p["affine"], bias=p["bias"]), kind


@op("rmsnorm", KINDS, 1.5, (None, "same", "chan"))
class _RMSNorm:
    @staticmethod
    def gen(rng, kind, shape, mode):
        return {"op": "rmsnorm", "affine": rng.random() < 0.8, "eps": rng.choice([None, 1e-6])}

    @staticmethod
    def build(p, kind, shape, ctx):
        if kind in ("img2", "img1"):
            return Permuted(nn.RMSNorm(shape[1], eps=p["eps"], elementwise_affine=p["affine"]), len(shape)), kind
        return nn.RMSNorm(shape[-1], eps=p["eps"], elementwise_affine=p["affine"]), kind


@op("pool", ("img2", "img1"), 2.0, (None, "same", "chan"))
class _Pool:
    @staticmethod
    def gen(rng, kind, shape, mode):
        how = rng.choice(["max", "avg"])
        if mode:
            k = rng.choice([1, 3])
            return {"op": "pool", "how": how, "k": k, "stride": 1, "padding": k // 2, "dilation": 1,
                    "ceil_mode": False, "count_include_pad": rng.random() < 0.5}
        k = rng.choice([1, 2, 2, 3, 3, 4])
        p = {"op": "pool", "how": how, "k": k, "stride": rng.choice([None, 1, 2, 3]), "padding": rng.randint(0, k // 2),
             "dilation": rng.choice([1, 1, 2]) if how == "max" else 1, "ceil_mode": rng.random() < 0.3,
             "count_include_pad": rng.random() < 0.5}
        if how == "avg" and kind == "img2" and rng.random() < 0.15:
            p["divisor_override"] = rng.randint(1, 5)
        return p

    @staticmethod
    def build(p, kind, shape, ctx):
        two = kind == "img2"
        if p["how"] == "max":
            cls = nn.MaxPool2d if two else nn.MaxPool1d
            return cls(p["k"], p["stride"], p["padding"], p["dilation"], ceil_mode=p["ceil_mode"]), kind
        if two:
            return nn.AvgPool2d(p["k"], p["stride"], p["padding"], ceil_mode=p["ceil_mode"],
                                count_include_pad=p["count_include_pad"],
                                divisor_override=p.get("divisor_override")), kind
        return nn.AvgPool1d(p["k"], p["stride"], p["padding"], ceil_mode=p["ceil_mode"],
                            count_include_pad=p["count_include_pad"]), kind


@op("adaptive", ("img2", "img1"), 1.0)
class _Adaptive:
    @staticmethod
    def gen(rng, kind, shape, mode):
        size = [rng.randint(1, s + 1) for s in _spatial(kind, shape)]
        return {"op": "adaptive", "how": rng.choice(["max", "avg"]), "size": size}

    @staticmethod
    def build(p, kind, shape, ctx):
        size = p["size"][0] if kind == "img1" else p["size"]
        table = {("max", "img2"): nn.AdaptiveMaxPool2d, ("avg", "img2"): nn.AdaptiveAvgPool2d,
                 ("max", "img1"): nn.AdaptiveMaxPool1d, ("avg", "img1"): nn.AdaptiveAvgPool1d}
        return table[p["how"], kind](size), kind


@op("pad", ("img2", "img1"), 0.7)
class _Pad:
    @staticmethod
    def gen(rng, kind, shape, mode):
        n = 2 * len(_spatial(kind, shape))
        mode_ = rng.choice(["constant", "reflect", "replicate", "circular"])
        return {"op": "pad", "mode": mode_, "pad": [rng.randint(0, 2) for _ in range(n)],
                "value": rng.choice([0.0, 0.5])}

    @staticmethod
    def build(p, kind, shape, ctx):
        pad, mode, value = tuple(p["pad"]), p["mode"], p["value"]
        if mode == "constant":
            return Fn(f"pad {pad} constant {value}", lambda x: F.pad(x, pad, mode="constant", value=value)), kind
        return Fn(f"pad {pad} {mode}", lambda x: F.pad(x, pad, mode=mode)), kind


@op("upsample", ("img2", "img1"), 0.7)
class _Upsample:
    @staticmethod
    def gen(rng, kind, shape, mode):
        m = rng.choice(["nearest", "linear"])
        return {"op": "upsample", "mode": m, "scale": rng.choice([2, 2, 3]),
                "align_corners": rng.random() < 0.5 if m == "linear" else None}

    @staticmethod
    def build(p, kind, shape, ctx):
        mode = p["mode"] if p["mode"] == "nearest" else ("bilinear" if kind == "img2" else "linear")
        s, ac = p["scale"], p["align_corners"]
        return Fn(f"interpolate {mode} x{s}", lambda x: F.interpolate(x, scale_factor=s, mode=mode, align_corners=ac)), kind


@op("slice", ("img2", "img1", "seq", "vec"), 1.0)
class _Slice:
    @staticmethod
    def gen(rng, kind, shape, mode):
        dim = rng.randint(1, len(shape) - 1)
        n = shape[dim]
        start = rng.randint(0, max(0, n - 1))
        stop = rng.randint(start + 1, n)
        step = rng.choice([1, 1, 2])
        return {"op": "slice", "dim": dim, "start": start, "stop": stop, "step": step}

    @staticmethod
    def build(p, kind, shape, ctx):
        idx = [slice(None)] * p["dim"] + [slice(p["start"], p["stop"], p["step"])]
        return Fn(f"x[{idx}]", lambda x: x[tuple(idx)]), kind


@op("flatten", ("img2", "img1", "seq"), 0.7)
class _Flatten:
    @staticmethod
    def gen(rng, kind, shape, mode):
        return {"op": "flatten"}

    @staticmethod
    def build(p, kind, shape, ctx):
        return Fn("flatten", lambda x: x.flatten(1)), "vec"


@op("to_seq", ("img2", "img1"), 1.0)
class _ToSeq:
    @staticmethod
    def gen(rng, kind, shape, mode):
        return {"op": "to_seq"}

    @staticmethod
    def build(p, kind, shape, ctx):
        return Fn("flatten(2).transpose(1, 2)", lambda x: x.flatten(2).transpose(1, 2)), "seq"


@op("to_img1", ("img2", "seq", "vec"), 0.6)
class _ToImg1:
    @staticmethod
    def gen(rng, kind, shape, mode):
        if kind == "vec":
            return {"op": "to_img1", "channels": rng.choice(_divisors(shape[1]))}
        return {"op": "to_img1"}

    @staticmethod
    def build(p, kind, shape, ctx):
        if kind == "img2":
            return Fn("flatten(2)", lambda x: x.flatten(2)), "img1"
        if kind == "seq":
            return Fn("transpose(1, 2)", lambda x: x.transpose(1, 2)), "img1"
        c = p["channels"]
        return Fn(f"view(B, {c}, -1)", lambda x: x.reshape(x.shape[0], c, -1)), "img1"


@op("to_img2", ("seq",), 0.3)
class _ToImg2:
    @staticmethod
    def gen(rng, kind, shape, mode):
        L = shape[1]
        return {"op": "to_img2", "h": rng.choice(_divisors(L))}

    @staticmethod
    def build(p, kind, shape, ctx):
        h = p["h"]
        return Fn(f"transpose(1, 2).unflatten(2, ({h}, -1))",
                  lambda x: x.transpose(1, 2).unflatten(2, (h, -1))), "img2"


@op("reduce", ("img2", "img1", "seq"), 1.0)
class _Reduce:
    """Global pooling of the spatial/sequence dims to a vector (or the first token)."""

    @staticmethod
    def gen(rng, kind, shape, mode):
        return {"op": "reduce", "how": rng.choice(["mean", "mean", "sum", "amax", "amin", "logsumexp", "norm", "first"]
                                                    if kind == "seq" else ["mean", "mean", "sum", "amax", "logsumexp", "norm"])}

    @staticmethod
    def build(p, kind, shape, ctx):
        how = p["how"]
        dims = (1,) if kind == "seq" else tuple(range(2, len(shape)))
        if how == "first":
            return Fn("x[:, 0]", lambda x: x[:, 0]), "vec"
        if how == "logsumexp":
            return Fn(f"logsumexp{dims}", lambda x: torch.logsumexp(x, dim=dims)), "vec"
        if how == "norm":
            return Fn(f"norm{dims}", lambda x: torch.linalg.vector_norm(x, dim=dims)), "vec"
        f = getattr(torch, how)
        return Fn(f"{how}{dims}", lambda x: f(x, dim=dims)), "vec"


@op("linear", ("seq", "vec"), 3.0, (None, "same", "chan"))
class _Linear:
    @staticmethod
    def gen(rng, kind, shape, mode):
        return {"op": "linear", "out": shape[-1] if mode == "same" else rng.randint(1, 16), "bias": rng.random() < 0.8}

    @staticmethod
    def build(p, kind, shape, ctx):
        return nn.Linear(shape[-1], p["out"], bias=p["bias"]), kind


@op("swiglu", ("seq", "vec"), 1.0, (None, "same", "chan"))
class _SwiGLU:
    @staticmethod
    def gen(rng, kind, shape, mode):
        return {"op": "swiglu", "hidden": rng.randint(1, 12), "out": shape[-1] if mode == "same" else rng.randint(1, 12),
                "bias": rng.random() < 0.5, "act": rng.choice(["silu", "gelu", "gelu_tanh", "relu"])}

    @staticmethod
    def build(p, kind, shape, ctx):
        return SwiGLU(shape[-1], p["hidden"], p["out"], p["bias"], p["act"]), kind


@op("softmax", ("seq", "vec", "img2", "img1"), 0.7, (None, "same", "chan"))
class _Softmax:
    @staticmethod
    def gen(rng, kind, shape, mode):
        return {"op": "softmax", "log": rng.random() < 0.5, "dim": rng.randint(1, len(shape) - 1)}

    @staticmethod
    def build(p, kind, shape, ctx):
        f, d = (F.log_softmax if p["log"] else F.softmax), p["dim"]
        return Fn(f"{'log_' if p['log'] else ''}softmax({d})", lambda x: f(x, dim=d)), kind


@op("cumsum", ("seq", "img1"), 0.3, (None, "same", "chan"))
class _Cumsum:
    @staticmethod
    def gen(rng, kind, shape, mode):
        return {"op": "cumsum", "dim": rng.randint(1, len(shape) - 1)}

    @staticmethod
    def build(p, kind, shape, ctx):
        d = p["dim"]
        return Fn(f"cumsum({d})", lambda x: torch.cumsum(x, dim=d)), kind


@op("heads", ("seq",), 0.5, (None, "same", "chan"))
class _Heads:
    """Split E into heads, put heads before L, an activation there, and merge back (a transpose
    and reshape round trip, as attention implementations do by hand)."""

    @staticmethod
    def gen(rng, kind, shape, mode):
        return {"op": "heads", "heads": rng.choice(_divisors(shape[-1])), "act": rng.choice(["gelu", "relu", "tanh"])}

    @staticmethod
    def build(p, kind, shape, ctx):
        h, act = p["heads"], ACTS[p["act"]]

        def f(x):
            B, L, E = x.shape
            y = act(x.view(B, L, h, E // h).transpose(1, 2))
            return y.transpose(1, 2).reshape(B, L, E)
        return Fn(f"heads {h} {p['act']}", f), kind


@op("attention", ("seq",), 2.0, (None, "same", "chan"))
class _Attention:
    @staticmethod
    def gen(rng, kind, shape, mode):
        E = shape[-1]
        heads = rng.choice([1, 2, 2, 4])
        kv = rng.choice([d for d in _divisors(heads)])
        return {"op": "attention", "heads": heads, "kv_heads": kv, "head_dim": rng.choice([1, 2, 4, 8]),
                "out": E if mode == "same" else rng.randint(1, 12), "bias": rng.random() < 0.7,
                "gqa": rng.choice(["enable_gqa", "repeat"]),
                "mask": rng.choice(["none", "causal", "bool", "float"]),
                "scale": rng.choice([None, None, 0.3])}

    @staticmethod
    def build(p, kind, shape, ctx):
        return Attention(p, shape[-1], shape[1], ctx["gen"]), kind


@op("mha", ("seq",), 1.0, (None, "same"))
class _MHA:
    @staticmethod
    def gen(rng, kind, shape, mode):
        E = shape[-1]
        return {"op": "mha", "heads": rng.choice(_divisors(E)[:3]), "bias": rng.random() < 0.8,
                "add_bias_kv": rng.random() < 0.15, "add_zero_attn": rng.random() < 0.1,
                "batch_first": rng.random() < 0.7, "need_weights": rng.random() < 0.3,
                "mask": rng.choice(["none", "bool", "causal"]), "key_padding": rng.random() < 0.3}

    @staticmethod
    def build(p, kind, shape, ctx):
        return MHA(p, shape[-1], shape[1], shape[0], ctx["gen"]), kind


@op("tied_head", ("seq",), 2.0)
class _TiedHead:
    @staticmethod
    def gen(rng, kind, shape, mode):
        return {"op": "tied_head"}

    @staticmethod
    def build(p, kind, shape, ctx):
        emb = ctx.get("embedding")
        if emb is None or emb.weight.shape[1] != shape[-1]:
            raise InvalidSpec("tied_head needs a token embedding of the current width")
        return TiedHead(emb), kind


@op("to_seq1", ("vec",), 0.3)
class _ToSeq1:
    @staticmethod
    def gen(rng, kind, shape, mode):
        return {"op": "to_seq1"}

    @staticmethod
    def build(p, kind, shape, ctx):
        return Fn("unsqueeze(1)", lambda x: x.unsqueeze(1)), "seq"


@op("residual", KINDS, 2.0, (None, "same", "chan"))
class _Residual:
    @staticmethod
    def gen(rng, kind, shape, mode):
        return {"op": "residual", "how": rng.choice(["add", "add", "add", "mul", "gate"]),
                "alpha": rng.choice([1.0, 1.0, 0.5]), "body": None}      # body drawn by gen_chain

    @staticmethod
    def build(p, kind, shape, ctx):
        body, out_kind, out_shape = build_chain(p["body"], kind, shape, ctx)
        if out_kind != kind or tuple(out_shape) != tuple(shape):
            raise InvalidSpec(f"residual body changes the shape {tuple(shape)} -> {tuple(out_shape)}")
        return Residual(body, p["how"], p["alpha"]), kind


@op("concat", KINDS, 1.0, (None, "chan"))
class _Concat:
    @staticmethod
    def gen(rng, kind, shape, mode):
        return {"op": "concat", "branches": None}

    @staticmethod
    def build(p, kind, shape, ctx):
        mods = []
        cd = CHANNEL_DIM[kind] % len(shape)
        for br in p["branches"]:
            body, out_kind, out_shape = build_chain(br, kind, shape, ctx)
            if out_kind != kind or len(out_shape) != len(shape) or \
                    any(a != b for i, (a, b) in enumerate(zip(out_shape, shape)) if i != cd):
                raise InvalidSpec(f"concat branch changes more than the channel dim: {tuple(shape)} -> {tuple(out_shape)}")
            mods.append(body)
        if not mods:
            raise InvalidSpec("concat without branches")
        return Concat(mods, CHANNEL_DIM[kind]), kind


# --------------------------------------------------------------------------- building

def _run_shape(mod, shape, dtype, kind_in):
    """The output shape of ``mod`` on a sample input (training mode, on a copy: running stats
    of the real module stay as they are)."""
    m = copy.deepcopy(mod).train()
    x = torch.randn(shape, dtype=dtype)
    with torch.no_grad():
        y = m(x)
    if not isinstance(y, torch.Tensor) or not y.is_floating_point():
        raise InvalidSpec("a layer must return one float tensor")
    if y.numel() == 0 or y.numel() > MAX_NUMEL:
        raise InvalidSpec(f"layer output of {y.numel()} elements")
    if not torch.isfinite(y).all():
        raise InvalidSpec("layer output not finite on a sample")
    return tuple(y.shape)


def build_layer(p, kind, shape, ctx):
    entry = OPS.get(p.get("op"))
    if entry is None:
        raise InvalidSpec(f"unknown op {p.get('op')!r}")
    if kind not in entry["kinds"]:
        raise InvalidSpec(f"{p['op']} does not read {kind}")
    try:
        mod, out_kind = entry["build"](p, kind, shape, ctx)
        out_shape = _run_shape(mod, shape, torch.float32, kind)
    except InvalidSpec:
        raise
    except Exception as e:      # eager PyTorch cannot build or run it
        raise InvalidSpec(f"{p['op']}: {type(e).__name__}: {e}"[:300]) from None
    expected_ndim = {"img2": 4, "img1": 3, "seq": 3, "vec": 2}[out_kind]
    if len(out_shape) != expected_ndim:
        raise InvalidSpec(f"{p['op']} wrote rank {len(out_shape)} for {out_kind}")
    return mod, out_kind, out_shape


def build_chain(layers, kind, shape, ctx):
    mods = []
    for p in layers:
        mod, kind, shape = build_layer(p, kind, shape, ctx)
        mods.append(mod)
    return Seq(mods), kind, shape


def _seed_norms(model, gen):
    """Norm affines away from their (1, 0) init and running stats away from (0, 1), as in a
    trained model (gradients through a weight of exactly 1 hide scaling mistakes)."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm, nn.RMSNorm)):
                if getattr(m, "weight", None) is not None:
                    m.weight.copy_(1 + 0.3 * torch.randn(m.weight.shape, generator=gen))
                if getattr(m, "bias", None) is not None:
                    m.bias.copy_(0.3 * torch.randn(m.bias.shape, generator=gen))
                if getattr(m, "running_mean", None) is not None:
                    m.running_mean.copy_(0.2 * torch.randn(m.running_mean.shape, generator=gen))
                    m.running_var.copy_(0.5 + torch.rand(m.running_var.shape, generator=gen))


def build(spec):
    """(model, args): a float32 (or float64) FuzzModel and its forward arguments, deterministic
    in spec["seed"]. Raises InvalidSpec when eager PyTorch cannot run the spec."""
    torch.manual_seed(spec["seed"])
    gen = torch.Generator().manual_seed(spec["seed"] + 1)
    inp = spec["input"]
    kind, shape = inp["kind"], tuple(inp["shape"])
    ctx = {"gen": gen}
    embed = None
    if kind == "tok":
        e = inp["embedding"]
        embed = TokenEmbedding(e, shape[1], gen)
        ctx["embedding"] = embed.emb
        kind, shape = "seq", (shape[0], shape[1], e["dim"])
    layers = []
    for p in spec["layers"]:
        mod, kind, shape = build_layer(p, kind, shape, ctx)
        layers.append(mod)
    head_p = spec["head"]
    weight = pos_weight = None
    if head_p.get("class_weight"):
        weight = 0.5 + torch.rand(_classes(kind, shape), generator=gen)
    if head_p.get("pos_weight"):
        pos_weight = 0.5 + torch.rand(shape[-1], generator=gen)
    head = Head(head_p, kind, weight, pos_weight)
    model = FuzzModel(embed, layers, head)
    _seed_norms(model, gen)
    x = _make_input(inp, gen)
    target = make_target(head_p, kind, shape, gen)
    args = (x,) if target is None else (x, target)
    dtype = getattr(torch, spec.get("dtype", "float32"))
    if dtype != torch.float32:
        model = model.to(dtype)
        args = tuple(a.to(dtype) if a.is_floating_point() else a for a in args)
    return model, args


def _make_input(inp, gen):
    shape = inp["shape"]
    if inp["kind"] == "tok":
        e = inp["embedding"]
        t = torch.randint(0, e["vocab"], shape, generator=gen)
        if e["padding_idx"] is not None:
            t[torch.rand(shape, generator=gen) < 0.25] = e["padding_idx"] % e["vocab"]
        return t
    return torch.randn(shape, generator=gen)


def _classes(kind, shape):
    return shape[-1] if kind in ("seq", "vec") else shape[1]


def make_target(p, kind, shape, gen):
    op = p["op"]
    if op == "none":
        return None
    if op in ("mse", "l1", "smooth_l1", "huber"):
        return torch.randn(shape, generator=gen)
    if op == "bce":
        return torch.rand(shape, generator=gen)
    C = _classes(kind, shape)
    if kind == "seq":
        tshape = (shape[0] * shape[1],) if p.get("flat", True) else (shape[0], shape[1])
    else:
        tshape = (shape[0],) + tuple(shape[2:])
    if op in ("ce", "nll"):
        t = torch.randint(0, C, tshape, generator=gen)
        ig = p["ignore_index"]
        drop = torch.rand(tshape, generator=gen) < 0.3
        drop.view(-1)[0] = False                   # at least one target counts (a mean over none is NaN)
        keep0 = t.view(-1)[0].item()
        if 0 <= ig < C:
            t[t == ig] = (ig + 1) % C if C > 1 else ig
            t[drop] = ig
            if C == 1:
                raise InvalidSpec("ignore_index is the only class")
            if t.view(-1)[0].item() == ig:
                t.view(-1)[0] = (ig + 1) % C
        else:
            t[drop] = ig
            t.view(-1)[0] = keep0
        return t
    # soft_ce, kl: a distribution over the class dim
    full = (shape[0] * shape[1], C) if kind == "seq" and p.get("flat", True) else \
        ((shape[0], C, shape[1]) if kind == "seq" else tuple(shape))
    probs = torch.softmax(torch.randn(full, generator=gen), dim=1)
    if op == "kl" and p.get("log_target"):
        return probs.log()
    return probs


# --------------------------------------------------------------------------- generating

def _pick_op(rng, kind, mode, allow):
    names = [n for n, e in OPS.items() if kind in e["kinds"] and mode in e["modes"] and n in allow]
    weights = [OPS[n]["weight"] for n in names]
    return rng.choices(names, weights)[0]


def gen_chain(rng, kind, shape, ctx, n, mode=None, depth=0):
    """Up to ``n`` layers from (kind, shape); ``mode`` "same"/"chan" for residual bodies and
    concat branches (checked by building: a draw that does not keep what it must is dropped).
    Returns (layers, kind, shape)."""
    allow = set(OPS)
    if depth >= 2:
        allow -= {"residual", "concat"}
    if "embedding" not in ctx:
        allow.discard("tied_head")
    layers = []
    tries = 0
    while len(layers) < n and tries < 12 * n:
        tries += 1
        name = _pick_op(rng, kind, mode, allow)
        p = OPS[name]["gen"](rng, kind, shape, mode)
        if p is None:
            continue
        if name == "residual":
            p["body"], _, _ = gen_chain(rng, kind, shape, ctx, rng.randint(1, 3), "same", depth + 1)
            if not p["body"]:
                continue
        elif name == "concat":
            p["branches"] = [gen_chain(rng, kind, shape, ctx, rng.randint(1, 2), "chan", depth + 1)[0]
                             for _ in range(rng.randint(2, 3))]
            if not all(p["branches"]):
                continue
        try:
            _, k2, s2 = build_layer(p, kind, shape, ctx)
        except InvalidSpec:
            continue
        if mode == "same" and (k2 != kind or s2 != tuple(shape)):
            continue
        if mode == "chan":
            cd = CHANNEL_DIM[kind] % len(shape)
            if k2 != kind or len(s2) != len(shape) or any(a != b for i, (a, b) in enumerate(zip(s2, shape)) if i != cd):
                continue
        layers.append(p)
        kind, shape = k2, s2
    return layers, kind, tuple(shape)


def _gen_head(rng, kind, shape):
    C = _classes(kind, shape)
    choices = ["none", "mse", "mse", "l1", "smooth_l1", "huber", "bce", "ce", "ce", "ce", "nll", "soft_ce", "kl"]
    op_ = rng.choice(choices)
    p = {"op": op_}
    if op_ == "none":
        return p
    p["reduction"] = rng.choice(["mean", "mean", "sum"])
    p["return_output"] = rng.random() < 0.2
    if op_ == "smooth_l1":
        p["beta"] = rng.choice([1.0, 0.5, 0.0])
    if op_ == "huber":
        p["delta"] = rng.choice([1.0, 0.5, 2.0])
    if op_ in ("ce", "nll", "soft_ce", "kl") and kind == "seq":
        p["flat"] = rng.random() < 0.7
    if op_ in ("ce", "nll"):
        p["ignore_index"] = rng.choice([-100, -100, 0, C - 1])
        p["class_weight"] = rng.random() < 0.3
        if C < 2 and p["ignore_index"] >= 0:
            p["ignore_index"] = -100
    if op_ in ("ce", "soft_ce"):
        p["label_smoothing"] = rng.choice([0.0, 0.0, 0.1])
    if op_ == "kl":
        p["reduction"] = rng.choice(["batchmean", "sum", "mean"])
        p["log_target"] = rng.random() < 0.3
    if op_ == "bce":
        p["pos_weight"] = rng.random() < 0.3
    return p


def _gen_input(rng):
    kind = rng.choices(["img2", "img1", "seq", "vec", "tok"], [4, 2, 2, 1, 2])[0]
    B = rng.choice([1, 2, 2, 3, 4])
    if kind == "img2":
        shape = [B, rng.randint(1, 6), rng.randint(1, 11), rng.randint(1, 11)]
    elif kind == "img1":
        shape = [B, rng.randint(1, 6), rng.randint(1, 16)]
    elif kind == "seq":
        shape = [B, rng.randint(1, 9), rng.choice([1, 2, 3, 4, 6, 8, 12])]
    elif kind == "vec":
        shape = [B, rng.randint(1, 16)]
    else:
        shape = [B, rng.randint(1, 9)]
        vocab = rng.randint(2, 20)
        return {"kind": "tok", "shape": shape, "grad": False,
                "embedding": {"vocab": vocab, "dim": rng.choice([2, 4, 6, 8]),
                              "padding_idx": rng.choice([None, 0, vocab - 1, -1]), "pos": rng.random() < 0.5}}
    return {"kind": kind, "shape": shape, "grad": rng.random() < 0.7}


CAPTURES = ("torchscript", "export")


def generate(seed):
    """A random spec for ``seed`` (the same spec for the same seed)."""
    rng = random.Random(seed)
    for _attempt in range(20):
        spec = {"seed": seed, "dtype": rng.choice(["float32", "float32", "float32", "float64"]),
                "capture": CAPTURES[seed % len(CAPTURES)], "steps": 2, "eval_after": rng.random() < 0.4,
                "input": _gen_input(rng)}
        torch.manual_seed(seed)
        ctx = {"gen": torch.Generator().manual_seed(seed + 1)}
        kind, shape = spec["input"]["kind"], tuple(spec["input"]["shape"])
        if kind == "tok":
            e = spec["input"]["embedding"]
            ctx["embedding"] = nn.Embedding(e["vocab"], e["dim"])
            kind, shape = "seq", (shape[0], shape[1], e["dim"])
        layers, kind, shape = gen_chain(rng, kind, shape, ctx, rng.randint(1, 6))
        spec["layers"] = layers
        spec["head"] = _gen_head(rng, kind, shape)
        try:
            build(spec)
        except InvalidSpec:
            continue
        return spec
    raise RuntimeError(f"seed {seed}: no buildable spec in 20 draws")


def describe(spec):
    """One line: the layers' ops, nested blocks in brackets."""
    def chain(layers):
        out = []
        for p in layers:
            if p["op"] == "residual":
                out.append(f"residual[{chain(p['body'])}]")
            elif p["op"] == "concat":
                out.append("concat[" + " | ".join(chain(b) for b in p["branches"]) + "]")
            elif p["op"] == "act":
                out.append(p["fn"])
            else:
                out.append(p["op"])
        return " ".join(out)
    inp = spec["input"]
    return (f"{spec['dtype']} {spec['capture']} {inp['kind']}{tuple(inp['shape'])} {chain(spec['layers'])} "
            f"-> {spec['head']['op']}")


def dumps(spec):
    return json.dumps(spec, sort_keys=True)
