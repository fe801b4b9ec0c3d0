"""``quantize``: the public function over the declared nearest-code search (``op.py``): it
flattens ``x``'s leading dimensions and gathers the chosen codebook rows."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .._validation import rows_of
from .op import NEAREST_CODE


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
    flat = rows_of(x)
    # the search has no gradient (the gather below carries the codebook's); a non-tensor goes on
    # to be named by the declaration's checks
    search = codebook.detach() if isinstance(codebook, torch.Tensor) else codebook
    codes = NEAREST_CODE(flat, search, metric=metric, k=k, backend=backend)
    if flat is not x:
        lead = x.shape[:-1]
        codes = codes.view(*lead, *codes.shape[1:]) if lead else codes.view(codes.shape[1:])
    return codes, F.embedding(codes, codebook)
