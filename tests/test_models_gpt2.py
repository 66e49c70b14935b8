"""GPT-2 (transformers GPT2LMHeadModel, tiny config) trains through the engine.

Called as users call it: input_ids, attention_mask (with padding) and labels; the loss
comes from the model's own output (a CausalLMOutputWithCrossAttentions, rebuilt by
ORTModule in the same structure). Parity with eager over 10 SGD steps; a second test
trains with dropout > 0.
"""
import pytest
import torch

from modelparity import call_or_xfail, train_parity, train_with_dropout

transformers = pytest.importorskip("transformers")

VOCAB, T, B = 256, 16, 4


def make_gpt2(p=0.0):
    cfg = transformers.GPT2Config(
        n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=64,
        resid_pdrop=p, embd_pdrop=p, attn_pdrop=p,
        bos_token_id=0, eos_token_id=0, use_cache=False)
    return transformers.GPT2LMHeadModel(cfg)


def make_batches(n=3, seed=7):
    g = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(n):
        ids = torch.randint(0, VOCAB, (B, T), generator=g)
        mask = torch.ones(B, T, dtype=torch.long)
        mask[1, T - 5:] = 0                 # right padding in two rows
        mask[3, T - 2:] = 0
        labels = ids.masked_fill(mask == 0, -100)
        batches.append({"input_ids": ids, "attention_mask": mask, "labels": labels})
    return batches


def lm_loss(model, batch):
    return model(**batch).loss


def test_gpt2_parity_10_steps():
    train_parity(make_gpt2, make_batches(), lm_loss)


def test_gpt2_output_structure():
    from ortmod import ORTModule
    torch.manual_seed(0)
    model = ORTModule(make_gpt2())
    batch = make_batches(1)[0]
    out = call_or_xfail(lambda: model(**batch))
    assert type(out).__name__ == "CausalLMOutputWithCrossAttentions"
    assert out.logits.shape == (B, T, VOCAB) and out.loss.dim() == 0
    assert out["loss"] is out.loss and out[0] is out.loss
    assert out.loss.requires_grad


def test_gpt2_trains_with_dropout():
    train_with_dropout(lambda: make_gpt2(0.1), make_batches(), lm_loss)


def test_gpt2_without_attention_mask():
    """Without attention_mask transformers derives one from position ids (torch.diff —
    which ortmod exports itself, the exporter has no symbolic — and CumSum)."""
    from ortmod import ORTModule
    from modelparity import assert_close
    torch.manual_seed(0)
    eager = make_gpt2()
    model = ORTModule(make_gpt2())
    model.load_state_dict(eager.state_dict())
    ids = make_batches(1)[0]["input_ids"]
    out = call_or_xfail(lambda: model(input_ids=ids, labels=ids))
    assert_close("loss", out.loss, eager(input_ids=ids, labels=ids).loss)
