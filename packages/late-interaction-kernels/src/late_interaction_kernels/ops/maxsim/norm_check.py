"""The one-time warning of ``maxsim(..., normalize=False)`` on queries that are not unit vectors.

ColBERT, ColPali and LateOn score L2-normalised tokens; passing raw encoder outputs with
``normalize=False`` fails nowhere and gives scores on another scale. Like late-interaction-kernels
0.4.5, :func:`late_interaction_kernels.maxsim` (and what calls it: ``autograd.maxsim``,
``MaxSimScorer``) looks at the first eligible call of the process, and only that one: the median
L2 norm of the first 64 query tokens (``Q`` flattened to ``(-1, d)``, masks ignored) outside
``[0.9, 1.1]`` raises a ``UserWarning``. Eligible: ``normalize=False`` and a 3-D ``D`` (the
per-query 4-D layout and ``maxsim_pairs`` are not checked, as in 0.4.5), outside
``torch.compile``, with ``LIK_SUPPRESS_NORM_WARN`` not ``1`` (a call made while it is ``1`` leaves
the check for a later call).

What it costs. The check needs a value on the host: a reduction over at most 64 tokens and one
read, which for a CUDA tensor waits for the stream. A warm call must stay one launch with no
synchronisation (so it can be timed and captured in a CUDA graph), so on device tensors the check
runs only on a call that builds its plan (:mod:`triton_dispatch.launch`: validation, and usually a
compile, already cost far more than the read), never during CUDA-graph capture; a warm call leaves
it pending. CPU tensors are checked on the first eligible call whatever it is: reading them
synchronises with nothing. Once it has run, a call pays one attribute test for it.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

import torch

ENV_VAR = "LIK_SUPPRESS_NORM_WARN"
SAMPLE_TOKENS = 64
NORM_RANGE = (0.9, 1.1)

# frames of these folders are skipped when the warning names its caller
_SKIPPED_DIRS = tuple(
    str(folder) + os.sep for folder in (Path(__file__).parents[2], Path(torch.__file__).parent)
)


class QueryNormCheck:
    """The check's state: ``pending`` until it has run once in this process."""

    def __init__(self) -> None:
        self.pending = True

    def reset(self) -> None:
        """Check again on the next eligible call (tests)."""
        self.pending = True

    def __call__(self, Q: torch.Tensor, D: torch.Tensor, *, building_plan: bool) -> None:
        """Run the check if this call is the one to run it on (see the module's doc)."""
        if D.dim() != 3:
            return
        on_host = Q.device.type == "cpu"
        if not on_host and not building_plan:
            return  # a warm call on a device: no host read here
        if os.environ.get(ENV_VAR, "0") == "1" or torch.compiler.is_compiling():
            return
        if Q.is_cuda and torch.cuda.is_current_stream_capturing():
            return
        self.pending = False
        sample = Q.detach().reshape(-1, Q.shape[-1])[:SAMPLE_TOKENS]
        if sample.numel() == 0:
            return
        median = float(sample.float().norm(dim=-1).median())
        low, high = NORM_RANGE
        if not low <= median <= high:
            warnings.warn(
                "late-interaction-kernels: `maxsim(..., normalize=False)` but Q's median L2 norm "
                f"is {median:.3f} (ColBERT-style models expect ≈1.0). Pass `normalize=True` to "
                "fuse the L2-norm into the kernel, or pre-normalize with "
                "`F.normalize(Q, dim=-1)`. Silence with `LIK_SUPPRESS_NORM_WARN=1`.",
                UserWarning,
                stacklevel=_caller_stacklevel(),
            )


def _caller_stacklevel() -> int:
    """The ``stacklevel`` that names the first caller outside this package and torch (the line
    that called ``maxsim``, ``MaxSimScorer`` or ``autograd.maxsim``)."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(_SKIPPED_DIRS):
        frame, level = frame.f_back, level + 1
    return level


NORM_CHECK = QueryNormCheck()
