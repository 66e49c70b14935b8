"""Slice and index assignment (ScatterND in the export) and the encoder-decoder models whose
label shift needs it: T5 and BART from transformers, tiny random-weight configs, called with
``labels=`` as their docs show (the models shift the labels into decoder inputs with
``shifted[:, 1:] = labels[:, :-1].clone(); shifted[:, 0] = start``). SGD parity with eager
(tests/modelparity.py), and the exports checked to hold the ScatterND they train through.
"""
import os

import pytest
import torch

from modelparity import train_parity

transformers = pytest.importorskip("transformers")

V = 64


class SliceAssign(torch.nn.Module):
    """Float slice and index assignment with gradients through both sides: x[:, 1:] = f(x)[:, :-1],
    x[:, 0] = a parameter row, x[idx] = g(x[idx]) with idx a tensor input (no duplicates), and
    index_put_ with accumulate (duplicates sum)."""

    def __init__(self):
        super().__init__()
        self.inp = torch.nn.Linear(6, 8)
        self.start = torch.nn.Parameter(torch.randn(8))
        self.mix = torch.nn.Linear(8, 8)
        self.out = torch.nn.Linear(8, 3)

    def forward(self, x, idx, acc_idx, y):
        h = self.inp(x)                                  # (B, T, 8)
        s = torch.zeros_like(h)
        s[:, 1:] = torch.tanh(h[:, :-1])
        s[:, 0] = self.start
        r = s.clone()
        r[idx] = self.mix(s[idx])                        # rows of the batch
        r = r.index_put((acc_idx,), self.mix(s[:2]), accumulate=True)
        logits = self.out(r + h).mean(1)
        return torch.nn.functional.cross_entropy(logits, y)


def _exported(model_dir):
    import onnx
    return onnx.load(next(os.path.join(model_dir, f) for f in os.listdir(model_dir) if "torch_exported_training" in f))


def test_slice_and_index_assignment_parity(tmp_path):
    g = torch.Generator().manual_seed(5)
    batches = [(torch.randn(4, 5, 6, generator=g), torch.randperm(4, generator=g)[:3],
                torch.tensor([1, 1]) if i else torch.tensor([2, 0]), torch.randint(0, 3, (4,), generator=g))
               for i in range(3)]
    train_parity(SliceAssign, batches, lambda m, b: m(*b), steps=4)
    # the export holds the ScatterNDs this trained through (and one with reduction add)
    from ortmod import DebugOptions, ORTModule
    torch.manual_seed(0)
    m = ORTModule(SliceAssign(), DebugOptions(save_onnx=True, onnx_prefix="sa", save_path=str(tmp_path)))
    m(*batches[0]).backward()
    nodes = [n for n in _exported(str(tmp_path)).graph.node if n.op_type == "ScatterND"]
    assert len(nodes) >= 3
    assert any(a.name == "reduction" and a.s == b"add" for n in nodes for a in n.attribute)


def make_t5():
    cfg = transformers.T5Config(vocab_size=V, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2,
                                num_heads=4, dropout_rate=0.0, use_cache=False, decoder_start_token_id=0,
                                pad_token_id=0, eos_token_id=1)
    return transformers.T5ForConditionalGeneration(cfg)


def make_bart():
    cfg = transformers.BartConfig(vocab_size=V, d_model=32, encoder_layers=2, decoder_layers=2,
                                  encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                                  decoder_ffn_dim=64, max_position_embeddings=64, dropout=0.0, attention_dropout=0.0,
                                  activation_dropout=0.0, use_cache=False, pad_token_id=1, bos_token_id=0,
                                  eos_token_id=2, decoder_start_token_id=2)
    return transformers.BartForConditionalGeneration(cfg)


def make_batches(n=3, seed=3, B=3, S=7, T=5):
    g = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(n):
        ids = torch.randint(3, V, (B, S), generator=g)
        mask = torch.ones(B, S, dtype=torch.long)
        mask[1, S - 2:] = 0                       # right padding in one row
        labels = torch.randint(3, V, (B, T), generator=g)
        labels[2, T - 1] = -100                   # an ignored label: shifted in as the pad token
        batches.append({"input_ids": ids, "attention_mask": mask, "labels": labels})
    return batches


def seq2seq_loss(model, batch):
    return model(**batch).loss


@pytest.mark.parametrize("make", [make_t5, make_bart], ids=["t5", "bart"])
def test_seq2seq_parity(make, tmp_path):
    train_parity(make, make_batches(), seq2seq_loss, steps=4)
    from ortmod import DebugOptions, ORTModule
    torch.manual_seed(0)
    m = ORTModule(make(), DebugOptions(save_onnx=True, onnx_prefix="s2s", save_path=str(tmp_path)))
    m(**make_batches(1)[0]).loss.backward()
    assert "ScatterND" in {n.op_type for n in _exported(str(tmp_path)).graph.node}
