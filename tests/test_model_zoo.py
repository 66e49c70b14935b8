"""Model zoo (issue 14): one tiny random-weight model per architecture, built locally from
``transformers`` and ``torch.nn`` (torchvision is not installed: its ResNet/MobileNetV2 come
from transformers), each called as its documentation shows and trained through ORTModule for
a few SGD steps with eager parity (tests/modelparity.py's ``train_parity``, its tolerances).

Tiny: hidden 32, 2 layers, 4 heads, vocab 64, sequences of 12 with right padding in one row,
images 3x32x32, every dropout probability 0. transformers' defaults are kept (``use_cache``
included: the first step's whole output — logits, caches — is compared with eager's too).

A model whose export needs an op the engine lacks, or an aten op torch's exporter cannot
convert, is an expected failure naming the op, so the zoo stays green and turns into a real
check when the op lands. A parity failure is a bug: its entry says what was found and is
``xfail(strict=True)``.

``ZOO`` below is plain data (read with ``ast`` by scripts/gen_ops_table.py for docs/models.md's
model-zoo table): per architecture, what it is, how it is called, the ONNX ops its
training-mode export uses (torch 2.13 TorchScript exporter, opset 20; each test checks the
list against the export), and why it is an expected failure, if it is one.
"""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import ortmod

from modelparity import assert_close, exported_op_types, referee_holds, train_parity

transformers = pytest.importorskip("transformers")

VOCAB, T, B, HIDDEN, LAYERS, HEADS, LABELS = 64, 12, 3, 32, 2, 4, 3
STEPS = 4

# name: {"family": what it is, "called": how, "ops": the ONNX ops of its export (None: the export
# does not get that far), "bug": None, or what a known failure was found to be (the test is then
# xfail(strict=True), "raises" naming the exception where it is no parity assertion),
# "exporter": None, or the aten op torch's exporter cannot convert}
# The ops lists were recorded with these versions; with others the lists are not checked.
ZOO_VERSIONS = {"torch": "2.13", "transformers": "5.24"}
ZOO = {
    'gpt2': {
        "family": 'GPT-2 (`GPT2LMHeadModel`)',
        "called": '`input_ids`, `attention_mask`, `labels`',
        "ops": ['Add', 'And', 'Cast', 'Concat', 'Constant', 'ConstantOfShape', 'Dropout', 'Equal', 'Expand',
                'Flatten', 'Gather', 'Gemm', 'Greater', 'IsNaN', 'LayerNormalization', 'LessOrEqual', 'MatMul',
                'Mul', 'Pad', 'Pow', 'Range', 'Reshape', 'Shape', 'Slice', 'Softmax', 'SoftmaxCrossEntropyLoss',
                'Split', 'Squeeze', 'StopGradient', 'Sub', 'Tanh', 'Transpose', 'Unsqueeze', 'Where'],
        "bug": None,
        "exporter": None,
    },
    'gpt-neo': {
        "family": 'GPT-Neo (`GPTNeoForCausalLM`, global + local attention)',
        "called": '`input_ids`, `attention_mask`, `labels`',
        "ops": ['Add', 'And', 'Cast', 'Concat', 'Constant', 'ConstantOfShape', 'Dropout', 'Equal', 'Expand',
                'Flatten', 'Gather', 'Greater', 'LayerNormalization', 'LessOrEqual', 'MatMul', 'Mul', 'Pad', 'Pow',
                'Range', 'Reshape', 'Shape', 'Slice', 'Softmax', 'SoftmaxCrossEntropyLoss', 'Squeeze',
                'StopGradient', 'Sub', 'Tanh', 'Transpose', 'Unsqueeze', 'Where'],
        "bug": None,
        "exporter": None,
    },
    'gpt-j': {
        "family": 'GPT-J (`GPTJForCausalLM`, partial rotary)',
        "called": '`input_ids`, `attention_mask`, `labels`',
        "ops": ['Add', 'And', 'Cast', 'Concat', 'Constant', 'ConstantOfShape', 'Div', 'Dropout', 'Equal', 'Expand',
                'Flatten', 'Gather', 'Greater', 'IsNaN', 'LayerNormalization', 'LessOrEqual', 'MatMul', 'Mul',
                'Neg', 'Pad', 'Pow', 'Range', 'Reshape', 'Shape', 'Slice', 'Softmax', 'SoftmaxCrossEntropyLoss',
                'Split', 'StopGradient', 'Sub', 'Tanh', 'Tile', 'Transpose', 'Unsqueeze', 'Where'],
        "bug": None,
        "exporter": None,
    },
    'opt': {
        "family": 'OPT (`OPTForCausalLM`)',
        "called": '`input_ids`, `attention_mask`, `labels`',
        "ops": ['Add', 'And', 'Cast', 'Concat', 'Constant', 'ConstantOfShape', 'CumSum', 'Dropout', 'Equal',
                'Expand', 'Flatten', 'Gather', 'Gemm', 'Greater', 'IsNaN', 'LayerNormalization', 'LessOrEqual',
                'MatMul', 'Mul', 'Pad', 'Range', 'Relu', 'Reshape', 'Shape', 'Slice', 'Softmax',
                'SoftmaxCrossEntropyLoss', 'Squeeze', 'StopGradient', 'Sub', 'Transpose', 'Unsqueeze', 'Where'],
        "bug": None,
        "exporter": None,
    },
    'bloom': {
        "family": 'Bloom (`BloomForCausalLM`, ALiBi)',
        "called": '`input_ids`, `attention_mask`, `labels`',
        "ops": ['Add', 'And', 'Cast', 'Concat', 'Constant', 'ConstantOfShape', 'CumSum', 'Div', 'Dropout', 'Equal',
                'Expand', 'Flatten', 'Gather', 'Greater', 'LayerNormalization', 'LessOrEqual', 'MatMul', 'Mul',
                'Pad', 'PythonOp', 'Range', 'Reshape', 'Shape', 'Slice', 'Softmax', 'SoftmaxCrossEntropyLoss',
                'StopGradient', 'Sub', 'Transpose', 'Unsqueeze', 'Where'],
        "bug": None,
        "exporter": None,
    },
    'llama': {
        "family": 'Llama (`LlamaForCausalLM`, GQA)',
        "called": '`input_ids`, `attention_mask`, `labels`',
        "ops": ['Add', 'And', 'Cast', 'Concat', 'Constant', 'ConstantOfShape', 'Cos', 'Div', 'Equal', 'Expand',
                'Flatten', 'Gather', 'Greater', 'IsNaN', 'LessOrEqual', 'MatMul', 'Mul', 'Neg', 'Pad', 'Pow',
                'Range', 'ReduceMean', 'Reshape', 'Shape', 'Sigmoid', 'Sin', 'Slice', 'Softmax',
                'SoftmaxCrossEntropyLoss', 'Sqrt', 'StopGradient', 'Sub', 'Transpose', 'Unsqueeze', 'Where'],
        "bug": None,
        "exporter": None,
    },
    'mistral': {
        "family": 'Mistral (`MistralForCausalLM`, sliding-window cache)',
        "called": '`input_ids`, `attention_mask`, `labels`',
        "ops": ['Add', 'And', 'Cast', 'Concat', 'Constant', 'ConstantOfShape', 'Cos', 'Div', 'Equal', 'Expand',
                'Flatten', 'Gather', 'Greater', 'IsNaN', 'LessOrEqual', 'MatMul', 'Mul', 'Neg', 'Pad', 'Pow',
                'Range', 'ReduceMean', 'Reshape', 'Shape', 'Sigmoid', 'Sin', 'Slice', 'Softmax',
                'SoftmaxCrossEntropyLoss', 'Sqrt', 'StopGradient', 'Sub', 'Transpose', 'Unsqueeze', 'Where'],
        "bug": None,
        "exporter": None,
    },
    'qwen2': {
        "family": 'Qwen2 (`Qwen2ForCausalLM`, GQA)',
        "called": '`input_ids`, `attention_mask`, `labels`',
        "ops": ['Add', 'And', 'Cast', 'Concat', 'Constant', 'ConstantOfShape', 'Cos', 'Div', 'Equal', 'Expand',
                'Flatten', 'Gather', 'Greater', 'IsNaN', 'LessOrEqual', 'MatMul', 'Mul', 'Neg', 'Pad', 'Pow',
                'Range', 'ReduceMean', 'Reshape', 'Shape', 'Sigmoid', 'Sin', 'Slice', 'Softmax',
                'SoftmaxCrossEntropyLoss', 'Sqrt', 'StopGradient', 'Sub', 'Transpose', 'Unsqueeze', 'Where'],
        "bug": None,
        "exporter": None,
    },
    'phi': {
        "family": 'Phi (`PhiForCausalLM`)',
        "called": '`input_ids`, `attention_mask`, `labels`',
        "ops": ['Add', 'And', 'Cast', 'Concat', 'Constant', 'ConstantOfShape', 'Cos', 'Div', 'Dropout', 'Equal',
                'Expand', 'Flatten', 'Gather', 'Greater', 'IsNaN', 'LayerNormalization', 'LessOrEqual', 'MatMul',
                'Mul', 'Neg', 'Pad', 'Pow', 'Range', 'Reshape', 'Shape', 'Sin', 'Slice', 'Softmax',
                'SoftmaxCrossEntropyLoss', 'StopGradient', 'Sub', 'Tanh', 'Transpose', 'Unsqueeze', 'Where'],
        "bug": None,
        "exporter": None,
    },
    'falcon': {
        "family": 'Falcon (`FalconForCausalLM`)',
        "called": '`input_ids`, `attention_mask`, `labels`',
        "ops": ['Add', 'And', 'Cast', 'Concat', 'Constant', 'ConstantOfShape', 'Cos', 'Div', 'Dropout', 'Equal',
                'Expand', 'Flatten', 'Gather', 'Gelu', 'Greater', 'IsNaN', 'LayerNormalization', 'LessOrEqual',
                'MatMul', 'Mul', 'Neg', 'Pad', 'Range', 'Reshape', 'Shape', 'Sin', 'Slice', 'Softmax',
                'SoftmaxCrossEntropyLoss', 'Sqrt', 'StopGradient', 'Sub', 'Transpose', 'Unsqueeze', 'Where'],
        "bug": None,
        "exporter": None,
    },
    'gemma': {
        "family": 'Gemma (`GemmaForCausalLM`)',
        "called": '`input_ids`, `attention_mask`, `labels`',
        "ops": ['Add', 'And', 'Cast', 'Concat', 'Constant', 'ConstantOfShape', 'Cos', 'Div', 'Equal', 'Expand',
                'Flatten', 'Gather', 'Gelu', 'Greater', 'IsNaN', 'LessOrEqual', 'MatMul', 'Mul', 'Neg', 'Pad',
                'Pow', 'Range', 'ReduceMean', 'Reshape', 'Shape', 'Sin', 'Slice', 'Softmax',
                'SoftmaxCrossEntropyLoss', 'Sqrt', 'StopGradient', 'Sub', 'Transpose', 'Unsqueeze', 'Where'],
        "bug": None,
        "exporter": None,
    },
    'gpt-neox': {
        "family": 'GPT-NeoX (`GPTNeoXForCausalLM`)',
        "called": '`input_ids`, `attention_mask`, `labels`',
        "ops": ['Add', 'And', 'Cast', 'Concat', 'Constant', 'ConstantOfShape', 'Cos', 'Div', 'Dropout', 'Equal',
                'Expand', 'Flatten', 'Gather', 'Gelu', 'Greater', 'IsNaN', 'LayerNormalization', 'LessOrEqual',
                'MatMul', 'Mul', 'Neg', 'Pad', 'Range', 'Reshape', 'Shape', 'Sin', 'Slice', 'Softmax',
                'SoftmaxCrossEntropyLoss', 'StopGradient', 'Sub', 'Transpose', 'Unsqueeze', 'Where'],
        "bug": None,
        "exporter": None,
    },
    'bert': {
        "family": 'BERT (`BertForSequenceClassification`)',
        "called": '`input_ids`, `attention_mask`, `labels` (class ids)',
        "ops": ['Add', 'And', 'Cast', 'Concat', 'Constant', 'ConstantOfShape', 'Dropout', 'Equal', 'Expand',
                'Flatten', 'Gather', 'GatherElements', 'Gelu', 'Gemm', 'Greater', 'GreaterOrEqual', 'IsNaN',
                'LayerNormalization', 'MatMul', 'Mul', 'Range', 'Reshape', 'Shape', 'Slice', 'Softmax',
                'SoftmaxCrossEntropyLoss', 'StopGradient', 'Sub', 'Tanh', 'Transpose', 'Unsqueeze', 'Where'],
        "bug": None,
        "exporter": None,
    },
    'roberta': {
        "family": 'RoBERTa (`RobertaForMaskedLM`)',
        "called": '`input_ids`, `attention_mask`, `labels`',
        "ops": ['Add', 'And', 'Cast', 'Concat', 'Constant', 'ConstantOfShape', 'CumSum', 'Dropout', 'Equal',
                'Expand', 'Flatten', 'Gather', 'GatherElements', 'Gelu', 'Greater', 'GreaterOrEqual', 'IsNaN',
                'LayerNormalization', 'LessOrEqual', 'MatMul', 'Mul', 'Not', 'Range', 'Reshape', 'Shape', 'Softmax',
                'SoftmaxCrossEntropyLoss', 'StopGradient', 'Sub', 'Transpose', 'Unsqueeze', 'Where'],
        "bug": None,
        "exporter": None,
    },
    'distilbert': {
        "family": 'DistilBERT (`DistilBertForSequenceClassification`)',
        "called": '`input_ids`, `attention_mask`, `labels` (class ids)',
        "ops": ['Add', 'And', 'Cast', 'Concat', 'Constant', 'ConstantOfShape', 'Dropout', 'Equal', 'Expand',
                'Flatten', 'Gather', 'Gelu', 'Gemm', 'Greater', 'GreaterOrEqual', 'IsNaN', 'LayerNormalization',
                'MatMul', 'Mul', 'Range', 'Relu', 'Reshape', 'Shape', 'Slice', 'Softmax', 'SoftmaxCrossEntropyLoss',
                'StopGradient', 'Sub', 'Transpose', 'Unsqueeze', 'Where'],
        "bug": None,
        "exporter": None,
    },
    'albert': {
        "family": 'ALBERT (`AlbertForSequenceClassification`, factorized embeddings, shared layers)',
        "called": '`input_ids`, `attention_mask`, `labels` (class ids)',
        "ops": ['Add', 'And', 'Cast', 'Concat', 'Constant', 'ConstantOfShape', 'Dropout', 'Equal', 'Expand',
                'Flatten', 'Gather', 'GatherElements', 'Gemm', 'Greater', 'GreaterOrEqual', 'IsNaN',
                'LayerNormalization', 'MatMul', 'Mul', 'Pow', 'Range', 'Reshape', 'Shape', 'Slice', 'Softmax',
                'SoftmaxCrossEntropyLoss', 'StopGradient', 'Sub', 'Tanh', 'Transpose', 'Unsqueeze', 'Where'],
        "bug": None,
        "exporter": None,
    },
    'electra': {
        "family": 'ELECTRA (`ElectraForSequenceClassification`)',
        "called": '`input_ids`, `attention_mask`, `labels` (class ids)',
        "ops": ['Add', 'And', 'Cast', 'Concat', 'Constant', 'ConstantOfShape', 'Dropout', 'Equal', 'Expand',
                'Flatten', 'Gather', 'GatherElements', 'Gelu', 'Gemm', 'Greater', 'GreaterOrEqual', 'IsNaN',
                'LayerNormalization', 'MatMul', 'Mul', 'Range', 'Reshape', 'Shape', 'Slice', 'Softmax',
                'SoftmaxCrossEntropyLoss', 'StopGradient', 'Sub', 'Transpose', 'Unsqueeze', 'Where'],
        "bug": None,
        "exporter": None,
    },
    'deberta-v2': {
        "family": 'DeBERTa-v2 (`DebertaV2ForMaskedLM`, relative position buckets)',
        "called": '`input_ids`, `attention_mask`, `labels`',
        "ops": ['Abs', 'Add', 'And', 'Cast', 'Ceil', 'Clip', 'Concat', 'Constant', 'ConstantOfShape', 'Div',
                'Dropout', 'Equal', 'Expand', 'Gather', 'GatherElements', 'Gelu', 'Greater', 'LayerNormalization',
                'Less', 'LessOrEqual', 'Log', 'MatMul', 'Mul', 'Neg', 'Not', 'Range', 'Reshape', 'Shape', 'Sign',
                'Slice', 'Softmax', 'SoftmaxCrossEntropyLoss', 'Sqrt', 'Squeeze', 'StopGradient', 'Sub', 'Tile',
                'Transpose', 'Unsqueeze', 'Where'],
        "bug": None,
        "exporter": None,
    },
    'xlm-roberta': {
        "family": 'XLM-RoBERTa (`XLMRobertaForSequenceClassification`)',
        "called": '`input_ids`, `attention_mask`, `labels` (class ids)',
        "ops": ['Add', 'And', 'Cast', 'Concat', 'Constant', 'ConstantOfShape', 'CumSum', 'Dropout', 'Equal',
                'Expand', 'Flatten', 'Gather', 'GatherElements', 'Gelu', 'Gemm', 'Greater', 'GreaterOrEqual',
                'IsNaN', 'LayerNormalization', 'LessOrEqual', 'MatMul', 'Mul', 'Not', 'Range', 'Reshape', 'Shape',
                'Softmax', 'SoftmaxCrossEntropyLoss', 'StopGradient', 'Sub', 'Tanh', 'Transpose', 'Unsqueeze',
                'Where'],
        "bug": None,
        "exporter": None,
    },
    't5': {
        "family": 'T5 (`T5ForConditionalGeneration`)',
        "called": '`input_ids`, `attention_mask`, `labels` (decoder)',
        "ops": ['Abs', 'Add', 'And', 'Cast', 'Concat', 'Constant', 'ConstantOfShape', 'Div', 'Dropout', 'Equal',
                'Expand', 'Flatten', 'Gather', 'Greater', 'GreaterOrEqual', 'Less', 'Log', 'MatMul', 'Min', 'Mul',
                'Neg', 'Pow', 'Range', 'ReduceMean', 'ReduceProd', 'Relu', 'Reshape', 'ScatterND', 'Shape', 'Slice',
                'Softmax', 'SoftmaxCrossEntropyLoss', 'Sqrt', 'Squeeze', 'StopGradient', 'Sub', 'Transpose',
                'Unsqueeze', 'Where'],
        "bug": None,
        "exporter": None,
    },
    'bart': {
        "family": 'BART (`BartForConditionalGeneration`)',
        "called": '`input_ids`, `attention_mask`, `labels` (decoder)',
        "ops": ['Add', 'And', 'Cast', 'Concat', 'Constant', 'ConstantOfShape', 'Dropout', 'Equal', 'Expand',
                'Flatten', 'Gather', 'Gelu', 'Greater', 'GreaterOrEqual', 'IsNaN', 'LayerNormalization',
                'LessOrEqual', 'MatMul', 'Mul', 'Range', 'Reshape', 'ScatterND', 'Shape', 'Slice', 'Softmax',
                'SoftmaxCrossEntropyLoss', 'StopGradient', 'Sub', 'Transpose', 'Unsqueeze', 'Where'],
        "bug": None,
        "exporter": None,
    },
    'whisper': {
        "family": 'Whisper (`WhisperForConditionalGeneration`)',
        "called": '`input_features`, `labels`',
        "ops": ['Add', 'Cast', 'Concat', 'Constant', 'ConstantOfShape', 'Conv', 'Dropout', 'Equal', 'Expand',
                'Gather', 'Gelu', 'Greater', 'LayerNormalization', 'MatMul', 'Mul', 'Not', 'Range', 'Reshape',
                'ScatterND', 'Shape', 'Slice', 'Softmax', 'SoftmaxCrossEntropyLoss', 'StopGradient', 'Tile',
                'Transpose', 'Trilu', 'Unsqueeze', 'Where'],
        "bug": None,
        "exporter": None,
    },
    'wav2vec2-ctc': {
        "family": 'Wav2Vec2 (`Wav2Vec2ForCTC`)',
        "called": '`input_values`, `attention_mask`, `labels`',
        "ops": ['Add', 'And', 'CTCLoss', 'Cast', 'Concat', 'Constant', 'ConstantOfShape', 'Conv', 'CumSum', 'Div',
                'Dropout', 'Equal', 'Expand', 'Flatten', 'Gather', 'Gelu', 'Greater', 'GreaterOrEqual', 'IsNaN',
                'LayerNormalization', 'Less', 'LogSoftmax', 'MatMul', 'Mod', 'Mul', 'Not', 'Range', 'ReduceL2',
                'ReduceMax', 'ReduceMean', 'ReduceSum', 'Reshape', 'ScatterND', 'Shape', 'Slice', 'Softmax', 'Sqrt',
                'StopGradient', 'Sub', 'Tile', 'Transpose', 'Unsqueeze', 'Where', 'Xor'],
        "bug": None,
        # Wav2Vec2Config's ctc_loss_reduction is "sum" (~118 nats per sample): the zoo's lr for
        # mean losses makes the loss explode (236 -> 795 in 3 steps), a chaotic trajectory that no
        # fp32 run follows; scaled down as a user would for a summed loss
        "lr": 5e-4,
        "exporter": None,
    },
    'clip': {
        "family": 'CLIP (`CLIPModel`, contrastive loss)',
        "called": '`input_ids`, `attention_mask`, `pixel_values`, `return_loss=True`',
        "ops": ['Add', 'And', 'ArgMax', 'Cast', 'Concat', 'Constant', 'ConstantOfShape', 'Conv', 'Div', 'Equal',
                'Exp', 'Expand', 'Flatten', 'Gather', 'Greater', 'IsNaN', 'LayerNormalization', 'LessOrEqual',
                'MatMul', 'Mul', 'Not', 'Pow', 'Range', 'ReduceSum', 'Reshape', 'Shape', 'Sigmoid', 'Slice',
                'Softmax', 'SoftmaxCrossEntropyLoss', 'StopGradient', 'Sub', 'Transpose', 'Unsqueeze', 'Where'],
        "bug": None,
        "exporter": None,
    },
    'vit': {
        "family": 'ViT (`ViTForImageClassification`)',
        "called": '`pixel_values`, `labels`',
        "ops": ['Add', 'Cast', 'Concat', 'Constant', 'ConstantOfShape', 'Conv', 'Dropout', 'Equal', 'Expand',
                'Gather', 'Gelu', 'Gemm', 'Greater', 'LayerNormalization', 'MatMul', 'Mul', 'Not', 'Reshape',
                'Shape', 'Slice', 'Softmax', 'SoftmaxCrossEntropyLoss', 'StopGradient', 'Transpose', 'Unsqueeze',
                'Where'],
        "bug": None,
        "exporter": None,
    },
    'swin': {
        "family": 'Swin (`SwinForImageClassification`, shifted windows)',
        "called": '`pixel_values`, `labels`',
        "ops": ['Add', 'Cast', 'Concat', 'Constant', 'ConstantOfShape', 'Conv', 'Div', 'Dropout', 'Equal',
                'Flatten', 'Gather', 'Gelu', 'Gemm', 'GlobalAveragePool', 'Greater', 'LayerNormalization', 'Less',
                'LessOrEqual', 'MatMul', 'Mod', 'Mul', 'Not', 'Pad', 'Reshape', 'Shape', 'Slice', 'Softmax',
                'SoftmaxCrossEntropyLoss', 'StopGradient', 'Sub', 'Transpose', 'Unsqueeze'],
        "bug": None,
        "exporter": None,
    },
    'convnext': {
        "family": 'ConvNeXt (`ConvNextForImageClassification`)',
        "called": '`pixel_values`, `labels`',
        "ops": ['Add', 'Cast', 'Constant', 'Conv', 'Equal', 'Gather', 'Gelu', 'Gemm', 'LayerNormalization',
                'MatMul', 'Mul', 'Not', 'ReduceMean', 'Reshape', 'Shape', 'SoftmaxCrossEntropyLoss', 'StopGradient',
                'Transpose'],
        "bug": None,
        "exporter": None,
    },
    'resnet': {
        "family": 'ResNet (`ResNetForImageClassification`, basic blocks)',
        "called": '`pixel_values`, `labels`',
        "ops": ['Add', 'BatchNormalization', 'Cast', 'Constant', 'Conv', 'Equal', 'Flatten', 'Gather', 'Gemm',
                'GlobalAveragePool', 'MaxPool', 'Mul', 'Not', 'Relu', 'Reshape', 'Shape', 'SoftmaxCrossEntropyLoss',
                'StopGradient'],
        "bug": None,
        "exporter": None,
    },
    'mobilenet-v2': {
        "family": 'MobileNetV2 (`MobileNetV2ForImageClassification`)',
        "called": '`pixel_values`, `labels`',
        "ops": ['Add', 'BatchNormalization', 'Cast', 'Constant', 'Conv', 'Dropout', 'Equal', 'Flatten', 'Gather',
                'Gemm', 'GlobalAveragePool', 'HardTanh', 'Mul', 'Pad', 'Reshape', 'Shape', 'SoftmaxCrossEntropyLoss',
                'StopGradient'],
        "bug": None,
        # fp32 training of this config is chaotic: 17 conv+BatchNorm blocks over a batch of 4
        # amplify rounding so that eager fp32 and an fp64 run part after step 1 at any lr
        # (losses 0.995 vs 1.093 at step 2, lr 5e-4); one step is what fp32 can be held to, with
        # the fp64 referee (modelparity.train_parity) deciding the step-0 gradients
        "steps": 1,
        "exporter": None,
    },
    'nn.Transformer-bf': {
        "family": '`nn.Transformer` (causal tgt_mask, key padding masks), batch_first=True',
        "called": '`model(src, tgt, src_key_padding_mask, labels)`',
        "ops": ['Add', 'Cast', 'Concat', 'Constant', 'ConstantOfShape', 'Div', 'Dropout', 'Equal', 'Expand',
                'Gather', 'Gemm', 'LayerNormalization', 'MatMul', 'Mod', 'Mul', 'Not', 'Relu', 'Reshape', 'Shape',
                'Slice', 'Softmax', 'SoftmaxCrossEntropyLoss', 'Sqrt', 'Squeeze', 'StopGradient', 'Transpose',
                'Trilu', 'Unsqueeze', 'Where'],
        "bug": None,
        "exporter": None,
    },
    'nn.Transformer-sf': {
        "family": '`nn.Transformer` (causal tgt_mask, key padding masks), batch_first=False',
        "called": '`model(src, tgt, src_key_padding_mask, labels)`',
        "ops": ['Add', 'Cast', 'Concat', 'Constant', 'ConstantOfShape', 'Div', 'Dropout', 'Equal', 'Expand',
                'Gather', 'Gemm', 'LayerNormalization', 'MatMul', 'Mod', 'Mul', 'Not', 'Relu', 'Reshape', 'Shape',
                'Slice', 'Softmax', 'SoftmaxCrossEntropyLoss', 'Sqrt', 'Squeeze', 'StopGradient', 'Transpose',
                'Trilu', 'Unsqueeze', 'Where'],
        "bug": None,
        "exporter": None,
    },
    'nn.TransformerEncoder-bf': {
        "family": '`nn.TransformerEncoder` (src_key_padding_mask), batch_first=True',
        "called": '`model(src, tgt, src_key_padding_mask, labels)`',
        "ops": ['Add', 'Cast', 'Concat', 'Constant', 'ConstantOfShape', 'Div', 'Dropout', 'Equal', 'Expand',
                'Gather', 'Gemm', 'LayerNormalization', 'MatMul', 'Mod', 'Mul', 'Not', 'ReduceSum', 'Relu',
                'Reshape', 'Shape', 'Slice', 'Softmax', 'SoftmaxCrossEntropyLoss', 'Sqrt', 'Squeeze',
                'StopGradient', 'Transpose', 'Unsqueeze', 'Where'],
        "bug": None,
        "exporter": None,
    },
    'nn.TransformerEncoder-sf': {
        "family": '`nn.TransformerEncoder` (src_key_padding_mask), batch_first=False',
        "called": '`model(src, tgt, src_key_padding_mask, labels)`',
        "ops": ['Add', 'Cast', 'Concat', 'Constant', 'ConstantOfShape', 'Div', 'Dropout', 'Equal', 'Expand',
                'Gather', 'Gemm', 'LayerNormalization', 'MatMul', 'Mod', 'Mul', 'Not', 'ReduceSum', 'Relu',
                'Reshape', 'Shape', 'Slice', 'Softmax', 'SoftmaxCrossEntropyLoss', 'Sqrt', 'Squeeze',
                'StopGradient', 'Transpose', 'Unsqueeze', 'Where'],
        "bug": None,
        "exporter": None,
    },
    'nn.TransformerDecoderLayer-bf': {
        "family": '`nn.TransformerDecoderLayer` (norm_first, causal tgt_mask, memory padding), batch_first=True',
        "called": '`model(src, tgt, src_key_padding_mask, labels)`',
        "ops": ['Add', 'Cast', 'Concat', 'Constant', 'ConstantOfShape', 'Div', 'Dropout', 'Equal', 'Expand',
                'Gather', 'Gemm', 'LayerNormalization', 'MatMul', 'Mod', 'Mul', 'Not', 'Relu', 'Reshape', 'Shape',
                'Slice', 'Softmax', 'SoftmaxCrossEntropyLoss', 'Sqrt', 'Squeeze', 'StopGradient', 'Transpose',
                'Trilu', 'Unsqueeze', 'Where'],
        "bug": None,
        "exporter": None,
    },
    'nn.TransformerDecoderLayer-sf': {
        "family": '`nn.TransformerDecoderLayer` (norm_first, causal tgt_mask, memory padding), batch_first=False',
        "called": '`model(src, tgt, src_key_padding_mask, labels)`',
        "ops": ['Add', 'Cast', 'Concat', 'Constant', 'ConstantOfShape', 'Div', 'Dropout', 'Equal', 'Expand',
                'Gather', 'Gemm', 'LayerNormalization', 'MatMul', 'Mod', 'Mul', 'Not', 'Relu', 'Reshape', 'Shape',
                'Slice', 'Softmax', 'SoftmaxCrossEntropyLoss', 'Sqrt', 'Squeeze', 'StopGradient', 'Transpose',
                'Trilu', 'Unsqueeze', 'Where'],
        "bug": None,
        "exporter": None,
    },
    'nn.MultiheadAttention-bf': {
        "family": '`nn.MultiheadAttention` (key_padding_mask, both outputs), batch_first=True',
        "called": '`model(src, tgt, src_key_padding_mask, labels)`',
        "ops": ['Add', 'Cast', 'Concat', 'Constant', 'ConstantOfShape', 'Div', 'Equal', 'Expand', 'Gather', 'Gemm',
                'MatMul', 'Mod', 'Mul', 'Not', 'ReduceMean', 'Reshape', 'Shape', 'Slice', 'Softmax',
                'SoftmaxCrossEntropyLoss', 'Squeeze', 'StopGradient', 'Transpose', 'Unsqueeze', 'Where'],
        "bug": None,
        "exporter": None,
    },
    'nn.MultiheadAttention-sf': {
        "family": '`nn.MultiheadAttention` (key_padding_mask, both outputs), batch_first=False',
        "called": '`model(src, tgt, src_key_padding_mask, labels)`',
        "ops": ['Add', 'Cast', 'Concat', 'Constant', 'ConstantOfShape', 'Div', 'Equal', 'Expand', 'Gather', 'Gemm',
                'MatMul', 'Mod', 'Mul', 'Not', 'ReduceMean', 'Reshape', 'Shape', 'Slice', 'Softmax',
                'SoftmaxCrossEntropyLoss', 'Squeeze', 'StopGradient', 'Transpose', 'Unsqueeze', 'Where'],
        "bug": None,
        "exporter": None,
    },
}


# --------------------------------------------------------------------------- inputs

def _gen(seed):
    return torch.Generator().manual_seed(seed)


def text_batches(seed=11, n=2, pad_id=None, low=0, cls_labels=False, lm_labels=True):
    """input_ids (B, T) with the last 4 tokens of row 1 padded (attention_mask 0)."""
    g = _gen(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(low, VOCAB, (B, T), generator=g)
        mask = torch.ones(B, T, dtype=torch.long)
        mask[1, T - 4:] = 0
        if pad_id is not None:
            ids = ids.masked_fill(mask == 0, pad_id)
        batch = {"input_ids": ids, "attention_mask": mask}
        if cls_labels:
            batch["labels"] = torch.randint(0, LABELS, (B,), generator=g)
        elif lm_labels:
            batch["labels"] = ids.masked_fill(mask == 0, -100)
        out.append(batch)
    return out


def seq2seq_batches(seed=13, n=2, low=3):
    """Encoder input_ids/attention_mask as above; labels (B, 8), row 1's last 3 are -100."""
    g = _gen(seed)
    out = []
    for batch in text_batches(seed, n, pad_id=0, low=low, lm_labels=False):
        labels = torch.randint(low, VOCAB, (B, 8), generator=g)
        labels[1, 5:] = -100
        batch["labels"] = labels
        out.append(batch)
    return out


def image_batches(seed=5, n=2, b=4, size=32):
    g = _gen(seed)
    return [{"pixel_values": torch.randn(b, 3, size, size, generator=g),
             "labels": torch.randint(0, LABELS, (b,), generator=g)} for _ in range(n)]


def output_loss(model, batch):
    return model(**batch).loss


# --------------------------------------------------------------------------- builders

def _rotary_common():
    # tests/test_models_rotary.py's tiny configuration, with transformers' use_cache default
    from test_models_rotary import _common
    return {k: v for k, v in _common().items() if k != "use_cache"}


def _gpt2():
    from test_models_gpt2 import make_gpt2   # its builder, at the zoo's size and defaults
    cfg = make_gpt2().config
    cfg.update(dict(n_embd=HIDDEN, vocab_size=VOCAB, use_cache=True))
    return transformers.GPT2LMHeadModel(cfg)


def _tf(model_cls, config_cls, **kw):
    return lambda: getattr(transformers, model_cls)(getattr(transformers, config_cls)(**kw))


DECODERS = {
    "gpt2": _gpt2,
    "gpt-neo": _tf("GPTNeoForCausalLM", "GPTNeoConfig", vocab_size=VOCAB, hidden_size=HIDDEN, num_layers=LAYERS,
                   attention_types=[[["global", "local"], 1]], num_heads=HEADS, intermediate_size=64,
                   max_position_embeddings=64, window_size=8, embed_dropout=0.0, attention_dropout=0.0,
                   resid_dropout=0.0),
    "gpt-j": _tf("GPTJForCausalLM", "GPTJConfig", vocab_size=VOCAB, n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS,
                 rotary_dim=4, n_inner=64, n_positions=64, embd_pdrop=0.0, attn_pdrop=0.0, resid_pdrop=0.0),
    "opt": _tf("OPTForCausalLM", "OPTConfig", vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
               num_attention_heads=HEADS, ffn_dim=64, word_embed_proj_dim=HIDDEN, max_position_embeddings=64,
               dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, layerdrop=0.0, pad_token_id=1),
    "bloom": _tf("BloomForCausalLM", "BloomConfig", vocab_size=VOCAB, hidden_size=HIDDEN, n_layer=LAYERS,
                 n_head=HEADS, hidden_dropout=0.0, attention_dropout=0.0),
    "llama": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(num_key_value_heads=2, **_rotary_common())),
    "mistral": lambda: transformers.MistralForCausalLM(
        transformers.MistralConfig(num_key_value_heads=2, **_rotary_common())),
    "qwen2": lambda: transformers.Qwen2ForCausalLM(transformers.Qwen2Config(num_key_value_heads=2, **_rotary_common())),
    "phi": lambda: transformers.PhiForCausalLM(transformers.PhiConfig(**_rotary_common())),
    "falcon": _tf("FalconForCausalLM", "FalconConfig", vocab_size=VOCAB, hidden_size=HIDDEN,
                  num_hidden_layers=LAYERS, num_attention_heads=HEADS, hidden_dropout=0.0, attention_dropout=0.0),
    "gemma": lambda: transformers.GemmaForCausalLM(
        transformers.GemmaConfig(num_key_value_heads=2, head_dim=8, **_rotary_common())),
    "gpt-neox": lambda: transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(**_rotary_common())),
}

_BERTLIKE = dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                 intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=0.0,
                 attention_probs_dropout_prob=0.0, num_labels=LABELS)

ENCODERS = {
    # name: (builder, batches)
    "bert": (_tf("BertForSequenceClassification", "BertConfig", **_BERTLIKE),
             lambda: text_batches(cls_labels=True)),
    "roberta": (_tf("RobertaForMaskedLM", "RobertaConfig", pad_token_id=1, **_BERTLIKE),
                lambda: text_batches(pad_id=1, low=3)),
    "distilbert": (_tf("DistilBertForSequenceClassification", "DistilBertConfig", vocab_size=VOCAB, dim=HIDDEN,
                       n_layers=LAYERS, n_heads=HEADS, hidden_dim=64, max_position_embeddings=64, dropout=0.0,
                       attention_dropout=0.0, seq_classif_dropout=0.0, num_labels=LABELS),
                   lambda: text_batches(cls_labels=True)),
    "albert": (_tf("AlbertForSequenceClassification", "AlbertConfig", embedding_size=16,
                   classifier_dropout_prob=0.0, **_BERTLIKE),
               lambda: text_batches(cls_labels=True)),
    "electra": (_tf("ElectraForSequenceClassification", "ElectraConfig", embedding_size=HIDDEN, **_BERTLIKE),
                lambda: text_batches(cls_labels=True)),
    "deberta-v2": (_tf("DebertaV2ForMaskedLM", "DebertaV2Config", relative_attention=True,
                       position_buckets=8, max_relative_positions=16, pos_att_type=["p2c", "c2p"], **_BERTLIKE),
                   lambda: text_batches(pad_id=0, low=1)),
    "xlm-roberta": (_tf("XLMRobertaForSequenceClassification", "XLMRobertaConfig", pad_token_id=1, **_BERTLIKE),
                    lambda: text_batches(pad_id=1, low=3, cls_labels=True)),
}

_SEQ2SEQ_DIMS = dict(vocab_size=VOCAB, d_model=HIDDEN, encoder_layers=LAYERS, decoder_layers=LAYERS,
                     encoder_attention_heads=HEADS, decoder_attention_heads=HEADS, encoder_ffn_dim=64,
                     decoder_ffn_dim=64, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
                     encoder_layerdrop=0.0, decoder_layerdrop=0.0, pad_token_id=0, decoder_start_token_id=2)


def whisper_batches(seed=17, n=2):
    g = _gen(seed)
    out = []
    for _ in range(n):
        labels = torch.randint(3, VOCAB, (B, 8), generator=g)
        labels[1, 5:] = -100
        out.append({"input_features": torch.randn(B, 8, 16, generator=g), "labels": labels})
    return out


SEQ2SEQ = {
    "t5": (_tf("T5ForConditionalGeneration", "T5Config", vocab_size=VOCAB, d_model=HIDDEN, d_kv=8, d_ff=64,
               num_layers=LAYERS, num_heads=HEADS, relative_attention_num_buckets=8, dropout_rate=0.0,
               pad_token_id=0, decoder_start_token_id=0),
           seq2seq_batches),
    "bart": (_tf("BartForConditionalGeneration", "BartConfig", max_position_embeddings=64, **_SEQ2SEQ_DIMS),
             seq2seq_batches),
    "whisper": (_tf("WhisperForConditionalGeneration", "WhisperConfig", num_mel_bins=8, max_source_positions=8,
                    max_target_positions=16, **_SEQ2SEQ_DIMS),
                whisper_batches),
}

VISION = {
    "vit": _tf("ViTForImageClassification", "ViTConfig", image_size=32, patch_size=8, num_channels=3,
               hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS, intermediate_size=64,
               hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=LABELS),
    "swin": _tf("SwinForImageClassification", "SwinConfig", image_size=32, patch_size=4, num_channels=3,
                embed_dim=16, depths=[1, 1], num_heads=[2, 4], window_size=4, mlp_ratio=2.0,
                hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, drop_path_rate=0.0, num_labels=LABELS),
    "convnext": _tf("ConvNextForImageClassification", "ConvNextConfig", num_channels=3, patch_size=4,
                    hidden_sizes=[16, HIDDEN], depths=[1, 1], num_stages=2, drop_path_rate=0.0, image_size=32,
                    num_labels=LABELS),
    "resnet": _tf("ResNetForImageClassification", "ResNetConfig", num_channels=3, embedding_size=16,
                  hidden_sizes=[16, HIDDEN], depths=[1, 1], layer_type="basic", num_labels=LABELS),
    "mobilenet-v2": _tf("MobileNetV2ForImageClassification", "MobileNetV2Config", num_channels=3, image_size=32,
                        depth_multiplier=0.25, classifier_dropout_prob=0.0, num_labels=LABELS),
}


def wav2vec2_batches(seed=19, n=2):
    g = _gen(seed)
    out = []
    for _ in range(n):
        audio = torch.randn(B, 400, generator=g)
        mask = torch.ones(B, 400, dtype=torch.long)
        mask[1, 300:] = 0
        labels = torch.randint(3, 16, (B, 5), generator=g)
        labels[1, 3:] = -100
        out.append({"input_values": audio, "attention_mask": mask, "labels": labels})
    return out


def clip_batches(seed=23, n=2):
    g = _gen(seed)
    out = []
    for batch in text_batches(seed, n, lm_labels=False):
        batch["pixel_values"] = torch.randn(B, 3, 32, 32, generator=g)
        batch["return_loss"] = True
        out.append(batch)
    return out


_CLIP_TEXT = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=64, num_hidden_layers=LAYERS,
                  num_attention_heads=HEADS, max_position_embeddings=64, attention_dropout=0.0)
_CLIP_VISION = dict(image_size=32, patch_size=8, num_channels=3, hidden_size=HIDDEN, intermediate_size=64,
                    num_hidden_layers=LAYERS, num_attention_heads=HEADS, attention_dropout=0.0)

OTHER = {
    "wav2vec2-ctc": (_tf("Wav2Vec2ForCTC", "Wav2Vec2Config", vocab_size=16, hidden_size=HIDDEN,
                         num_hidden_layers=LAYERS, num_attention_heads=HEADS, intermediate_size=64,
                         conv_dim=(16, 16), conv_kernel=(10, 3), conv_stride=(5, 2), num_conv_pos_embeddings=8,
                         num_conv_pos_embedding_groups=2, hidden_dropout=0.0, activation_dropout=0.0,
                         attention_dropout=0.0, feat_proj_dropout=0.0, final_dropout=0.0, layerdrop=0.0,
                         apply_spec_augment=False, mask_time_prob=0.0),
                     wav2vec2_batches),
    "clip": (lambda: transformers.CLIPModel(transformers.CLIPConfig(text_config=_CLIP_TEXT,
                                                                     vision_config=_CLIP_VISION,
                                                                     projection_dim=16)),
             clip_batches),
}


# --------------------------------------------------------------------------- torch.nn

def causal_mask(n):
    return nn.Transformer.generate_square_subsequent_mask(n)


def _seq(x, batch_first):
    return x if batch_first else x.transpose(0, 1)


class NNTransformer(nn.Module):
    """nn.Transformer seq2seq LM: src/tgt embeddings, causal tgt_mask, key padding masks."""

    def __init__(self, batch_first):
        super().__init__()
        self.batch_first = batch_first
        self.emb = nn.Embedding(VOCAB, HIDDEN)
        self.core = nn.Transformer(d_model=HIDDEN, nhead=HEADS, num_encoder_layers=LAYERS,
                                   num_decoder_layers=LAYERS, dim_feedforward=64, dropout=0.0,
                                   batch_first=batch_first)
        self.head = nn.Linear(HIDDEN, VOCAB)

    def forward(self, src, tgt, src_pad, labels):
        bf = self.batch_first
        h = self.core(_seq(self.emb(src), bf), _seq(self.emb(tgt), bf), tgt_mask=causal_mask(tgt.shape[1]),
                      src_key_padding_mask=src_pad, memory_key_padding_mask=src_pad, tgt_is_causal=True)
        logits = self.head(_seq(h, bf))
        return F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1), ignore_index=-100)


class NNEncoder(nn.Module):
    """nn.TransformerEncoder classifier with src_key_padding_mask, masked mean pooling."""

    def __init__(self, batch_first):
        super().__init__()
        self.batch_first = batch_first
        self.emb = nn.Embedding(VOCAB, HIDDEN)
        layer = nn.TransformerEncoderLayer(HIDDEN, HEADS, dim_feedforward=64, dropout=0.0, batch_first=batch_first)
        self.enc = nn.TransformerEncoder(layer, num_layers=LAYERS, enable_nested_tensor=False)
        self.head = nn.Linear(HIDDEN, LABELS)

    def forward(self, src, tgt, src_pad, labels):
        h = _seq(self.enc(_seq(self.emb(src), self.batch_first), src_key_padding_mask=src_pad), self.batch_first)
        keep = (~src_pad).unsqueeze(-1).float()
        pooled = (h * keep).sum(1) / keep.sum(1)
        return F.cross_entropy(self.head(pooled), labels[:, 0] % LABELS)


class NNDecoderLayer(nn.Module):
    """One nn.TransformerDecoderLayer over an embedded memory: causal tgt_mask, memory padding."""

    def __init__(self, batch_first):
        super().__init__()
        self.batch_first = batch_first
        self.emb = nn.Embedding(VOCAB, HIDDEN)
        self.dec = nn.TransformerDecoderLayer(HIDDEN, HEADS, dim_feedforward=64, dropout=0.0,
                                              batch_first=batch_first, norm_first=True)
        self.head = nn.Linear(HIDDEN, VOCAB)

    def forward(self, src, tgt, src_pad, labels):
        bf = self.batch_first
        h = self.dec(_seq(self.emb(tgt), bf), _seq(self.emb(src), bf), tgt_mask=causal_mask(tgt.shape[1]),
                     memory_key_padding_mask=src_pad)
        logits = self.head(_seq(h, bf))
        return F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1), ignore_index=-100)


class NNMultiheadAttention(nn.Module):
    """nn.MultiheadAttention self-attention with key_padding_mask; both of its outputs (the
    attention output and the head-averaged weights) reach the loss."""

    def __init__(self, batch_first):
        super().__init__()
        self.batch_first = batch_first
        self.emb = nn.Embedding(VOCAB, HIDDEN)
        self.attn = nn.MultiheadAttention(HIDDEN, HEADS, dropout=0.0, batch_first=batch_first)
        self.head = nn.Linear(HIDDEN, VOCAB)

    def forward(self, src, tgt, src_pad, labels):
        x = _seq(self.emb(src), self.batch_first)
        out, weights = self.attn(x, x, x, key_padding_mask=src_pad)
        logits = self.head(_seq(out, self.batch_first))
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), src.masked_fill(src_pad, -100).reshape(-1))
        return loss + (weights * weights).mean()


def nn_batches(seed=29, n=2):
    g = _gen(seed)
    out = []
    for _ in range(n):
        src = torch.randint(0, VOCAB, (B, T), generator=g)
        pad = torch.zeros(B, T, dtype=torch.bool)
        pad[1, T - 4:] = True                 # True: padding (torch.nn's convention)
        tgt = torch.randint(0, VOCAB, (B, 8), generator=g)
        labels = torch.randint(0, VOCAB, (B, 8), generator=g)
        labels[1, 6:] = -100
        out.append((src, tgt, pad, labels))
    return out


def nn_loss(model, batch):
    return model(*batch)


TORCH_NN = {
    f"{name}-{'bf' if bf else 'sf'}": (lambda cls=cls, bf=bf: cls(bf))
    for name, cls in (("nn.Transformer", NNTransformer), ("nn.TransformerEncoder", NNEncoder),
                      ("nn.TransformerDecoderLayer", NNDecoderLayer), ("nn.MultiheadAttention", NNMultiheadAttention))
    for bf in (True, False)
}


# --------------------------------------------------------------------------- the cases

def _cases():
    for name, make in DECODERS.items():
        yield name, make, text_batches, output_loss
    for name, (make, batches) in ENCODERS.items():
        yield name, make, batches, output_loss
    for name, (make, batches) in {**SEQ2SEQ, **OTHER}.items():
        yield name, make, batches, output_loss
    for name, make in VISION.items():
        yield name, make, image_batches, output_loss
    for name, make in TORCH_NN.items():
        yield name, make, nn_batches, nn_loss


CASES = {name: (make, batches, loss) for name, make, batches, loss in _cases()}


def _tensors(obj, depth=0):
    """Every tensor in a model's output, in a fixed order: ModelOutputs, tuples, caches
    (DynamicCache's layers' keys and values) and other plain objects holding tensors."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if depth > 6 or obj is None or isinstance(obj, (int, float, bool, str)):
        return []
    if isinstance(obj, dict):
        items = list(obj.values())
    elif isinstance(obj, (list, tuple)):
        items = list(obj)
    elif hasattr(obj, "__dict__"):
        items = [v for k, v in sorted(vars(obj).items()) if not k.startswith("_")]
    else:
        return []
    return [t for item in items for t in _tensors(item, depth + 1)]


class FirstOutputs:
    """The loss function of a case, keeping each model's first whole output."""

    def __init__(self, loss_of):
        self.loss_of = loss_of
        self.outputs = {}

    def __call__(self, model, batch):
        if self.loss_of is output_loss:
            out = model(**batch)
            self.outputs.setdefault(id(model), out)
            return out.loss
        return self.loss_of(model, batch)


def _marks(name):
    bug = ZOO[name]["bug"]
    if bug is None:
        return ()
    raises = {"RuntimeError": RuntimeError, None: AssertionError}[ZOO[name].get("raises")]
    return (pytest.mark.xfail(strict=True, raises=raises, reason=bug),)


def _versions_match():
    return all(getattr(mod, "__version__", "").startswith(ZOO_VERSIONS[name] + ".")
               for name, mod in (("torch", torch), ("transformers", transformers)))


def test_zoo_table_lists_every_case():
    assert list(ZOO) == list(CASES)


@pytest.mark.parametrize("name", [pytest.param(n, marks=_marks(n)) for n in CASES])
def test_zoo_parity(name):
    _zoo_parity(name)


# The torch.export capture path (issue 16), on a torch without the TorchScript exporter: it is
# made unimportable and ORTModule's auto capture falls back. One architecture per family kind;
# ORTMOD_EXPORT_ZOO=all runs every one. EXPORT_REFUSED: what this path still refuses, by name
# (each an expected failure whose error must name the reason; a case that starts passing fails
# the run, so the list cannot go stale).
EXPORT_ZOO = ("gpt2", "llama", "bert", "t5", "whisper", "vit", "nn.TransformerEncoder-bf",
              "wav2vec2-ctc")     # CTC: ortmod::ctc_loss (ortmod/capture/rules/ctc.py)
EXPORT_REFUSED = {}


def _export_cases():
    import os
    names = CASES if os.environ.get("ORTMOD_EXPORT_ZOO") == "all" else EXPORT_ZOO
    for n in names:
        marks = _marks(n)
        if n in EXPORT_REFUSED:
            marks = (pytest.mark.xfail(strict=True, raises=(ortmod.ExportError, ortmod.UnsupportedModelError),
                                       reason=EXPORT_REFUSED[n]),)
        yield pytest.param(n, marks=marks)


@pytest.mark.parametrize("name", list(_export_cases()))
def test_zoo_trains_without_the_torchscript_exporter(name, without_torchscript_exporter):
    captures = _zoo_parity(name)
    assert captures == {"export"}, captures


def _zoo_parity(name):
    """Train the case with eager parity; returns the capture paths its exports took."""
    make, batches, loss_of = CASES[name]
    wrapped = []
    first = FirstOutputs(loss_of)
    try:
        eager, ort, _ = train_parity(make, batches(), first, steps=ZOO[name].get("steps", STEPS),
                                     lr=ZOO[name].get("lr", 0.05), on_wrap=wrapped.append)
    finally:
        if wrapped and wrapped[0]._ortmod_exports:
            print(f"{name} export ops: {exported_op_types(wrapped[0])}")
            # the lists are the TorchScript exporter's; the torch.export path's graphs differ
            # (ORTMOD_CAPTURE=export runs the zoo for parity alone)
            torchscript = {r.exported.capture for r in wrapped[0]._ortmod_exports.values()} == {"torchscript"}
            if ZOO[name]["ops"] is not None and _versions_match() and torchscript:
                assert exported_op_types(wrapped[0]) == ZOO[name]["ops"], (
                    f"ZOO[{name!r}]['ops'] is stale: the export uses {exported_op_types(wrapped[0])}")
    if first.outputs:
        # step 0, identical weights: the whole output (logits, hidden states, caches) as eager's
        got, want = _tensors(first.outputs[id(ort)]), _tensors(first.outputs[id(eager)])
        assert len(got) == len(want), f"ORTModule's first output holds {len(got)} tensors, eager's {len(want)}"
        # the fp64 referee's first output, when train_parity needed one (it trains through `first`)
        ref = [_tensors(v) for k, v in first.outputs.items() if k not in (id(ort), id(eager))]
        for i, (g, w) in enumerate(zip(got, want)):
            assert g.shape == w.shape, f"output tensor {i}: shape {tuple(g.shape)} != eager's {tuple(w.shape)}"
            try:
                assert_close(f"first output tensor {i}", g, w)
            except AssertionError:
                if not ref or not g.is_floating_point() or not referee_holds(g, w, ref[0][i]):
                    raise
                print(f"first output tensor {i}: held by the fp64 referee")
        print(f"{name}: first output: {len(got)} tensors match eager's")
    return {r.exported.capture for r in ort._ortmod_exports.values()}
