"""Mask conventions of the patched libraries, expressed with this package's ``maxsim``.

``maxsim`` takes boolean masks and a masked document token never wins. The libraries we patch
have a different rule in their reference code: a padded or masked document token takes part in
the max with similarity exactly 0 (colpali-engine pads with zero vectors; PyLate multiplies the
similarities by the mask). A patched call must give the numbers the original gives, so the
helpers below translate one convention into the other without changing a single score.
"""

from __future__ import annotations

import torch


def kernels():
    """``(maxsim, maxsim_pairs)``, imported on first use so that importing an integration module
    never pulls the kernels (or Triton) in."""
    import late_interaction_kernels as lik

    return lik.maxsim, lik.maxsim_pairs


def zero_padding_masks(x: torch.Tensor) -> torch.Tensor:
    """Valid-token mask for a zero-padded ``(..., L, d)`` tensor, wherever the padding sits (right,
    or left as after a cross-device gather with ``pad_first=True``).

    A token is valid when its vector is not all zeros. Padding still competes in the reference
    einsum with similarity 0, so one zero row per padded sequence stays valid: the hard max then
    sees exactly the candidates it saw before, and the remaining padding can be skipped.
    """
    valid = x.ne(0).any(dim=-1)
    padding = ~valid
    # first zero row of each sequence that has one (argmax returns the first maximum)
    first_pad = padding.to(torch.uint8).argmax(dim=-1, keepdim=True)
    keep = torch.zeros_like(valid).scatter_(-1, first_pad, True) & padding
    return valid | keep


def zero_masked_tokens(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """``x`` with masked-out token vectors set to zero, so that a masked document token scores
    exactly 0 against every query token, as PyLate's multiply-by-mask reference does (and its
    gradient is zero there too)."""
    if mask is None:
        return x
    keep = mask if mask.dtype == torch.bool else mask.ne(0)
    return x * keep.unsqueeze(-1).to(x.dtype)


def as_bool_mask(mask: torch.Tensor | None) -> torch.Tensor | None:
    """PyLate passes float 0/1 masks, bool masks or ``None``."""
    if mask is None or mask.dtype == torch.bool:
        return mask
    return mask.ne(0)
