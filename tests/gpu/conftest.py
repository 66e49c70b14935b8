"""GPU tests: skipped where torch sees no CUDA device or the CUDA provider is not built."""
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))   # tests/ (oputil, modelparity)

torch = pytest.importorskip("torch")

SO = os.path.join(os.path.dirname(os.path.dirname(HERE)), "ortmod", "libortmod_cuda.so")


def pytest_collection_modifyitems(config, items):
    reason = None
    if not torch.cuda.is_available():
        reason = "no CUDA device"
    elif not os.path.isfile(SO):
        reason = "ortmod/libortmod_cuda.so is not built (make build, where nvcc and cuBLAS are found)"
    if reason:
        for it in items:
            if str(it.fspath).startswith(HERE):
                it.add_marker(pytest.mark.skip(reason=reason))
