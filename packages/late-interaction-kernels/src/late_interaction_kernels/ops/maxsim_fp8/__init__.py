"""FP8 MaxSim inference: quantisation helpers and :func:`maxsim_inference_fp8`.

On CUDA the Triton kernel of :mod:`.kernels` multiplies the stored 8-bit operands on the tensor
cores (``tl.dot`` on float8, which needs compute capability 8.9 or newer: Ada, Hopper, Blackwell);
an older GPU raises ``RuntimeError`` rather than silently running something slower. On CPU and
other devices the scores are computed from the dequantised tokens in PyTorch.
"""

from __future__ import annotations

import torch
import triton

from triton_dispatch import common_device, device_facts, select_backend, uses_triton
from triton_dispatch.launch import KernelLaunch, PlanCache, call_key

from .. import tma
from ..maxsim import maxsim_unchecked
from ..maxsim.buffers import output_buffer
from .reference import dequantize, quantize, valid_scale

__all__ = [
    "FP8_MIN_CAPABILITY",
    "dequantize_fp8_per_tensor",
    "dequantize_fp8_per_token",
    "maxsim_inference_fp8",
    "quantize_fp8_per_tensor",
    "quantize_fp8_per_token",
]

#: Compute capability from which ``tl.dot`` takes float8 operands.
FP8_MIN_CAPABILITY = (8, 9)
_FP8 = tuple(
    dt for dt in (getattr(torch, "float8_e4m3fn", None), getattr(torch, "float8_e5m2", None)) if dt
)


def quantize_fp8_per_tensor(
    X: torch.Tensor, dtype: torch.dtype = torch.float8_e4m3fn
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(X_fp8, scale)`` with one float32 scale (shape ``()``): ``X ≈ X_fp8.float() * scale``,
    the largest ``|X|`` mapped to ``torch.finfo(dtype).max``. ``X`` must be finite (one host
    synchronisation checks it)."""
    _check_quantize_input(X)
    return quantize(X, dtype, per_token=False)


def quantize_fp8_per_token(
    X: torch.Tensor, dtype: torch.dtype = torch.float8_e4m3fn
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(X_fp8, scale)`` with one float32 scale per token (row of the last axis), shape
    ``X.shape[:-1]``; ``X`` is 2-D or 3-D and finite."""
    _check_quantize_input(X)
    if X.dim() not in (2, 3):
        raise ValueError(f"X must be 2-D or 3-D, got shape {tuple(X.shape)}")
    return quantize(X, dtype, per_token=True)


def _check_quantize_input(X) -> None:
    if not isinstance(X, torch.Tensor):
        raise TypeError(f"X must be a floating tensor, got {type(X).__name__}")
    if X.dtype not in _QUANTIZABLE:
        raise TypeError(f"X must be float16, bfloat16, float32 or float64, got {X.dtype}")
    # a NaN or inf has no scale: it would turn every value sharing its scale into NaN
    if X.numel() and not bool(torch.isfinite(X).all()):
        raise ValueError("X must be finite: it holds NaN or inf, which have no FP8 scale")


def dequantize_fp8_per_tensor(X_fp8: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``X_fp8.float() * scale`` (float32)."""
    return dequantize(X_fp8, scale, per_token=False)


def dequantize_fp8_per_token(X_fp8: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``X_fp8.float() * scale[..., None]`` (float32)."""
    return dequantize(X_fp8, scale, per_token=True)


_QUANTIZABLE = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _batch(x: torch.Tensor, scale: torch.Tensor, name: str):
    if not isinstance(x, torch.Tensor) or x.dim() not in (2, 3):
        raise ValueError(f"{name} must be [N, L, d] or [L, d]")
    if not isinstance(scale, torch.Tensor):
        raise TypeError(f"scale_{name} must be a float32 tensor")
    squeeze = x.dim() == 2
    if squeeze:
        x = x.unsqueeze(0)
        scale = scale.unsqueeze(0) if scale.dim() >= 1 and scale.numel() > 1 else scale
    if scale.numel() == 1 and scale.dim() < 2:
        scale = scale.reshape(())
    elif tuple(scale.shape) != tuple(x.shape[:2]):
        raise ValueError(
            f"scale_{name} must be a per-tensor scale (one element) or per-token "
            f"{tuple(x.shape[:2])}, got shape {tuple(scale.shape)}"
        )
    return x, scale.to(dtype=torch.float32).contiguous(), squeeze


def _mask(mask, shape, name):
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"{name} must be a bool tensor of shape {shape}, got {type(mask).__name__}")
    if mask.dim() == len(shape) - 1:
        mask = mask.unsqueeze(0)
    if mask.dtype != torch.bool or tuple(mask.shape) != shape:
        raise ValueError(f"{name} must be a bool tensor of shape {shape}")
    return mask


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

#: Programs per SM the kernel's grid aims for; each takes a run of documents (H100: 8 to 32 per
#: SM measure the same, 2 and 4 are slower on batches of queries).
PROGRAMS_PER_SM = 8
#: Documents of at most this many 64-token tiles run as one flat (document, tile) loop (H100,
#: per-token scales: 1.34x faster at 300 tokens; at 1024 tokens the nested loop is 1.6x faster).
FLAT_MAX_TILES = 8
#: The TMA kernel's config (H100 sweep at 1 × 10,000 × 32 × 300: 64-token tiles, 4 warps and 3
#: stages were the fastest; 128-token tiles, 8 warps and 4 stages slower).
TMA_BLOCK_D = 64
TMA_OPTIONS = dict(num_warps=4, num_stages=3)
#: Programs per SM of the TMA kernel (same sweep: 4 per SM fastest, 8 and 16 about 2 % slower).
TMA_PROGRAMS_PER_SM = 4


def _resolve(Q, D, scale_Q, scale_D, q_mask, d_mask, backend):
    """Every metadata check: batched ``Q``, ``D``, their float32 scales on the device, masks, and
    the backend."""
    Q, sq, _ = _batch(Q, scale_Q, "Q")
    D, sd, _ = _batch(D, scale_D, "D")
    if Q.shape[-1] != D.shape[-1]:
        raise ValueError(
            f"Q and D must share the embedding dim; got {Q.shape[-1]} vs {D.shape[-1]}."
        )
    if Q.dtype != D.dtype:
        raise TypeError(f"Q and D must share one dtype, got {Q.dtype} and {D.dtype}")
    q_mask = _mask(q_mask, tuple(Q.shape[:2]), "q_mask")
    d_mask = _mask(d_mask, tuple(D.shape[:2]), "d_mask")
    # a one-element scale may stay on the host, like a Python number; anything else shares Q's device
    named = {"Q": Q, "D": D, "q_mask": q_mask, "d_mask": d_mask}
    named.update(
        (name, s)
        for name, s in (("scale_Q", sq), ("scale_D", sd))
        if s.dim() or s.device.type != "cpu"
    )
    device = common_device(named.values(), names=named.keys())
    # No value check here (it would cost a host synchronisation per call): a scale that is
    # negative, NaN or infinite makes the scores that use it NaN, on every backend.
    sq, sd = sq.to(device), sd.to(device)
    chosen = select_backend(device=device, backend=backend)
    is_fp8 = Q.dtype in _FP8
    if chosen == "triton" and not is_fp8:
        raise TypeError(f"Q and D must be float8 tensors on CUDA, got {Q.dtype}")
    if chosen == "triton":
        found = device_facts(Q.device).capability
        if found < FP8_MIN_CAPABILITY:
            raise RuntimeError(
                f"FP8 MaxSim needs a GPU of compute capability >= 8.9 (float8 tl.dot); "
                f"{device_facts(Q.device).name} is {found[0]}.{found[1]}. Score the bf16 "
                "embeddings with late_interaction_kernels.maxsim instead."
            )
    return Q, D, sq, sd, q_mask, d_mask, chosen


def _squeezed(scores, Q, D):
    if Q.dim() == 2:
        scores = scores.squeeze(0)
    if D.dim() == 2:
        scores = scores.squeeze(-1)
    return scores


def _score(Q, D, scale_Q, scale_D, q_mask, d_mask, backend) -> torch.Tensor:
    """The validating path, on every backend."""
    Qb, Db, sq, sd, qm, dm, chosen = _resolve(Q, D, scale_Q, scale_D, q_mask, d_mask, backend)
    with torch.no_grad():
        if uses_triton(chosen) and (chosen == "triton" or Qb.dtype not in _FP8):
            scores = _launch(Qb, Db, sq, sd, qm, dm)
        else:
            Qd = dequantize(Qb, valid_scale(sq), per_token=sq.dim() > 0)
            Dd = dequantize(Db, valid_scale(sd), per_token=sd.dim() > 0)
            scores = maxsim_unchecked(Qd, Dd, qm, dm, backend="torch")
    return _squeezed(scores, Q, D)


def _uses_tma(Q, D, sd) -> bool:
    """Whether the documents go through the TMA kernel: on Hopper, short documents (the flat loop)
    with one scale for all of ``D``, 16-byte rows, coordinates that fit in int32. (H100: at
    1 × 1000 × 128 × 1024 the pointer kernel measured faster, and with per-token document scales
    at 1 × 10,000 × 32 × 300 too: 0.184 against 0.205 ms.)"""
    from triton_dispatch import interpreter_enabled

    nd, ld, dim = D.shape
    tile = 16 if interpreter_enabled() else TMA_BLOCK_D
    return (
        triton.cdiv(ld, tile) <= FLAT_MAX_TILES
        and sd.dim() == 0
        and tma.rows_fit(dim, D.element_size(), nd * ld)
        and tma.tma_supported(D.device)
    )


def _geometry(
    Q, D, sq, sd, q_mask, d_mask, use_tma=False
) -> tuple[dict, tuple[int, int], int, int]:
    """The kernel's bound arguments, its grid, the query blocks and the output rows; ``use_tma``: for
    :func:`.kernels.fp8_maxsim_tma_kernel` (its tile fixed, its own programs per SM)."""
    from triton_dispatch import interpreter_enabled, next_power_of_2, padded_dim

    nq, lq, dim = Q.shape
    nd, ld, _ = D.shape
    interp = interpreter_enabled()
    # fp8 dots need K >= 32 on the tensor cores
    block_k = max(padded_dim(dim), 32)
    block_q = 16 if interp else min(max(padded_dim(lq), 16), 128)
    query_blocks = triton.cdiv(lq, block_q)
    # short queries share a program (up to 128 stacked token rows): the documents are read once
    # per group of queries, not once per query
    queries = 1 if query_blocks > 1 else min(next_power_of_2(nq), max(128 // block_q, 1))
    groups = triton.cdiv(nq, queries) * query_blocks
    if interp:
        runs = min(nd, 3)
    else:
        per_sm = TMA_PROGRAMS_PER_SM if use_tma else PROGRAMS_PER_SM
        target = per_sm * device_facts(Q.device).sm_count
        runs = max(1, min(nd, triton.cdiv(target, groups)))
    per_run = triton.cdiv(nd, runs)
    flat = triton.cdiv(ld, 64 if not interp else 16) <= FLAT_MAX_TILES
    bound = dict(
        nq=nq, nd=nd, lq=lq, ld=ld, dim=dim, docs_per_prog=per_run,
        Q_PER_TOKEN=sq.dim() > 0, D_PER_TOKEN=sd.dim() > 0, HAS_QM=q_mask is not None,
        HAS_DM=d_mask is not None, IEEE=Q.dtype == torch.float32, FLAT=flat, QUERIES=queries,
        BLOCK_Q=block_q, BLOCK_K=block_k,
    )  # fmt: skip
    if use_tma:
        bound["BLOCK_D"] = 16 if interp else TMA_BLOCK_D
    else:
        # short documents with per-token scales: (document tokens, query rows) tiles (H100,
        # 1 × 10,000 × 32 × 300: 0.150 against 0.175 ms); long documents keep (query rows,
        # document tokens), 0.070 against 0.075 ms at 1 × 1000 × 128 × 1024
        bound["TRANS"] = flat and sd.dim() > 0
    rows = nq * query_blocks
    return bound, (groups, triton.cdiv(nd, per_run)), query_blocks, rows


def _tma_options() -> dict:
    from triton_dispatch import interpreter_enabled

    return {} if interpreter_enabled() else TMA_OPTIONS


def _descriptor(D: torch.Tensor, bound: dict):
    return tma.rows_descriptor(D, bound["dim"], [bound["BLOCK_D"], bound["BLOCK_K"]])


def _launch(Q, D, sq, sd, q_mask, d_mask) -> torch.Tensor:
    from .kernels import fp8_maxsim_kernel, fp8_maxsim_tma_kernel

    nq, lq, _ = Q.shape
    nd, ld, _ = D.shape
    out = output_buffer((nq, nd), dtype=torch.float32, device=Q.device)
    if nq == 0 or nd == 0:
        return out
    if lq == 0 or ld == 0:
        return out.zero_()
    Qc, Dc = Q.contiguous(), D.contiguous()
    qm = Qc if q_mask is None else q_mask.contiguous().view(torch.uint8)
    dm = Dc if d_mask is None else d_mask.contiguous().view(torch.uint8)
    use_tma = _uses_tma(Qc, Dc, sd) and tma.aligned(Dc)
    bound, grid, query_blocks, rows = _geometry(Qc, Dc, sq, sd, q_mask, d_mask, use_tma)
    partial = out if query_blocks == 1 else torch.empty(rows, nd, device=Q.device)
    scales = (sq.contiguous(), sd.contiguous())
    if use_tma:
        desc = _descriptor(Dc, bound)
        fp8_maxsim_tma_kernel[grid](
            Qc, Dc, desc, *scales, qm, dm, partial, **bound, **_tma_options()
        )
    else:
        fp8_maxsim_kernel[grid](Qc, Dc, *scales, qm, dm, partial, **bound)
    return out if query_blocks == 1 else torch.sum(partial.view(nq, query_blocks, nd), 1, out=out)


def _plan(Q, D, scale_Q, scale_D, q_mask, d_mask, backend):
    """The eager plan of a validated call: contiguous float8 inputs on CUDA bind the kernel's
    launch (grid, tuned config and constexprs fixed); everything else runs :func:`_score`."""
    Qb, Db, sq, sd, qm, dm, chosen = _resolve(Q, D, scale_Q, scale_D, q_mask, d_mask, backend)
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
    bound, grid, query_blocks, rows = _geometry(Qb, Db, sq, sd, qm, dm)
    launch = KernelLaunch(fp8_maxsim_kernel, grid, bound, device=device)
    tma_launch = None
    if _uses_tma(Qb, Db, sd):
        tma_bound, tma_grid, _, _ = _geometry(Qb, Db, sq, sd, qm, dm, use_tma=True)
        tma_launch = KernelLaunch(
            fp8_maxsim_tma_kernel, tma_grid, tma_bound, device=device, options=_tma_options()
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
            desc = _descriptor(D, tma_bound)
            tma_launch(Q, D, desc, scale_Q, scale_D, qm, dm, out)
        else:
            launch(Q, D, scale_Q, scale_D, qm, dm, out)
        if query_blocks > 1:
            out = out.view(nq, query_blocks, nd).sum(1)
        return _squeezed(out, Q, D)

    return run
