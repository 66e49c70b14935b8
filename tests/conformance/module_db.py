"""PyTorch's own module test database (torch.testing._internal.common_modules.module_db),
run through ORTModule and compared with eager PyTorch (tests/conformance/harness.py).

    python -m tests.conformance.module_db [--all|--fast] [--samples N] [--json out.json] [modules...]
    python -m tests.conformance.module_db --case 'db:nn.Linear|float32|train|0'   # one case, in-process

Cases: every ModuleInfo, float32 and float64, training mode, plus eval mode where the
ModuleInfo says train and eval differ (batchnorm, instancenorm, transformer, RNN, ...), up to
--samples samples each (spread over the sample list). Case ids are
``db:<module>|<dtype>|<train|eval>|<sample index>``; the index is into the list that
module_inputs_func returns, which is deterministic (its values are seeded here).

Importing common_modules takes ~15 s (it needs ``expecttest``), so workers run many cases each;
the parent process (tests/conformance/runner.py) still sees which case a crash happened in.
"""
import functools
import zlib

import torch

from .harness import Case

PREFIX = "db:"
DTYPES = {"float32": torch.float32, "float64": torch.float64}

# The fast subset (tests/test_conformance.py): diverse module classes that pass, one sample
# each, float32 training. Chosen from a full run; none of them is a known mismatch.
FAST = [
    "nn.Linear", "nn.Conv1d", "nn.Conv2d", "nn.LazyConv2d", "nn.ConvTranspose2d", "nn.BatchNorm2d",
    "nn.MaxPool1d", "nn.MaxPool3d", "nn.LayerNorm", "nn.Embedding", "nn.GELU", "nn.Mish", "nn.GLU",
    "nn.Softplus", "nn.LogSoftmax", "nn.CrossEntropyLoss", "nn.NLLLoss", "nn.KLDivLoss", "nn.BCEWithLogitsLoss",
    "nn.GaussianNLLLoss", "nn.LSTM", "nn.GRUCell", "nn.MultiheadAttention", "nn.Transformer",
    "nn.ReflectionPad2d", "nn.ReplicationPad3d",
    # issue 14's export rules and ops
    "nn.RNN", "nn.RMSNorm", "nn.SmoothL1Loss", "nn.BCELoss", "nn.MultiMarginLoss", "nn.CTCLoss",
    "nn.FractionalMaxPool2d", "nn.AdaptiveMaxPool2d", "nn.LocalResponseNorm", "nn.Bilinear",
]


@functools.lru_cache(maxsize=None)
def _db():
    from torch.testing._internal.common_modules import module_db
    return {mi.name: mi for mi in module_db}


def module_names():
    return list(_db())


def _seed(text):
    return zlib.crc32(text.encode())


def _samples(mi, dtype, training):
    torch.manual_seed(_seed(f"{mi.name}|{dtype}|{training}"))
    return mi.module_inputs_func(mi, device="cpu", dtype=dtype, requires_grad=True, training=training)


def _spread(n, k):
    """Up to k indices spread over range(n): the sample lists put variants in blocks."""
    if k <= 0 or n <= k:
        return list(range(n))
    if k == 1:
        return [0]
    return sorted({round(i * (n - 1) / (k - 1)) for i in range(k)})


def case_ids(names, dtypes=("float32", "float64"), modes=("train", "eval"), samples=5):
    """The case ids for ModuleInfos ``names`` (eval only where train and eval differ)."""
    db = _db()
    ids = []
    for name in names:
        mi = db[name]
        for dt in dtypes:
            if DTYPES[dt] not in mi.dtypes:
                continue
            for mode in modes:
                if mode == "eval" and not mi.train_and_eval_differ:
                    continue
                n = len(_samples(mi, DTYPES[dt], mode == "train"))
                ids += [f"{PREFIX}{name}|{dt}|{mode}|{i}" for i in _spread(n, samples)]
    return ids


def fast_case_ids():
    return [f"{PREFIX}{name}|float32|train|0" for name in FAST]


def build(case_id):
    """The Case for ``case_id``: the module constructed from the sample's constructor_input."""
    name, dt, mode, index = case_id[len(PREFIX):].split("|")
    mi, dtype, training = _db()[name], DTYPES[dt], mode == "train"
    sample = _samples(mi, dtype, training)[int(index)]
    torch.manual_seed(_seed(case_id))
    ctor = sample.constructor_input
    module = mi.module_cls(*ctor.args, **ctor.kwargs)   # as test_modules.py does
    module.to(dtype)
    module.train(training)
    fwd = sample.forward_input
    return Case(case_id, module, (tuple(fwd.args), dict(fwd.kwargs)), dtype, training, desc=sample.desc)


def main(argv=None):
    from . import runner
    return runner.main(argv, source="module_db")


if __name__ == "__main__":
    raise SystemExit(main())
