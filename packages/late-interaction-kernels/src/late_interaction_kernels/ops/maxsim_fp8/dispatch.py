"""``maxsim_inference_fp8``: the plan cache of eager calls, the kernels on CUDA and the
dequantised PyTorch path elsewhere."""

from __future__ import annotations

import torch

from triton_dispatch import uses_triton
from triton_dispatch.launch import KernelLaunch, PlanCache, call_key

from ..common import tma
from ..maxsim import maxsim_unchecked
from .launch import descriptor, geometry, launch_maxsim_fp8, tma_options, uses_tma
from .reference import dequantize, valid_scale
from .validation import FP8_DTYPES, resolve_call


def maxsim_inference_fp8(
    Q: torch.Tensor,
    D: torch.Tensor,
    *,
    scale_Q: torch.Tensor,
    scale_D: torch.Tensor,
    q_mask: torch.Tensor | None = None,
    d_mask: torch.Tensor | None = None,
    backend: str | None = None,
) -> torch.Tensor:
    """MaxSim scores of quantised queries and documents (inference only).

    Args:
        Q: ``(Nq, Lq, d)`` or ``(Lq, d)``, ``torch.float8_e4m3fn`` (or ``float8_e5m2``).
        D: ``(Nd, Ld, d)`` or ``(Ld, d)`` in the same dtype.
        scale_Q, scale_D: float32, one element (per tensor) or ``(N, L)`` (per token), as
            returned by the ``quantize_fp8_*`` functions. A scale that is negative, NaN or
            infinite makes every score that uses it NaN (values are not checked: that would
            synchronise with the host on every call).
        q_mask, d_mask: bool masks, True = valid token (rules of ``maxsim``).
        backend: keyword-only addition: ``"triton"``, ``"interpret"`` or ``"torch"``. The
            interpreter has no 8-bit floats: there the kernel takes fp16/fp32 stand-ins and
            8-bit inputs are scored in PyTorch.

    Returns:
        float32 ``(Nq, Nd)``, squeezed for 2-D inputs.

    Raises:
        RuntimeError: CUDA tensors on a GPU below compute capability 8.9 (no float8 ``tl.dot``).
    """
    if not torch.compiler.is_compiling():
        key = call_key((Q, D, scale_Q, scale_D, q_mask, d_mask), backend)
        if key is not None:
            plan = _PLANS.get(key, lambda: _plan(Q, D, scale_Q, scale_D, q_mask, d_mask, backend))
            return plan(Q, D, scale_Q, scale_D, q_mask, d_mask)
    return _score(Q, D, scale_Q, scale_D, q_mask, d_mask, backend)


_PLANS: PlanCache = PlanCache("late_interaction_kernels.maxsim_inference_fp8")


def _squeezed(scores, Q, D):
    if Q.dim() == 2:
        scores = scores.squeeze(0)
    if D.dim() == 2:
        scores = scores.squeeze(-1)
    return scores


def _score(Q, D, scale_Q, scale_D, q_mask, d_mask, backend) -> torch.Tensor:
    """The validating path, on every backend."""
    Qb, Db, sq, sd, qm, dm, chosen = resolve_call(Q, D, scale_Q, scale_D, q_mask, d_mask, backend)
    with torch.no_grad():
        if uses_triton(chosen) and (chosen == "triton" or Qb.dtype not in FP8_DTYPES):
            scores = launch_maxsim_fp8(Qb, Db, sq, sd, qm, dm)
        else:
            Qd = dequantize(Qb, valid_scale(sq), per_token=sq.dim() > 0)
            Dd = dequantize(Db, valid_scale(sd), per_token=sd.dim() > 0)
            scores = maxsim_unchecked(Qd, Dd, qm, dm, backend="torch")
    return _squeezed(scores, Q, D)


def _plan(Q, D, scale_Q, scale_D, q_mask, d_mask, backend):
    """The eager plan of a validated call: contiguous float8 inputs on CUDA bind the kernel's
    launch (grid, tuned config and constexprs fixed); everything else runs :func:`_score`."""
    Qb, Db, sq, sd, qm, dm, chosen = resolve_call(Q, D, scale_Q, scale_D, q_mask, d_mask, backend)
    nq, lq, _ = Qb.shape
    nd, ld, _ = Db.shape
    direct = (
        chosen == "triton"
        and nq * nd * lq * ld > 0
        and all(t.is_contiguous() for t in (Q, D, scale_Q, scale_D))
        and all(m is None or m.is_contiguous() for m in (q_mask, d_mask))
    )
    if not direct:
        return lambda Q, D, scale_Q, scale_D, q_mask, d_mask: _score(
            Q, D, scale_Q, scale_D, q_mask, d_mask, backend
        )
    from .kernels import fp8_maxsim_kernel, fp8_maxsim_tma_kernel

    device = Qb.device
    bound, grid, query_blocks, rows = geometry(Qb, Db, sq, sd, qm, dm)
    launch = KernelLaunch(fp8_maxsim_kernel, grid, bound, device=device)
    tma_launch = None
    if uses_tma(Qb, Db, sd):
        tma_bound, tma_grid, _, _ = geometry(Qb, Db, sq, sd, qm, dm, use_tma=True)
        tma_launch = KernelLaunch(
            fp8_maxsim_tma_kernel, tma_grid, tma_bound, device=device, options=tma_options()
        )
    # scales already on the device in float32 are read in place; others are moved per call
    moves = [s.device != device or s.dtype != torch.float32 for s in (scale_Q, scale_D)]
    shape = (nq, nd) if query_blocks == 1 else (rows, nd)

    def run(Q, D, scale_Q, scale_D, q_mask, d_mask):
        if moves[0]:
            scale_Q = scale_Q.to(device=device, dtype=torch.float32)
        if moves[1]:
            scale_D = scale_D.to(device=device, dtype=torch.float32)
        out = torch.empty(shape, device=device)
        qm = Q if q_mask is None else q_mask.view(torch.uint8)
        dm = D if d_mask is None else d_mask.view(torch.uint8)
        if tma_launch is not None and tma.aligned(D):
            desc = descriptor(D, tma_bound)
            tma_launch(Q, D, desc, scale_Q, scale_D, qm, dm, out)
        else:
            launch(Q, D, scale_Q, scale_D, qm, dm, out)
        if query_blocks > 1:
            out = out.view(nq, query_blocks, nd).sum(1)
        return _squeezed(out, Q, D)

    return run
