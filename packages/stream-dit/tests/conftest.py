import sys
from pathlib import Path

import pytest
import torch

from stream_dit.model import build_model

# --import-mode=importlib leaves sys.path alone; the shared test helpers live beside the tests
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def tiny_model():
    return build_model("tiny", seed=0)


def cond(gen: torch.Generator, length: int, dim: int = 32) -> torch.Tensor:
    return torch.randn(length, dim, generator=gen)
