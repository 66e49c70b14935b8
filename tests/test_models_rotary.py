"""Today's open LLM families (rotary position embeddings: Sin/Cos, grouped-query attention,
RMSNorm, SiLU-gated MLPs) train through ORTModule with eager parity: tiny random-weight
configurations from transformers, right padding in the batch, changing sequence lengths."""
import pytest
import torch

from modelparity import train_parity, train_with_dropout

transformers = pytest.importorskip("transformers")

VOCAB = 64


def _common():
    return dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, max_position_embeddings=64, use_cache=False)


FAMILIES = {
    "llama": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(num_key_value_heads=2, **_common())),
    "mistral": lambda: transformers.MistralForCausalLM(transformers.MistralConfig(num_key_value_heads=2, **_common())),
    "qwen2": lambda: transformers.Qwen2ForCausalLM(transformers.Qwen2Config(num_key_value_heads=2, **_common())),
    "phi": lambda: transformers.PhiForCausalLM(transformers.PhiConfig(**_common())),
    "gemma": lambda: transformers.GemmaForCausalLM(
        transformers.GemmaConfig(num_key_value_heads=2, head_dim=8, **_common())),
    "gpt-neox": lambda: transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(**_common())),
    "falcon": lambda: transformers.FalconForCausalLM(transformers.FalconConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, use_cache=False)),
}


def make_batches(seed=11):
    g = torch.Generator().manual_seed(seed)
    batches = []
    for T in (12, 12, 9):
        ids = torch.randint(0, VOCAB, (3, T), generator=g)
        mask = torch.ones(3, T, dtype=torch.long)
        mask[1, T - 4:] = 0                  # right padding
        batches.append({"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)})
    return batches


def lm_loss(model, batch):
    return model(**batch).loss


@pytest.mark.parametrize("family", list(FAMILIES))
def test_rotary_family_parity(family):
    train_parity(FAMILIES[family], make_batches(), lm_loss, steps=10, lr=0.05)


def test_llama_trains_with_dropout():
    def make():
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(num_key_value_heads=2, attention_dropout=0.1,
                                                                      **_common()))
    train_with_dropout(make, make_batches(), lm_loss)
