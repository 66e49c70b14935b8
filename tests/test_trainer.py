"""Where users train: the Hugging Face Trainer and Accelerate over ORTModule(model), as they come.

The real ``transformers.Trainer`` with its default arguments (AdamW, linear schedule, column
removal by the forward's signature, safetensors checkpoints) trains a tiny GPT-2 wrapped in
ORTModule, evaluates it, saves checkpoints, resumes from one and is reloaded with
``from_pretrained``; each against the same run over the eager model. Dropout is off in the
config: the engine draws its own masks, so with dropout the runs differ by design.

Tolerances: losses are compared closely (1e-5 relative: float32 rounding of a different
summation order). Weights after AdamW only to what Adam allows: Adam divides each gradient by
its own running magnitude, so a rounding difference in a gradient that is itself near rounding
level becomes a difference of a whole step (lr) in that weight; the test bounds the difference
relative to the total update. A second run with ``optim="sgd"`` holds the weights to 1e-6 of
their size, as SGD passes gradient differences through at lr scale.
"""
import copy
import inspect
import json
import os

import pytest
import torch

transformers = pytest.importorskip("transformers")
accelerate = pytest.importorskip("accelerate")

from ortmod import ORTModule  # noqa: E402

VOCAB, SEQ = 64, 16


def tiny_config():
    return transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=32,
                                   resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                   bos_token_id=0, eos_token_id=0)


def tiny_gpt2(seed=0):
    torch.manual_seed(seed)
    return transformers.GPT2LMHeadModel(tiny_config())


def dataset(n=32, seed=1):
    """Examples as a user's dataset has them, with a column the model does not take ("idx"): the
    Trainer keeps only the columns that the forward's signature names, so with ORTModule's old
    ``(*args, **kwargs)`` it dropped every one ("The batch received was empty")."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        ids = torch.randint(0, VOCAB, (SEQ,), generator=g)
        out.append({"input_ids": ids, "attention_mask": torch.ones(SEQ, dtype=torch.long),
                    "labels": ids.clone(), "idx": i})
    return out


class RecordingTrainer(transformers.Trainer):
    """The Trainer, recording each training step's loss at full precision (its log rounds it)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.step_losses = []

    def training_step(self, *args, **kwargs):
        loss = super().training_step(*args, **kwargs)
        self.step_losses.append(float(loss))
        return loss


def make_trainer(model, output_dir, **overrides):
    # the defaults but for where it writes, how long it runs, that it runs on the CPU and logs
    # nowhere: AdamW, lr 5e-5, linear decay, remove_unused_columns, safetensors checkpoints
    args = transformers.TrainingArguments(output_dir=str(output_dir), max_steps=6, save_steps=3,
                                          per_device_train_batch_size=4, per_device_eval_batch_size=4,
                                          logging_steps=1, use_cpu=True, report_to="none",
                                          disable_tqdm=True, **overrides)
    data = dataset()
    return RecordingTrainer(model=model, args=args, train_dataset=data, eval_dataset=data[:8])


def rel(a, b):
    """||a - b|| / ||b|| over two state dicts' common float tensors."""
    num = sum(float((a[k].double() - b[k].double()).pow(2).sum()) for k in b)
    den = sum(float(b[k].double().pow(2).sum()) for k in b)
    return (num / max(den, 1e-30)) ** 0.5


def ratio(a, b):
    """||a|| / ||b|| over two state dicts' tensors (a difference against an update, ...)."""
    num = sum(float(a[k].double().pow(2).sum()) for k in b)
    den = sum(float(b[k].double().pow(2).sum()) for k in b)
    return (num / max(den, 1e-30)) ** 0.5


def floats(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items() if v.is_floating_point()}


def run(tmp_path, name, ort, resume=None, seed=0, **overrides):
    inner = tiny_gpt2(seed)
    model = ORTModule(inner) if ort else inner
    trainer = make_trainer(model, tmp_path / name, **overrides)
    trainer.train(resume_from_checkpoint=resume)
    metrics = trainer.evaluate()
    trainer.save_model(str(tmp_path / name / "final"))
    return {"trainer": trainer, "model": model, "inner": inner, "losses": trainer.step_losses,
            "eval_loss": metrics["eval_loss"], "weights": floats(inner)}


def test_forward_signature_and_attributes_are_the_models():
    inner = tiny_gpt2()
    model = ORTModule(inner)
    assert inspect.signature(model.forward) == inspect.signature(inner.forward)
    assert model.forward.__wrapped__ == inner.forward
    assert model.forward.__doc__ == inner.forward.__doc__
    # the Trainer's and Accelerate's type checks see the model; ORTModule is still what it is
    assert isinstance(model, transformers.GPT2LMHeadModel) and isinstance(model, transformers.PreTrainedModel)
    assert isinstance(model, ORTModule) and type(model) is ORTModule
    assert repr(model).startswith("ORTModule(")
    assert model.config is inner.config
    assert model._keys_to_ignore_on_save == inner._keys_to_ignore_on_save
    assert model.num_parameters() == inner.num_parameters()
    assert model.can_generate() and model.main_input_name == "input_ids"
    # its own nn.Module API and keys are unchanged: the model's keys, the model's tensors
    assert list(model.state_dict()) == list(inner.state_dict())
    assert [id(p) for p in model.parameters()] == [id(p) for p in inner.parameters()]
    # transformers' and Accelerate's unwrapping. Accelerate unwraps the classes it knows (DDP,
    # DeepSpeed's engine, FSDP, torch.compile's) by isinstance: it hands ORTModule back, which is
    # an instance of the model's class and answers for it; the recursive unwrap follows .module
    from transformers.modeling_utils import unwrap_model
    assert unwrap_model(model, recursive=True) is inner
    assert isinstance(unwrap_model(model), transformers.GPT2LMHeadModel)
    # pickle and deepcopy rebuild an ORTModule (pickle checks the class it rebuilds against
    # __class__, which ORTModule reports as the model's)
    import pickle
    for clone in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert type(clone) is ORTModule and type(clone.module) is transformers.GPT2LMHeadModel
        assert list(clone.state_dict()) == list(inner.state_dict())


def test_forward_called_through_its_func_still_runs_the_engine():
    """A library that rebinds forward.__func__ (Accelerate's mixed-precision output cast does)
    gets ORTModule's forward, not the model's eager one."""
    import types
    model = ORTModule(tiny_gpt2())
    ids = dataset(4)[0]["input_ids"][None]
    rebound = types.MethodType(model.forward.__func__, model)
    out = rebound(input_ids=ids, labels=ids)
    assert model._ortmod_export_count == 1
    ref = model.module(input_ids=ids, labels=ids)
    torch.testing.assert_close(out.loss, ref.loss, rtol=1e-5, atol=0)


def test_trainer_default_arguments_train_evaluate_save_resume_reload(tmp_path):
    eager = run(tmp_path, "eager", ort=False)
    ort = run(tmp_path, "ort", ort=True)
    # one training export and one evaluation export, then the cache (num_items_in_batch, which
    # the Trainer passes to a model whose forward takes **kwargs, is a tensor: no re-export)
    assert ort["model"]._ortmod_export_count == 2 and ort["model"]._ortmod_fallback is None
    assert len(ort["losses"]) == 6
    torch.testing.assert_close(torch.tensor(ort["losses"]), torch.tensor(eager["losses"]), rtol=1e-5, atol=0)
    assert ort["eval_loss"] == pytest.approx(eager["eval_loss"], rel=1e-5)
    init = floats(tiny_gpt2(0))
    update = {k: eager["weights"][k] - init[k] for k in init}
    diff = {k: ort["weights"][k] - eager["weights"][k] for k in init}
    # Adam's noise amplification (module docstring): within a small part of the whole update
    assert ratio(diff, update) < 1e-3, ratio(diff, update)

    # checkpoints were written by the model's own save_pretrained: the tied lm_head/wte pair
    # saved once (safetensors refuses two tensors sharing memory), config.json beside it
    ckpt = tmp_path / "ort" / "checkpoint-3"
    assert {"model.safetensors", "config.json", "optimizer.pt", "scheduler.pt"} <= set(os.listdir(ckpt))

    # resume from step 3 into a fresh ORTModule whose model starts elsewhere: the checkpoint's
    # weights, optimizer and schedule are loaded, steps 4-6 give the uninterrupted run's losses
    # and weights
    resumed = run(tmp_path, "ort", ort=True, resume=str(ckpt), seed=7)
    assert len(resumed["losses"]) == 3
    torch.testing.assert_close(torch.tensor(resumed["losses"]), torch.tensor(ort["losses"][3:]), rtol=1e-6, atol=0)
    for k in ort["weights"]:
        torch.testing.assert_close(resumed["weights"][k], ort["weights"][k], rtol=1e-6, atol=1e-9)

    # reload what Trainer.save_model wrote: the trained weights exactly, tied again, and the
    # reloaded model generates what the trained one generates
    reloaded = transformers.GPT2LMHeadModel.from_pretrained(str(tmp_path / "ort" / "final"))
    for k, v in floats(reloaded).items():
        assert torch.equal(v, resumed["weights"][k]), k
    assert reloaded.lm_head.weight.data_ptr() == reloaded.transformer.wte.weight.data_ptr()
    prompt = dataset(1)[0]["input_ids"][None, :4]
    kwargs = dict(max_new_tokens=4, do_sample=False, pad_token_id=0)
    model = resumed["model"].eval()
    assert torch.equal(model.generate(prompt, **kwargs), reloaded.generate(prompt, **kwargs))
    with open(tmp_path / "ort" / "final" / "config.json") as f:
        assert json.load(f)["n_embd"] == 32


def test_trainer_sgd_weights_match_eager(tmp_path):
    """optim="sgd": SGD passes the gradients' rounding differences through at lr scale, so the
    weights after 6 steps are held to 1e-6 of their size (AdamW's test cannot be this tight)."""
    eager = run(tmp_path, "eager", ort=False, optim="sgd", learning_rate=0.5)
    ort = run(tmp_path, "ort", ort=True, optim="sgd", learning_rate=0.5)
    torch.testing.assert_close(torch.tensor(ort["losses"]), torch.tensor(eager["losses"]), rtol=1e-5, atol=0)
    init = floats(tiny_gpt2(0))
    assert ratio({k: eager["weights"][k] - init[k] for k in init}, init) > 1e-3   # the weights moved
    assert rel(ort["weights"], eager["weights"]) < 1e-6, rel(ort["weights"], eager["weights"])


def test_accelerate_prepare_backward_unwrap_save_reload(tmp_path):
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    def train(ort):
        inner = tiny_gpt2()
        model = ORTModule(inner) if ort else inner
        accelerator = Accelerator(cpu=True)
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        model, opt = accelerator.prepare(model, opt)
        losses = []
        for i in range(0, 16, 4):
            batch = {k: torch.stack([ex[k] for ex in dataset()[i:i + 4]]) for k in ("input_ids", "labels")}
            loss = model(**batch).loss
            accelerator.backward(loss)
            opt.step()
            opt.zero_grad()
            losses.append(float(loss))
        return accelerator, model, inner, losses

    try:
        _, _, eager_inner, eager_losses = train(ort=False)
        AcceleratorState._reset_state(True)
        accelerator, model, inner, losses = train(ort=True)
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(eager_losses), rtol=1e-5, atol=0)
        assert rel(floats(inner), floats(eager_inner)) < 1e-6
        unwrapped = accelerator.unwrap_model(model)
        assert isinstance(unwrapped, transformers.GPT2LMHeadModel)
        assert unwrapped.module is inner and unwrapped.config is inner.config
        # save_model writes the state dict (aliases dropped for safetensors); the config as a
        # user saves it, through what unwrap_model returned
        out = tmp_path / "acc"
        accelerator.save_model(model, str(out))
        unwrapped.config.save_pretrained(str(out))
        reloaded = transformers.GPT2LMHeadModel.from_pretrained(str(out))
        mine, theirs = floats(inner), floats(reloaded)
        assert set(mine) == set(theirs)
        for k in mine:
            assert torch.equal(mine[k], theirs[k]), k
        # and save_pretrained through the unwrapped model, as the Trainer and users do
        unwrapped.save_pretrained(str(tmp_path / "sp"))
        again = transformers.GPT2LMHeadModel.from_pretrained(str(tmp_path / "sp"))
        for k, v in floats(again).items():
            assert torch.equal(v, mine[k]), k
    finally:
        AcceleratorState._reset_state(True)


def test_gradient_checkpointing_enable_reaches_the_model():
    """gradient_checkpointing_enable (the Trainer's switch) turns checkpointing on in the wrapped
    model; on the torch.export path the export follows it and the step matches eager's."""
    import ortmod
    eager = tiny_gpt2()
    model = ORTModule(copy.deepcopy(eager), ortmod.DebugOptions(capture="export"))
    for m in (model, eager):
        m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    assert model.module.is_activation_checkpointing
    ids = dataset(4)[0]["input_ids"][None].repeat(2, 1)
    losses = []
    for m in (model, eager):
        loss = m(input_ids=ids, labels=ids).loss
        loss.backward()
        losses.append(float(loss))
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)
    for (name, p), q in zip(model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=name)
