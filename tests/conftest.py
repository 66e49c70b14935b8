import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import torch  # noqa: E402


@pytest.fixture(autouse=True)
def seeded():
    """Every test starts from the same torch RNG state (and leaves grad mode as it found it)."""
    torch.manual_seed(0)
    grad = torch.is_grad_enabled()
    yield 0
    torch.set_grad_enabled(grad)
