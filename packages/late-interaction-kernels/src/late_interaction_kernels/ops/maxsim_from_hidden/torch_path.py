"""The PyTorch route of ``maxsim_from_hidden`` (the declaration's reference and the chunked path
off the fused kernel): documents projected a chunk at a time and scored by :func:`maxsim`."""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

from ..maxsim import maxsim_unchecked
from .reference import project


def _score_chunk(Q, H, W, b, d_mask, q_mask, normalize: bool, backend) -> torch.Tensor:
    return maxsim_unchecked(Q, project(H, W, b, normalize), q_mask, d_mask, backend=backend)


def score_in_chunks(Q, H_d, W, b, d_mask, q_mask, normalize, chunk_size, backend) -> torch.Tensor:
    """Project and score ``chunk_size`` documents at a time; with gradients, each chunk's
    projection is recomputed in the backward (checkpointed), so memory is one chunk's."""
    checkpointed = (
        H_d.shape[0] > chunk_size
        and torch.is_grad_enabled()
        and any(t is not None and t.requires_grad for t in (Q, H_d, W, b))
    )
    blocks = []
    for start in range(0, H_d.shape[0], chunk_size):
        H = H_d[start : start + chunk_size]
        mask = None if d_mask is None else d_mask[start : start + chunk_size]
        if checkpointed:
            block = checkpoint(
                _score_chunk, Q, H, W, b, mask, q_mask, normalize, backend, use_reentrant=False
            )
        else:
            block = _score_chunk(Q, H, W, b, mask, q_mask, normalize, backend)
        blocks.append(block)
    if not blocks:
        empty = Q.new_zeros(0, H_d.shape[1], W.shape[1])
        return maxsim_unchecked(Q, empty, q_mask, backend=backend)
    return torch.cat(blocks, dim=1)
