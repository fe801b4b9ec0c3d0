"""The demo helpers: pinned PyTorch threads (restored after, also on an error) and the words that
say where a demo's time was taken."""

import pytest
import torch

from triton_dispatch.demo import pinned_threads, timing_conditions


def test_cpu_block_runs_on_one_thread_and_the_callers_count_comes_back(three_threads):
    with pinned_threads("cpu") as threads:
        assert threads == 1 and torch.get_num_threads() == 1
    assert torch.get_num_threads() == 3


def test_the_callers_count_comes_back_after_an_error(three_threads):
    with pytest.raises(RuntimeError, match="boom"), pinned_threads(torch.device("cpu"), 2):
        assert torch.get_num_threads() == 2
        raise RuntimeError("boom")
    assert torch.get_num_threads() == 3


def test_omp_num_threads_keeps_pytorchs_choice(three_threads, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    with pinned_threads("cpu") as threads:
        assert threads == 3 and torch.get_num_threads() == 3


def test_other_devices_leave_the_host_threads_alone(three_threads):
    with pinned_threads("cuda:0") as threads:
        assert threads is None and torch.get_num_threads() == 3


@pytest.mark.parametrize("threads", [0, -1, True, 1.5, "2"])
def test_bad_thread_counts_are_refused(threads):
    block = pinned_threads("cpu", threads)
    with pytest.raises(ValueError, match="threads must be a positive integer"):
        block.__enter__()


def test_timing_conditions_name_threads_and_device():
    assert timing_conditions("cpu", 1) == "1 thread, CPU"
    assert timing_conditions(torch.device("cpu"), 4) == "4 threads, CPU"
    assert timing_conditions("mps", None) == "MPS"
