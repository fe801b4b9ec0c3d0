"""Scoring module and top-k search: :class:`MaxSimScorer` and :func:`retrieve`.

Both default to ``normalize=True`` (the ColBERT / ColPali convention). For a collection held
across many query batches (a list of uneven documents, chunked scoring) see
:class:`late_interaction_kernels.MaxSimIndex`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch

from .ops.maxsim import maxsim
from .ops.maxsim_topk import maxsim_topk
from .ops.retrieve import MaxSimIndex

__all__ = ["BackwardMethod", "MaxSimScorer", "retrieve"]

BackwardMethod = Literal["auto", "unified", "lowmem"]
_METHODS = ("auto", "unified", "lowmem")


class MaxSimScorer(torch.nn.Module):
    """Stateless ``nn.Module`` computing MaxSim scores ``(Nq, Nd)`` (or ``(Nq, K)`` for a 4-D
    ``D``); it has no parameters and composes with any encoder.

    Args:
        normalize: L2-normalise every token inside the kernel.
        backward: gradient method, ``"auto"``, ``"unified"`` or ``"lowmem"``.
        mask_pad_token: pad-token id from which :meth:`forward_with_ids` derives the masks.
        backend: keyword-only addition: force ``"triton"``, ``"interpret"`` or ``"torch"``.
    """

    def __init__(
        self,
        *,
        normalize: bool = True,
        backward: BackwardMethod = "auto",
        mask_pad_token: int | None = None,
        backend: str | None = None,
    ) -> None:
        super().__init__()
        if backward not in _METHODS:
            raise ValueError(f"backward= must be one of {_METHODS}, got {backward!r}")
        self.normalize = normalize
        self.backward = backward
        self.mask_pad_token = mask_pad_token
        self.backend = backend

    def extra_repr(self) -> str:
        return (
            f"normalize={self.normalize}, backward={self.backward!r}, "
            f"mask_pad_token={self.mask_pad_token!r}"
        )

    def forward(
        self,
        Q: torch.Tensor,
        D: torch.Tensor,
        q_mask: torch.Tensor | None = None,
        d_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """MaxSim scores, differentiable in ``Q`` and ``D`` (float32)."""
        return maxsim(
            Q, D, q_mask, d_mask,
            normalize=self.normalize, backward=self.backward, backend=self.backend,
        )  # fmt: skip

    def score(
        self,
        Q: torch.Tensor,
        D: torch.Tensor,
        q_mask: torch.Tensor | None = None,
        d_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """:meth:`forward` for inference: no autograd graph even when inputs require grad."""
        with torch.no_grad():
            return self.forward(Q, D, q_mask, d_mask)

    def retrieve(
        self,
        Q: torch.Tensor,
        D: torch.Tensor,
        top_k: int,
        q_mask: torch.Tensor | None = None,
        d_mask: torch.Tensor | None = None,
        *,
        chunk: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(scores, indices)`` of the ``top_k`` best documents per query; see :func:`retrieve`."""
        return retrieve(
            Q, D, top_k, q_mask, d_mask,
            normalize=self.normalize, chunk=chunk, backend=self.backend,
        )  # fmt: skip

    def forward_with_ids(
        self, Q: torch.Tensor, D: torch.Tensor, q_ids: torch.Tensor, d_ids: torch.Tensor
    ) -> torch.Tensor:
        """:meth:`forward` with masks ``q_ids != mask_pad_token`` and ``d_ids != mask_pad_token``."""
        if self.mask_pad_token is None:
            raise ValueError("`forward_with_ids` requires `mask_pad_token` set on the scorer.")
        return self.forward(Q, D, q_ids != self.mask_pad_token, d_ids != self.mask_pad_token)


def retrieve(
    Q: torch.Tensor,
    D: torch.Tensor | Sequence[torch.Tensor],
    top_k: int,
    q_mask: torch.Tensor | None = None,
    d_mask: torch.Tensor | None = None,
    *,
    normalize: bool = True,
    chunk: int | None = None,
    largest: bool = True,
    sorted: bool = True,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-``top_k`` late-interaction search: ``maxsim(Q, D).topk(top_k)`` without the full
    score matrix (inference only, no autograd graph).

    Args:
        Q: ``(Nq, Lq, d)`` or ``(Lq, d)``.
        D: ``(Nd, Ld, d)`` or ``(Ld, d)``; also (an addition) a list of ``(L_i, d)`` tensors of
            uneven lengths, scored through :class:`MaxSimIndex`.
        top_k: results per query, clamped to ``Nd``; must be positive.
        q_mask, d_mask: bool masks, True = valid token.
        normalize: L2-normalise every token first.
        chunk: score this many documents at a time (the fused top-k kernel on CUDA needs none).
        largest, sorted: as in :func:`torch.topk`.
        backend: keyword-only addition, ``"triton"``, ``"interpret"`` or ``"torch"``.

    Returns:
        ``(scores float32, indices int64)`` of shape ``(Nq, min(top_k, Nd))`` (``(top_k,)`` for a
        2-D ``Q``).
    """
    if isinstance(top_k, bool) or not isinstance(top_k, int):
        raise TypeError(f"top_k must be an int, got {type(top_k).__name__}")
    if top_k <= 0:
        raise ValueError(f"top_k must be positive, got {top_k}")
    if isinstance(D, torch.Tensor) and isinstance(Q, torch.Tensor) and Q.device != D.device:
        raise ValueError(
            f"Q and D must be on the same device; got Q.device={Q.device} vs D.device={D.device}."
        )
    if not isinstance(D, torch.Tensor):
        if not largest:
            raise ValueError("largest=False is not supported for a list of documents")
        index = MaxSimIndex(D, chunk_size=chunk, normalize=normalize)
        squeeze = isinstance(Q, torch.Tensor) and Q.dim() == 2
        Qb = Q.unsqueeze(0) if squeeze else Q
        qm = q_mask.unsqueeze(0) if squeeze and q_mask is not None else q_mask
        s, i = index.topk(Qb, min(top_k, len(index)), qm)
        return (s.squeeze(0), i.squeeze(0)) if squeeze else (s, i)
    return maxsim_topk(
        Q, D, top_k, q_mask, d_mask,
        normalize=normalize, chunk_size=chunk, largest=largest, sorted=sorted, backend=backend,
    )  # fmt: skip
