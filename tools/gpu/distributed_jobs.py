"""The distributed benchmark jobs: each script, its process count, arguments and time limit.

``tools/gpu/multi_gpu.py`` runs them under ``torchrun``; ``tools/gpu/run.py`` leaves them out.
"""

from __future__ import annotations

from pathlib import Path

from harness import ROOT

LIK = ROOT / "packages" / "late-interaction-kernels" / "benchmarks"
VQ = ROOT / "packages" / "vq-kernels" / "benchmarks"
TOMO = ROOT / "packages" / "tomo-kplanes" / "benchmarks"

#: name -> (script, processes, extra arguments, timeout in seconds)
JOBS: dict[str, tuple[Path, int, list[str], int]] = {
    "lik-sharded-speed-1": (LIK / "sharded_retrieval.py", 1, ["--mode", "speed"], 240),
    "lik-sharded-speed-2": (LIK / "sharded_retrieval.py", 2, ["--mode", "speed"], 240),
    "lik-sharded-big-2": (LIK / "sharded_retrieval.py", 2, ["--mode", "big"], 300),
    "lik-cross-rank-2": (LIK / "cross_rank_contrastive.py", 2, [], 240),
    "vq-ddp-1": (VQ / "ddp_step.py", 1, [], 180),
    "vq-ddp-2": (VQ / "ddp_step.py", 2, [], 180),
    "tomo-ddp-1": (TOMO / "ddp_step.py", 1, [], 180),
    "tomo-ddp-2": (TOMO / "ddp_step.py", 2, [], 180),
    "tomo-ddp-8k-1": (TOMO / "ddp_step.py", 1, ["--rays", "8192", "--steps", "100"], 180),
    "tomo-ddp-8k-2": (TOMO / "ddp_step.py", 2, ["--rays", "8192", "--steps", "100"], 180),
}

#: Scripts that take ``--profile`` (where each rank's step time goes).
PROFILED = {VQ / "ddp_step.py", LIK / "cross_rank_contrastive.py", TOMO / "ddp_step.py"}

#: Scripts that only run under torchrun (``tools/gpu/run.py`` leaves them to this runner).
DISTRIBUTED_SCRIPTS = {script for script, *_ in JOBS.values()}
