"""``quantize``: the plan cache, the backend dispatch and the codebook gather."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from triton_dispatch import uses_triton
from triton_dispatch.launch import PlanCache, call_key

from .op import nearest_code_impl, nearest_code_op
from .reference import quantize_reference
from .validation import check_quantize


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


def _quantize(x, codebook, metric, k, backend) -> tuple[torch.Tensor, torch.Tensor]:
    chosen = check_quantize(x, codebook, metric, k, backend)
    lead = x.shape[:-1]
    flat = x.detach().reshape(-1, x.shape[-1])
    if k == 1:
        # Eager calls skip the custom-op dispatcher; traced calls need the registered op.
        search = nearest_code_op if torch.compiler.is_compiling() else nearest_code_impl
        codes = search(flat, codebook.detach(), metric, chosen)
        return codes.view(lead), F.embedding(codes, codebook).view(*lead, codebook.shape[1])
    codes = quantize_reference(flat, codebook.detach().to(flat.dtype), metric, k)
    quantized = F.embedding(codes, codebook)
    return codes.view(*lead, k), quantized.view(*lead, k, codebook.shape[1])


def _plan(x, codebook, metric, k, backend):
    """The eager plan of a validated call: one-nearest searches of contiguous inputs on the
    Triton backend bind the kernel's launch plan; everything else runs :func:`_quantize`."""
    chosen = check_quantize(x, codebook, metric, k, backend)
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
