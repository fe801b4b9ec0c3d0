"""Plain-PyTorch specification of the residual search: the CPU path and the test oracle.

For ``x (N, D)`` and codebooks ``(L, K, D)`` (cast to ``x``'s dtype), level ``l`` takes the nearest
code ``c_l`` (``ops.quantize`` distances and tie rule) of the residual ``r_l`` (``r_0 = x``), and
``r_{l+1} = r_l − q_l`` with ``q_l = codebook_l[c_l]``; every operation runs in ``x``'s dtype, in the
order a per-level loop runs it, so the fused kernel can match it bit for bit.

Outputs: ``codes (N, L)`` int64, the residuals ``(L + 1, N, D)`` (``[:L]`` are the inputs of the EMA
update, ``[L]`` what is left), and the straight-through value ``x + (Σ_l q_l − x)``.

Loss (what :class:`vq_kernels.ResidualVQ` trains with): the commitment loss
``Σ_l mean((r_l − sg(q_l))²)`` and the codebook loss ``Σ_l mean((q_l − sg(r_l))²)`` both have the
value ``Σ_l mean(r_{l+1}²)``. Their gradients (``sg``: stop-gradient; ``q`` carries none to ``x``):

* ``∂/∂x`` of the commitment loss is ``2 / (N·D) · Σ_l r_{l+1}`` (each ``r_l`` is ``x`` minus
  constants), and the straight-through output passes its upstream gradient to ``x`` unchanged;
* ``∂/∂codebook_l[k]`` of the codebook loss is ``−2 / (N·D) · Σ_{n: c_l[n] = k} r_{l+1}[n]``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from ..quantize.reference import quantize_reference

Search = Callable[[torch.Tensor, int], torch.Tensor]


def residual_quantize_reference(
    x: torch.Tensor, codebooks: torch.Tensor, metric: str = "l2", *, search: Search | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(quantized (N, D), codes (N, L), residuals (L + 1, N, D))`` of ``x (N, D)``.

    ``search(residual, level) -> codes (N,)`` replaces the reference search of a level (the op's
    per-level path passes the nearest-code kernel); the default is ``quantize_reference``."""
    cb = codebooks.detach().to(x.dtype)
    residual = x = x.detach()
    total = torch.zeros_like(residual)
    residuals, codes = [residual], []
    for level in range(cb.shape[0]):
        if search is None:
            c = quantize_reference(residual, cb[level], metric, 1)
        else:
            c = search(residual, level)
        q = F.embedding(c, cb[level])
        residual = residual - q
        total = total + q
        residuals.append(residual)
        codes.append(c)
    return x + (total - x), torch.stack(codes, 1), torch.stack(residuals)


def residual_loss_reference(residuals: torch.Tensor, weight: float = 1.0) -> torch.Tensor:
    """``weight · Σ_l mean(r_{l+1}²)`` from the residuals ``(L + 1, N, D)``, accumulated in fp32 (fp64
    for fp64 residuals); 0 for an empty batch."""
    dtype = torch.promote_types(residuals.dtype, torch.float32)
    numel = residuals[0].numel()
    return residuals[1:].to(dtype).square().sum() * (weight / max(numel, 1))


def residual_vq_reference(
    x: torch.Tensor,
    codebooks: torch.Tensor,
    metric: str = "l2",
    commitment_weight: float = 1.0,
    codebook_weight: float = 0.0,
    *,
    search: Search | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(quantized, codes, loss)`` with the losses written out level by level under autograd: the
    gradient oracle of the op (the formulas of the module docstring, not their closed form).

    ``x (N, D)``; ``codebooks (L, K, D)`` receives gradients from the codebook loss only.
    ``search`` as in :func:`residual_quantize_reference`."""
    residual = x
    total = torch.zeros_like(x)
    loss = x.new_zeros((), dtype=torch.promote_types(x.dtype, torch.float32))
    codes = []
    numel = max(x.numel(), 1)
    for level in range(codebooks.shape[0]):
        cb = codebooks[level]
        if search is None:
            c = quantize_reference(residual.detach(), cb.detach().to(x.dtype), metric, 1)
        else:
            c = search(residual.detach(), level)
        q = F.embedding(c, cb).to(x.dtype)
        commit = (residual - q.detach()).to(loss.dtype).square().sum() / numel
        learned = (q - residual.detach()).to(loss.dtype).square().sum() / numel
        loss = loss + commitment_weight * commit + codebook_weight * learned
        residual = residual - q.detach()
        total = total + q
        codes.append(c)
    quantized = x + (total - x).detach()
    return quantized, torch.stack(codes, 1), loss


def residual_outputs_reference(
    x: torch.Tensor,
    codebooks: torch.Tensor,
    *,
    metric: str = "l2",
    commitment_weight: float = 1.0,
    codebook_weight: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """What the op returns for ``x (N, D)``: ``(quantized, codes (N, L), level_codes (L, N),
    residuals (L + 1, N, D), loss)``, with the values of :func:`residual_quantize_reference` and
    :func:`residual_loss_reference` and the op's gradients under autograd: ``quantized`` passes
    its gradient to ``x`` unchanged, the loss gives ``x`` the commitment loss's gradient and the
    codebooks the codebook loss's; codes and residuals carry none."""
    cb = codebooks.to(x.dtype)
    residual = x  # r_l with x's gradient (its values: those of the detached loop)
    total = torch.zeros_like(x.detach())
    residuals, codes, commit, learned = [x.detach()], [], [], []
    for level in range(cb.shape[0]):
        c = quantize_reference(residual.detach(), cb[level].detach(), metric, 1)
        q = F.embedding(c, cb[level])  # with the codebooks' gradient
        learned.append(q - residuals[-1])  # q_l − sg(r_l)
        residual = residual - q.detach()
        commit.append(residual)  # r_l − sg(q_l) = r_{l+1}
        total = total + q.detach()
        residuals.append(residual.detach())
        codes.append(c)
    dtype = torch.promote_types(x.dtype, torch.float32)
    numel = max(x.numel(), 1)
    # Each term has the value Σ_l mean(r_{l+1}²); a zero weight drops its term, so that the loss
    # is residual_loss_reference's to the bit whenever one of the weights is 0.
    terms = [
        torch.stack(parts).to(dtype).square().sum() * (weight / numel)
        for parts, weight in ((commit, commitment_weight), (learned, codebook_weight))
        if weight != 0
    ]
    if not terms:
        terms = [residual_loss_reference(torch.stack(residuals), 0.0)]
    loss = terms[0] if len(terms) == 1 else terms[0] + terms[1]
    codes_t = torch.stack(codes, 1)
    quantized = x + (total - x).detach()
    return quantized, codes_t, codes_t.T.contiguous(), torch.stack(residuals), loss
