"""Outputs that are plain Python objects holding tensors come back rebuilt (ortmod/capture/torchscript.py,
expand_objects): transformers models called as their docs show, with the default use_cache=True,
return a DynamicCache whose keys and values are the engine's."""
import copy
import warnings

import pytest
import torch
import torch.nn as nn

from ortmod import ORTModule
from test_semantics import rel_close


class Box:
    """No pytree node: a user's own result object."""

    def __init__(self, a, b, note):
        self.a, self.b, self.note = a, b, note


class ReturnsBox(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(4, 4)

    def forward(self, x):
        h = self.l(x)
        return {"loss": h.pow(2).mean(), "box": Box(h, [h * 2, {"k": h.sum(0)}], note="kept")}


def test_plain_object_output_is_rebuilt():
    torch.manual_seed(0)
    m = ReturnsBox()
    o = ORTModule(copy.deepcopy(m))
    for n in (3, 5):
        x = torch.randn(n, 4)
        ye, yo = m(x), o(x)
        assert type(yo["box"]) is Box and yo["box"].note == "kept"
        rel_close("a", yo["box"].a, ye["box"].a)
        rel_close("b[0]", yo["box"].b[0], ye["box"].b[0])
        rel_close("b[1].k", yo["box"].b[1]["k"], ye["box"].b[1]["k"])
        assert yo["box"] is not o(x)["box"]          # a new object per call
        ye["loss"].backward(); yo["loss"].backward()
        rel_close("grad", o._original_module.l.weight.grad, m.l.weight.grad)
        m.zero_grad(); o.zero_grad()


class Counter:
    """Like transformers' DynamicSlidingWindowLayer: tensors and an int grown by a size."""

    def __init__(self):
        self.seen, self.keys = 0, None

    def update(self, k):
        self.seen += k.shape[-2]      # jit tracing returns the size as a 0-d tensor
        self.keys = k
        return k


class ReturnsCounter(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(4, 4)

    def forward(self, x):
        c = Counter()
        h = c.update(self.l(x))
        return h.sum(), c


def test_number_attribute_traced_as_a_tensor_comes_back_as_eagers_number():
    """The trace makes Counter.seen a tensor where eager keeps an int: the output gives eager's
    int back, and a guard on the traced value exports again when the length changes."""
    torch.manual_seed(0)
    m = ReturnsCounter()
    o = ORTModule(copy.deepcopy(m))
    for n in (3, 3, 5):
        x = torch.randn(2, n, 4)
        (le, ce), (lo, co) = m(x), o(x)
        assert type(co.seen) is int and co.seen == ce.seen == n
        rel_close("keys", co.keys, ce.keys)
        rel_close("loss", lo, le)
    assert o._ortmod_export_count == 2


class ReturnsSizes(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(4, 4)

    def forward(self, x):
        n = x.shape[0]
        return self.l(x).sum(), n, {"half": n / 2, "big": n > 4}


def test_numbers_from_sizes_are_returned_as_eagers_numbers():
    """A number computed from a size is returned as eager's int, float or bool: the TorchScript trace
    makes it a 0-d tensor, torch.export a symbolic number; each is guarded, so another size gives its
    own number (a new export), never the first one's."""
    torch.manual_seed(0)
    m = ReturnsSizes()
    o = ORTModule(copy.deepcopy(m))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")       # a size that changes a guarded number says so
        for n in (3, 3, 5, 7):
            x = torch.randn(n, 4)
            (le, ne, de), (lo, no, do) = m(x), o(x)
            assert type(no) is int and no == ne == n
            assert {k: type(v) for k, v in do.items()} == {"half": float, "big": bool} and do == de
            rel_close("loss", lo, le)


@pytest.mark.parametrize("family", ["gpt2", "llama", "mistral"])
def test_transformers_default_call_returns_its_cache(family):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    if family == "gpt2":
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
            n_layer=2, n_embd=32, n_head=2, vocab_size=50, n_positions=32, resid_pdrop=0, embd_pdrop=0, attn_pdrop=0))
    else:
        make, config = {"llama": (transformers.LlamaForCausalLM, transformers.LlamaConfig),
                        "mistral": (transformers.MistralForCausalLM, transformers.MistralConfig)}[family]
        model = make(config(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32))
    assert model.config.use_cache            # the default: the model returns its cache
    ort = ORTModule(copy.deepcopy(model))
    ids = torch.randint(0, 50, (2, 9))
    out_e, out_o = model(input_ids=ids, labels=ids), ort(input_ids=ids, labels=ids)
    rel_close("loss", out_o.loss, out_e.loss)
    ce, co = out_e.past_key_values, out_o.past_key_values
    assert type(co) is type(ce) and len(co.layers) == len(ce.layers)
    for i, (le, lo) in enumerate(zip(ce.layers, co.layers)):
        rel_close(f"layer {i} keys", lo.keys, le.keys)
        rel_close(f"layer {i} values", lo.values, le.values)
        for k, v in vars(le).items():    # the numbers a layer keeps (Mistral's cumulative_length)
            if isinstance(v, (bool, int, float)):
                assert type(vars(lo)[k]) is type(v) and vars(lo)[k] == v, (i, k)
    assert co.get_seq_length() == ce.get_seq_length() == 9
    out_e.loss.backward(); out_o.loss.backward()
    for (n, pe), (_, po) in zip(model.named_parameters(), ort.named_parameters()):
        rel_close(f"grad of {n}", po.grad, pe.grad, rtol=1e-3)


def test_object_holding_tensors_as_an_input_is_refused():
    import ortmod

    class TakesBox(nn.Module):
        def forward(self, x, box):
            return x * box.a
    box = Box(torch.ones(3), None, "n")
    with pytest.raises(ortmod.UnsupportedDataError, match="Box holding tensors"):
        ORTModule(TakesBox())(torch.randn(3), box)
