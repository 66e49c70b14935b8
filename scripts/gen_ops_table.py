#!/usr/bin/env python
"""Regenerate docs/models.md's supported-ops and model-families tables from the engine's op table.

    python scripts/gen_ops_table.py          # rewrite docs/models.md in place
    python scripts/gen_ops_table.py --check  # exit 1 if docs/models.md is out of date

The op list comes from the built extension (``ortmod._C.op_table()``: name, domain,
whether the op has a gradient rule), in table order; which family file defines each op
comes from csrc/ops/op_list.h (the X-macro list, in the same order) and the family
files themselves. Nothing here is typed by hand except MODEL_FAMILIES below: the ONNX ops
each tested model family's export uses (torch 2.13 TorchScript exporter, opset 20); its
status is computed against the op table. The model-zoo table comes from ``ZOO`` in
tests/test_model_zoo.py (read as data, nothing imported): each architecture's ONNX ops (which
its test checks against the export), its known bug or the aten op torch's exporter cannot
convert; the status is computed the same way.

The tables live between ``<!-- ops-table:begin -->`` / ``<!-- ops-table:end -->``,
``<!-- model-families:begin -->`` / ``<!-- model-families:end -->`` and
``<!-- model-zoo:begin -->`` / ``<!-- model-zoo:end -->`` in docs/models.md.
"""
import argparse
import ast
import glob
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TABLES = os.path.join(ROOT, "docs", "models.md")   # the tables moved here from README.md (issue 36)
OPS_DIR = os.path.join(ROOT, "csrc", "ops")

# (family, how it is called, test file, ONNX ops its training-mode export uses)
MODEL_FAMILIES = [
    ("MLP (Linear, GELU, LayerNorm, ReLU, Dropout, cross-entropy)", "`model(x, y)`",
     "tests/test_mlp_parity.py",
     ["Dropout", "Gelu", "Gemm", "LayerNormalization", "Relu", "SoftmaxCrossEntropyLoss"]),
    ("GPT-2 (`transformers.GPT2LMHeadModel`)", "`input_ids`, `attention_mask`, `labels`",
     "tests/test_models_gpt2.py",
     ["Add", "And", "Cast", "Concat", "Constant", "ConstantOfShape", "Dropout", "Equal", "Expand",
      "Flatten", "Gather", "Gemm", "IsNaN", "LayerNormalization", "LessOrEqual", "MatMul", "Mul",
      "Pad", "Pow", "Range", "Reshape", "Shape", "Slice", "Softmax", "SoftmaxCrossEntropyLoss",
      "Split", "Sqrt", "Squeeze", "Sub", "Tanh", "Transpose", "Unsqueeze", "Where"]),
    ("GPT-2 without `attention_mask`", "`input_ids`, `labels`",
     "tests/test_models_gpt2.py",
     ["Add", "And", "Cast", "Concat", "Constant", "ConstantOfShape", "CumSum", "Dropout", "Equal",
      "Expand", "Flatten", "Gather", "Gemm", "IsNaN", "LayerNormalization", "LessOrEqual", "MatMul",
      "Mul", "Not", "Pad", "Pow", "Range", "Reshape", "Shape", "Slice", "Softmax",
      "SoftmaxCrossEntropyLoss", "Split", "Sqrt", "Squeeze", "Sub", "Tanh", "Transpose",
      "Unsqueeze", "Where"]),
    ("BERT classifier (`transformers.BertForSequenceClassification`)",
     "`input_ids`, `token_type_ids`, `attention_mask`, `labels`", "tests/test_models_bert.py",
     ["Add", "And", "Cast", "Concat", "Constant", "ConstantOfShape", "Dropout", "Equal", "Expand",
      "Flatten", "Gather", "Gelu", "Gemm", "GreaterOrEqual", "IsNaN", "LayerNormalization", "MatMul",
      "Mul", "Range", "Reshape", "Shape", "Slice", "Softmax", "SoftmaxCrossEntropyLoss", "Sqrt",
      "Tanh", "Transpose", "Unsqueeze", "Where"]),
    ("BERT without `token_type_ids`", "`input_ids`, `attention_mask`, `labels`",
     "tests/test_models_bert.py",
     ["Add", "And", "Cast", "Concat", "Constant", "ConstantOfShape", "Dropout", "Equal", "Expand",
      "Flatten", "Gather", "GatherElements", "Gelu", "Gemm", "GreaterOrEqual", "IsNaN",
      "LayerNormalization", "MatMul", "Mul", "Range", "Reshape", "Shape", "Slice", "Softmax",
      "SoftmaxCrossEntropyLoss", "Sqrt", "Tanh", "Transpose", "Unsqueeze", "Where"]),
    ("ResNet-style CNN (Conv2d stride/padding/groups, BatchNorm2d, MaxPool2d, AdaptiveAvgPool2d)",
     "`model(x, y)`", "tests/test_models_cnn.py",
     ["Add", "BatchNormalization", "Constant", "Conv", "Dropout", "Flatten", "Gemm",
      "GlobalAveragePool", "MaxPool", "Relu", "SoftmaxCrossEntropyLoss"]),
    ("LSTM classifier (`nn.LSTM`, batch_first)", "`model(tokens, labels)`", "tests/test_models_rnn.py",
     ["Concat", "Constant", "ConstantOfShape", "Dropout", "Gather", "Gemm", "LSTM", "Shape", "Slice",
      "SoftmaxCrossEntropyLoss", "Squeeze", "Transpose", "Unsqueeze"]),
    ("GRU classifier (`nn.GRU`, batch_first)", "`model(tokens, labels)`", "tests/test_models_rnn.py",
     ["Concat", "Constant", "ConstantOfShape", "Dropout", "GRU", "Gather", "Gemm", "Shape", "Slice",
      "SoftmaxCrossEntropyLoss", "Squeeze", "Transpose", "Unsqueeze"]),
    ("RNN classifier (`nn.RNN`, tanh or relu, batch_first)", "`model(tokens, labels)`", "tests/test_models_rnn.py",
     ["Concat", "Constant", "ConstantOfShape", "Dropout", "Gather", "Gemm", "RNN", "Shape", "Slice",
      "SoftmaxCrossEntropyLoss", "Squeeze", "Transpose", "Unsqueeze"]),
    ("Llama, Mistral, Qwen2, Gemma (rotary embeddings, RMSNorm, grouped-query attention, SiLU MLP)",
     "`input_ids`, `attention_mask`, `labels`", "tests/test_models_rotary.py",
     ["Add", "And", "Cast", "Concat", "Constant", "ConstantOfShape", "Cos", "Div", "Equal",
      "Expand", "Flatten", "Gather", "Greater", "IsNaN", "LessOrEqual", "MatMul", "Mul", "Neg",
      "Pad", "Pow", "Range", "ReduceMean", "Reshape", "Shape", "Sigmoid", "Sin", "Slice",
      "Softmax", "SoftmaxCrossEntropyLoss", "Sqrt", "StopGradient", "Sub", "Transpose",
      "Unsqueeze", "Where"]),
    ("Phi, GPT-NeoX, Falcon (rotary embeddings, LayerNorm, GELU)", "`input_ids`, `attention_mask`, `labels`",
     "tests/test_models_rotary.py",
     ["Add", "And", "Cast", "Concat", "Constant", "ConstantOfShape", "Cos", "Div", "Dropout",
      "Equal", "Expand", "Flatten", "Gather", "Gelu", "Greater", "IsNaN", "LayerNormalization",
      "LessOrEqual", "MatMul", "Mul", "Neg", "Pad", "Pow", "Range", "Reshape", "Shape", "Sin",
      "Slice", "Softmax", "SoftmaxCrossEntropyLoss", "Sqrt", "StopGradient", "Sub", "Tanh",
      "Transpose", "Unsqueeze", "Where"]),
    ("T5 (`transformers.T5ForConditionalGeneration`)", "`input_ids`, `attention_mask`, `labels`",
     "tests/test_models_seq2seq.py",
     ["Abs", "Add", "And", "Cast", "Concat", "Constant", "ConstantOfShape", "Div", "Dropout",
      "Equal", "Expand", "Flatten", "Gather", "Greater", "GreaterOrEqual", "Less", "Log",
      "MatMul", "Min", "Mul", "Neg", "Pow", "Range", "ReduceMean", "Relu", "Reshape",
      "ScatterND", "Shape", "Slice", "Softmax", "SoftmaxCrossEntropyLoss", "Sqrt", "Squeeze",
      "StopGradient", "Sub", "Transpose", "Unsqueeze", "Where"]),
    ("BART (`transformers.BartForConditionalGeneration`)", "`input_ids`, `attention_mask`, `labels`",
     "tests/test_models_seq2seq.py",
     ["Add", "And", "Cast", "Concat", "Constant", "ConstantOfShape", "Dropout", "Equal",
      "Expand", "Flatten", "Gather", "Gelu", "Greater", "GreaterOrEqual", "IsNaN",
      "LayerNormalization", "LessOrEqual", "MatMul", "Mul", "Range", "Reshape", "ScatterND",
      "Shape", "Slice", "Softmax", "SoftmaxCrossEntropyLoss", "StopGradient", "Sub",
      "Transpose", "Unsqueeze", "Where"]),
]


ZOO_FILE = os.path.join(ROOT, "tests", "test_model_zoo.py")


def load_zoo():
    """tests/test_model_zoo.py's ZOO (a literal), read without importing the test file."""
    with open(ZOO_FILE) as f:
        tree = ast.parse(f.read(), ZOO_FILE)
    for node in tree.body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["ZOO"]:
            return ast.literal_eval(node.value)
    raise SystemExit(f"{ZOO_FILE} has no ZOO = {{...}} table")


def load_op_table():
    sys.path.insert(0, ROOT)
    from ortmod import _C
    return list(_C.op_table())


def table_symbols():
    """The op symbols of csrc/ops/op_list.h's X-macro list, in order."""
    with open(os.path.join(OPS_DIR, "op_list.h")) as f:
        text = f.read()
    text = text[text.index("#define OM_OP_LIST("):]   # past the header's worked example
    return re.findall(r"\b(?:HOST_)?OP\(\s*(om_op_\w+)\s*,", text)


def symbol_families():
    """symbol -> family file that defines it (ops/<family>.c)."""
    out = {}
    for path in sorted(glob.glob(os.path.join(OPS_DIR, "*.c"))):
        name = os.path.basename(path)
        if name == "op_table.c":
            continue
        with open(path) as f:
            text = f.read()
        # `const om_op_def sym = {...}` or a table macro `NAME(sym, "Op", ...)`
        for sym in re.findall(r"\bom_op_def\s+(om_op_\w+)\s*=", text):
            out.setdefault(sym, name)
        for sym in re.findall(r"^\s*[A-Z_][A-Z0-9_]*\(\s*(om_op_\w+)\s*,", text, re.M):
            out.setdefault(sym, name)
    return out


def ops_by_family(ops):
    syms = table_symbols()
    if len(syms) != len(ops):
        raise SystemExit(f"csrc/ops/op_list.h lists {len(syms)} ops, the built extension {len(ops)}: "
                         "rebuild it (make build) and run again")
    families = symbol_families()
    grouped = {}
    for sym, (name, domain, has_grad) in zip(syms, ops):
        family = families.get(sym, "?")
        grouped.setdefault(family, []).append((name, domain, has_grad))
    return grouped


def render_ops(ops):
    grouped = ops_by_family(ops)
    n_onnx = sum(1 for _, d, _ in ops if d == "")
    lines = [
        f"{n_onnx} ONNX ops and {len(ops) - n_onnx} internal ops (gradient and fused ops, domain "
        "`ortmod`; they also serve ORT's `com.microsoft` names), each with a shape/dtype rule "
        "and a CPU kernel. ONNX ops marked ° have no gradient rule: no gradient flows through "
        "them (comparisons, shapes, masks) — the engine says so by name if one is ever needed.",
        "",
        "| family (`csrc/ops/`) | ONNX ops | internal ops |",
        "|---|---|---|",
    ]
    for family in sorted(grouped):
        entries = grouped[family]
        onnx_ops = sorted(f"{n}°" if not g else n for n, d, g in entries if d == "")
        internal = sorted(n for n, d, _ in entries if d != "")
        lines.append(f"| `{family}` | {', '.join(onnx_ops) or '—'} | {', '.join(internal) or '—'} |")
    return "\n".join(lines)


def render_families(ops):
    have = {name for name, domain, _ in ops if domain in ("", "ortmod")}   # ortmod: what capture emits (StopGradient)
    lines = [
        "Each family is trained in its test for 10 optimizer steps through ORTModule and "
        "through eager PyTorch from identical weights (per-step losses and final parameters "
        "within rtol 1e-4 / atol 1e-5, fp32), and once more with dropout > 0. The status is "
        "computed from the ONNX ops the family's export uses and the op table.",
        "",
        "| model family | called with | status | test |",
        "|---|---|---|---|",
    ]
    for family, called, test, needed in MODEL_FAMILIES:
        missing = sorted(set(needed) - have)
        status = "trains on the engine" if not missing else "needs " + ", ".join(f"`{m}`" for m in missing)
        lines.append(f"| {family} | {called} | {status} | `{test}` |")
    return "\n".join(lines)


def render_zoo(ops, zoo=None):
    zoo = load_zoo() if zoo is None else zoo
    have = {name for name, domain, _ in ops if domain in ("", "ortmod")}
    lines = [
        "`tests/test_model_zoo.py`: one tiny random-weight model per architecture (hidden 32, 2 layers, "
        "4 heads, vocab 64, sequences of 12 with right padding, 3x32x32 images, dropout 0), called as "
        "documented (transformers' defaults, `use_cache` included), trained 4 SGD steps through "
        "ORTModule and eager from identical weights: step 0's gradients and whole output, every "
        "loss and the final parameters within rtol 1e-4 / atol 1e-5 elementwise or 2e-5 of the "
        "tensor's largest value (fp32); where fp32 eager and ORTModule still disagree, an fp64 "
        "eager run referees (ORTModule as close to it as eager). Two cases step differently, as "
        "their test says why: Wav2Vec2's summed CTC loss with lr 5e-4, MobileNetV2's chaotic fp32 "
        "training one step. The status is computed from the ONNX ops each export uses and the op "
        "table; a known failure says what it is.",
        "",
        "| architecture | called with | status |",
        "|---|---|---|",
    ]
    for entry in zoo.values():
        if entry["bug"]:
            status = "**xfail (known failure)**: " + entry["bug"]
        elif entry["exporter"]:
            status = f"torch's ONNX exporter cannot convert `{entry['exporter']}`"
        else:
            missing = sorted(set(entry["ops"]) - have)
            status = "trains on the engine" if not missing else "needs " + ", ".join(f"`{m}`" for m in missing)
        cells = (entry["family"], entry["called"], status)
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)


def replace_between(text, marker, body):
    begin, end = f"<!-- {marker}:begin -->", f"<!-- {marker}:end -->"
    i, j = text.find(begin), text.find(end)
    if i < 0 or j < i:
        raise SystemExit(f"docs/models.md has no {begin} ... {end} section")
    return text[:i + len(begin)] + "\n" + body + "\n" + text[j:]


def render(readme_text, ops=None):
    ops = load_op_table() if ops is None else ops
    text = replace_between(readme_text, "ops-table", render_ops(ops))
    text = replace_between(text, "model-families", render_families(ops))
    return replace_between(text, "model-zoo", render_zoo(ops))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if docs/models.md is out of date")
    args = ap.parse_args()
    with open(TABLES) as f:
        current = f.read()
    new = render(current)
    if args.check:
        if new != current:
            print("docs/models.md's generated tables are out of date: run python scripts/gen_ops_table.py")
            return 1
        return 0
    if new != current:
        with open(TABLES, "w") as f:
            f.write(new)
        print("docs/models.md updated")
    else:
        print("docs/models.md already up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
