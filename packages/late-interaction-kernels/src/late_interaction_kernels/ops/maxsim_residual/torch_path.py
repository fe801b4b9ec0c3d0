"""The PyTorch route of ``maxsim_residual`` (the declaration's reference and the path off the
Triton backend): documents decompressed a chunk at a time and scored by :func:`maxsim`."""

from __future__ import annotations

import torch

from ..maxsim import maxsim_unchecked
from .reference import decompress


def decompress_and_score(
    Q, centroids, codes, packed, weights, doclens, nbits, q_mask, chunk_size, backend
) -> torch.Tensor:
    """The PyTorch path: decompress ``chunk_size`` documents at a time, then :func:`maxsim`."""
    lengths = [int(n) for n in doclens.tolist()]
    offsets = [0]
    for n in lengths:
        offsets.append(offsets[-1] + n)
    blocks = []
    for start in range(0, len(lengths), chunk_size):
        stop = min(start + chunk_size, len(lengths))
        lo, hi = offsets[start], offsets[stop]
        tokens = decompress(centroids, codes[lo:hi], packed[lo:hi], weights, nbits).to(Q.dtype)
        chunk_lengths = torch.tensor(lengths[start:stop], device=Q.device)
        width = max(max(lengths[start:stop]), 1)
        # scatter the chunk's tokens into a padded (docs, width, d) block
        doc_of_token = torch.repeat_interleave(
            torch.arange(stop - start, device=Q.device), chunk_lengths
        )
        slot = torch.arange(hi - lo, device=Q.device) - (
            torch.tensor(offsets[start:stop], device=Q.device) - lo
        ).repeat_interleave(chunk_lengths)
        D = tokens.new_zeros(stop - start, width, tokens.shape[1])
        D[doc_of_token, slot] = tokens
        mask = torch.arange(width, device=Q.device) < chunk_lengths[:, None]
        blocks.append(maxsim_unchecked(Q, D, q_mask, mask, backend=backend))
    if not blocks:
        return Q.new_zeros(Q.shape[0], 0, dtype=torch.float32)
    return torch.cat(blocks, dim=1)
