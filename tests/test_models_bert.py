"""BERT classifier (transformers BertForSequenceClassification, tiny config) trains
through the engine: input_ids, token_type_ids, attention_mask (padded) and labels; the
loss from the model's SequenceClassifierOutput."""
import pytest
import torch

from modelparity import call_or_xfail, train_parity, train_with_dropout

transformers = pytest.importorskip("transformers")

VOCAB, T, B, LABELS = 256, 16, 4, 3


def make_bert(p=0.0):
    cfg = transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=128, max_position_embeddings=64, type_vocab_size=2,
        hidden_dropout_prob=p, attention_probs_dropout_prob=p, num_labels=LABELS)
    return transformers.BertForSequenceClassification(cfg)


def make_batches(n=3, seed=11):
    g = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(n):
        ids = torch.randint(0, VOCAB, (B, T), generator=g)
        types = torch.zeros(B, T, dtype=torch.long)
        types[:, T // 2:] = 1
        mask = torch.ones(B, T, dtype=torch.long)
        mask[0, T - 4:] = 0
        labels = torch.randint(0, LABELS, (B,), generator=g)
        batches.append({"input_ids": ids, "token_type_ids": types, "attention_mask": mask,
                        "labels": labels})
    return batches


def cls_loss(model, batch):
    return model(**batch).loss


def test_bert_parity_10_steps():
    train_parity(make_bert, make_batches(), cls_loss)


def test_bert_output_structure():
    from ortmod import ORTModule
    torch.manual_seed(0)
    model = ORTModule(make_bert())
    out = call_or_xfail(lambda: model(**make_batches(1)[0]))
    assert type(out).__name__ == "SequenceClassifierOutput"
    assert out.logits.shape == (B, LABELS) and out.loss.dim() == 0
    assert list(out.keys()) == ["loss", "logits"]


def test_bert_trains_with_dropout():
    train_with_dropout(lambda: make_bert(0.1), make_batches(), cls_loss)


def test_bert_without_token_type_ids():
    """Without token_type_ids BERT gathers them from a registered buffer (GatherElements)."""
    from ortmod import ORTModule
    from modelparity import assert_close
    torch.manual_seed(0)
    eager = make_bert()
    model = ORTModule(make_bert())
    model.load_state_dict(eager.state_dict())
    batch = {k: v for k, v in make_batches(1)[0].items() if k != "token_type_ids"}
    out = call_or_xfail(lambda: model(**batch))
    ref = eager(**batch)
    assert_close("loss", out.loss, ref.loss)
    out.loss.backward()
    ref.loss.backward()
    for (n, pe), po in zip(eager.named_parameters(), model.parameters()):
        assert_close(f"grad of {n}", po.grad, pe.grad)


def test_bert_without_token_type_ids():
    """Without token_type_ids BERT takes its buffered (all-zero) type ids with torch.gather:
    GatherElements on int64 in the export."""
    batches = [{k: v for k, v in b.items() if k != "token_type_ids"} for b in make_batches()]
    train_parity(make_bert, batches, cls_loss)
