"""``quantize``: the nearest code(s) of each row, with distance and argmin fused (no ``(B, K)``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from triton_dispatch import common_device, select_backend, uses_triton
from triton_dispatch.launch import PlanCache, call_key

from .._validation import require_float, require_tensor
from .reference import METRICS, quantize_reference

__all__ = ["METRICS", "check_search", "quantize"]


def _nearest_code_impl(
    x: torch.Tensor, codebook: torch.Tensor, metric: str, backend: str
) -> torch.Tensor:
    if x.shape[0] == 0:
        return torch.empty(0, dtype=torch.int64, device=x.device)
    if uses_triton(backend) and x.dtype != torch.float64:
        from .kernels import nearest_code

        cb = codebook.to(x.dtype)
        if x.stride(-1) != 1:
            x = x.contiguous()
        if cb.stride(-1) != 1:
            cb = cb.contiguous()
        # One launch for the per-code term; the kernel turns ‖c‖ into ‖c‖² or 1/‖c‖.
        norms = torch.linalg.vector_norm(cb, dim=-1, dtype=torch.float32)
        return nearest_code(x, cb, norms, metric)
    return quantize_reference(x, codebook.to(x.dtype), metric, 1)


_nearest_code_op = torch.library.custom_op("vq_kernels::nearest_code", mutates_args=())(
    _nearest_code_impl
)


@_nearest_code_op.register_fake
def _(x, codebook, metric, backend):
    return x.new_empty(x.shape[0], dtype=torch.int64)


def quantize(
    x: torch.Tensor,
    codebook: torch.Tensor,
    *,
    metric: str = "l2",
    k: int = 1,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Nearest code(s) of every row of ``x (..., D)`` in ``codebook (K, D)``.

    Returns ``(codes, quantized)``: for ``k = 1`` ``codes (...)`` int64 and ``quantized (..., D)``;
    for ``k > 1`` ``codes (..., k)`` nearest first and ``quantized (..., k, D)``. ``quantized`` is a
    gather of codebook rows (``F.embedding``), so it carries gradients to the codebook but not to
    ``x``: the search itself is not differentiable. Straight-through estimation and the commitment
    loss belong to the module (:class:`vq_kernels.VectorQuantizer`).

    ``metric="l2"`` ranks by Euclidean distance, ``"cosine"`` by cosine similarity (largest first).
    Inputs may be fp32, fp16 or bf16 (fp64 runs the reference); the codebook is cast to ``x``'s
    dtype for the products, which accumulate in fp32. On CUDA, fp32 products run on tensor cores
    as three TF32 products (``tf32x3``, about fp32's own rounding error), or as plain TF32 when
    ``torch.backends.cuda.matmul.allow_tf32`` is set. Ties go
    to the lowest index, as with ``torch.argmin``; codes whose distances differ by less than the
    rounding of the arithmetic may be ranked differently than a float64 computation would rank
    them. A row holding NaN maps to code 0.

    ``k = 1`` runs the fused Triton kernel on CUDA (memory independent of ``K``); ``k > 1`` runs a
    chunked PyTorch search (``O(B · 4096)`` memory) on every backend.
    """
    if not torch.compiler.is_compiling():
        key = call_key((x, codebook), metric, k, backend)
        if key is not None:
            return _PLANS.get(key, lambda: _plan(x, codebook, metric, k, backend))(x, codebook)
    return _quantize(x, codebook, metric, k, backend)


_PLANS: PlanCache = PlanCache("vq_kernels.quantize")


def check_search(x, codebook, metric, backend, *, name: str = "codebook", stacked: bool = False):
    """The metadata checks of a nearest-code search: ``x (..., D)``, a codebook ``(K, D)`` (or with
    ``stacked`` codebooks ``(L, K, D)``) with at least one code, float dtypes, the metric, one
    device. Returns the backend; errors name the argument (the codebook as ``name``)."""
    require_tensor("x", x)
    require_tensor(name, codebook)
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
    if x.dim() < 1:
        raise ValueError("x must have at least one dimension (..., D)")
    shape = "(L, K, D) with L, K >= 1" if stacked else "(K, D) with K >= 1"
    if codebook.dim() != (3 if stacked else 2) or min(codebook.shape[:-1]) == 0:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(codebook.shape)}")
    if x.shape[-1] != codebook.shape[-1]:
        raise ValueError(
            f"x's last dimension ({x.shape[-1]}) must equal D of {name} ({codebook.shape[-1]})"
        )
    require_float("x", x)
    require_float(name, codebook)
    return select_backend(device=common_device([x, codebook], names=["x", name]), backend=backend)


def _check(x, codebook, metric, k, backend) -> str:
    """Every metadata check of :func:`quantize`; returns the backend."""
    chosen = check_search(x, codebook, metric, backend)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= codebook.shape[0]:
        raise ValueError(f"k must be an int in [1, K={codebook.shape[0]}], got {k!r}")
    return chosen


def _quantize(x, codebook, metric, k, backend) -> tuple[torch.Tensor, torch.Tensor]:
    chosen = _check(x, codebook, metric, k, backend)
    lead = x.shape[:-1]
    flat = x.detach().reshape(-1, x.shape[-1])
    if k == 1:
        # Eager calls skip the custom-op dispatcher; traced calls need the registered op.
        search = _nearest_code_op if torch.compiler.is_compiling() else _nearest_code_impl
        codes = search(flat, codebook.detach(), metric, chosen)
        return codes.view(lead), F.embedding(codes, codebook).view(*lead, codebook.shape[1])
    codes = quantize_reference(flat, codebook.detach().to(flat.dtype), metric, k)
    quantized = F.embedding(codes, codebook)
    return codes.view(*lead, k), quantized.view(*lead, k, codebook.shape[1])


def _plan(x, codebook, metric, k, backend):
    """The eager plan of a validated call: one-nearest searches of contiguous inputs on the
    Triton backend bind the kernel's launch plan; everything else runs :func:`_quantize`."""
    chosen = _check(x, codebook, metric, k, backend)
    rows, dim = x.numel() // max(x.shape[-1], 1), x.shape[-1]
    if not (
        k == 1
        and uses_triton(chosen)
        and x.dtype != torch.float64
        and rows > 0
        and x.is_contiguous()
        and codebook.is_contiguous()
    ):
        return lambda x, codebook: _quantize(x, codebook, metric, k, backend)
    from .kernels import nearest_code

    lead = x.shape[:-1]
    out_shape = (*lead, dim)
    cast = codebook.dtype != x.dtype

    def run(x, codebook):
        cb = codebook.detach()
        if cast:
            cb = cb.to(x.dtype)
        norms = torch.linalg.vector_norm(cb, dim=-1, dtype=torch.float32)
        codes = nearest_code(x.view(rows, dim), cb, norms, metric)
        return codes.view(lead), F.embedding(codes, codebook).view(out_shape)

    return run
