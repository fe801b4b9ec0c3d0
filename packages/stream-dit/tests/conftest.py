import sys
from pathlib import Path

import pytest
import torch

from stream_dit.model import build_model
from stream_dit.ray_env import keep_ray_on_loopback, keep_ray_workers_in_this_environment

# Ray reads both when it is imported, and test modules import it as they are collected
keep_ray_on_loopback()
keep_ray_workers_in_this_environment()

# --import-mode=importlib leaves sys.path alone; the shared test helpers live beside the tests
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def tiny_model():
    return build_model("tiny", seed=0)


def cond(gen: torch.Generator, length: int, dim: int = 32) -> torch.Tensor:
    return torch.randn(length, dim, generator=gen)
