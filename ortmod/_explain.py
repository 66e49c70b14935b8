"""ortmod.explain: what the engine made of a module — passes, fusions, kernels, memory."""
import copy

import torch

from ._module import ORTModule
from ._report import Report, engine_reports


def explain(module, *args, print_report=True, **kwargs):
    """Compiles ``module`` for these example inputs (a copy of it, unless it is already an
    ORTModule), runs one forward so that a plan exists, and returns (and prints) a report:
    node counts before and after each pass, where fusions fired, ops by kind, kernels per
    step and planned memory (peak, stash, largest buffers)."""
    model = module if isinstance(module, ORTModule) else ORTModule(copy.deepcopy(module))
    with torch.random.fork_rng():
        model(*args, **kwargs)
    report = Report(engine_reports(model))
    if print_report:
        print(report)
    return report
