"""Pytest plugin shared by the workspace's test suites.

Load it with ``-p triton_dispatch.pytest_plugin`` or ``pytest_plugins = [...]`` in a root
``conftest.py``. On import it sets ``TRITON_INTERPRET=1`` when no CUDA device is present, before any
kernel module imports Triton, so kernels run in the interpreter on CPU tensors. It registers the
``gpu`` and ``slow`` markers, skips ``gpu`` tests without CUDA, and provides the ``seed`` and ``rng``
fixtures (fresh random inputs each session, reproducible with ``--seed N``) and ``three_threads``.
"""

from __future__ import annotations

import os
import random

import pytest


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _cuda_device_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


if "TRITON_INTERPRET" not in os.environ and not _cuda_available():
    os.environ["TRITON_INTERPRET"] = "1"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--seed",
        type=int,
        default=None,
        help="session seed for random test inputs (default: fresh each run; printed in the header)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skipped without one)")
    config.addinivalue_line("markers", "slow: long-running; deselect with -m 'not slow'")
    config.addinivalue_line("markers", "multigpu: needs two CUDA devices (skipped with fewer)")
    seed = config.getoption("--seed")
    # a pytest-xdist worker gets its controller's seed
    worker_input = getattr(config, "workerinput", None)
    if seed is None and worker_input is not None and _WORKER_SEED in worker_input:
        seed = int(worker_input[_WORKER_SEED])  # one session seed over every worker
    if worker_input is not None and "OMP_NUM_THREADS" not in os.environ:
        _share_the_cores(int(worker_input.get("workercount", 1)))
    if seed is None:
        seed = int(
            os.environ.get("TRITON_DISPATCH_TEST_SEED", random.SystemRandom().randrange(2**31))
        )
    config.stash[_SEED_KEY] = seed


_WORKER_SEED = "triton_dispatch_seed"


def _share_the_cores(workers: int) -> None:
    """One of ``workers`` parallel test processes takes its share of the cores for PyTorch's
    intra-op threads, instead of every process starting one thread per core."""
    import torch

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, workers)))


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """pytest-xdist: hand the controller's session seed to each worker, so that the seed the
    header prints reproduces every test of a parallel run."""
    node.workerinput[_WORKER_SEED] = node.config.stash[_SEED_KEY]


_SEED_KEY = pytest.StashKey[int]()


def pytest_report_header(config: pytest.Config) -> str:
    from .backend import interpreter_enabled

    mode = (
        "Triton interpreter (CPU)"
        if interpreter_enabled()
        else ("CUDA" if _cuda_available() else "torch only")
    )
    return f"triton-dispatch: kernels via {mode}; random inputs --seed {config.stash[_SEED_KEY]}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpus = _cuda_device_count()
    no_gpu = pytest.mark.skip(reason="needs a CUDA device")
    one_gpu = pytest.mark.skip(reason="needs two CUDA devices")
    for item in items:
        if "gpu" in item.keywords and gpus == 0:
            item.add_marker(no_gpu)
        elif "multigpu" in item.keywords and gpus < 2:
            item.add_marker(one_gpu)


@pytest.fixture
def three_threads(monkeypatch: pytest.MonkeyPatch):
    """A caller running 3 PyTorch threads without ``OMP_NUM_THREADS`` (which would keep them): a
    count a block that pins its threads cannot keep by chance (the demos' tests)."""
    import torch

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def seed(request: pytest.FixtureRequest) -> int:
    """A per-test seed derived from the session seed and the test's id."""
    from .testing import seed_for

    return seed_for(request.config.stash[_SEED_KEY], request.node.nodeid)


@pytest.fixture
def rng(seed: int):
    """A CPU ``torch.Generator`` seeded with :func:`seed`."""
    from .testing import generator

    return generator(seed)


@pytest.fixture
def device() -> str:
    """``"cuda"`` when a GPU is present, else ``"cpu"`` (where kernels run in the interpreter)."""
    return "cuda" if _cuda_available() else "cpu"
