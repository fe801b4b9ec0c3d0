"""The compile worker compiles once per distinct kernel: launches that differ only in what Triton
does not specialise on (an integer's exact value, past its width and divisibility by 16) share a
compile; anything Triton does specialise on keeps its own."""

from types import SimpleNamespace

import pytest

from triton_dispatch import compile_worker


def _kernel():
    params = [
        SimpleNamespace(name="x_ptr", is_constexpr=False),
        SimpleNamespace(name="n", is_constexpr=False),
        SimpleNamespace(name="BLOCK", is_constexpr=True),
    ]
    return SimpleNamespace(params=params, do_not_specialize=[])


def _job(n: int, block: int = 64, dtype: str = "fp32", capability: int = 90) -> tuple:
    described = {"x_ptr": ["ptr", dtype], "n": ["int", n], "BLOCK": ["int", block]}
    return ("kernels", "k", described, {"num_warps": 4}, capability, "llir")


@pytest.fixture
def compiled(monkeypatch):
    """The jobs compile_jobs really compiled (in this process: one CPU)."""
    done = []
    monkeypatch.setattr(compile_worker, "_jit_function", lambda module, name: _kernel())
    monkeypatch.setattr(compile_worker.os, "cpu_count", lambda: 1)

    def fake_compile(job):
        done.append(job)
        return {"shared": len(done)}

    monkeypatch.setattr(compile_worker, "compile_job", fake_compile)
    return done


def test_sizes_triton_does_not_specialise_on_share_one_compile(compiled):
    jobs = [_job(32), _job(4096), _job(33), _job(35), _job(2**40), _job(32, block=128),
            _job(32, dtype="bf16"), _job(32, capability=80), _job(0)]  # fmt: skip
    results = compile_worker.compile_jobs(jobs)
    # 32 and 4096 (i32, divisible by 16); 33 and 35 (i32, not); 2**40 (i64, divisible): one
    # compile each; block size, dtype and target each their own; 0 never divides
    assert [r["shared"] for r in results] == [1, 1, 2, 2, 3, 4, 5, 6, 2]
    assert len(compiled) == 6


def test_a_job_whose_kernel_cannot_be_read_compiles_on_its_own(compiled, monkeypatch):
    def missing(module, name):
        raise ImportError(module)

    monkeypatch.setattr(compile_worker, "_jit_function", missing)
    results = compile_worker.compile_jobs([_job(32), _job(32)])
    assert [r["shared"] for r in results] == [1, 2]


def test_the_allocation_stop_reads_the_shared_memory_of_the_whole_compile():
    """The ``llir`` check stops the LLVM-IR stage once Triton's allocation passes have run; the
    bytes it reads are those the whole compile (``ptxas`` included) reports, on a kernel whose
    pipelined tiles fill shared memory, for an ``mma.sync`` and a ``wgmma`` target."""
    import sys
    from pathlib import Path

    from triton_dispatch.compile_check import unavailable_reason
    from triton_dispatch.gpu_targets import compile_for_targets, describe_launch, target_of

    if unavailable_reason() is not None:
        pytest.skip(unavailable_reason())
    here = str(Path(__file__).parent)
    sys.path.insert(0, here)
    try:
        import target_kernels as kernels

        launches = [
            (*describe_launch(kernels.tile_dot_kernel, kernels.launch(c.kwargs["BLOCK_K"])),
             {"num_warps": c.num_warps, "num_stages": c.num_stages})
            for c in kernels.SPACE if (c.kwargs["BLOCK_K"], c.num_stages) in {(64, 3), (128, 2)}
        ]  # fmt: skip
        targets = [target_of((8, 0)), target_of((9, 0))]
        stopped = compile_for_targets(launches, targets, through="llir")
        whole = compile_for_targets(launches, targets, through="cubin")
    finally:
        sys.path.remove(here)
        sys.modules.pop("target_kernels", None)
    assert len(stopped) == len(whole) == 4
    assert all(u.shared for u in stopped)
    assert [u.shared for u in stopped] == [u.shared for u in whole]
