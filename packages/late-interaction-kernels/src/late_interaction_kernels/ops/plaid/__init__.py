"""PLAID / ColBERTv2 scoring on the index layout of :mod:`.reference` (padded or ragged), on
top of the fused residual kernel of :mod:`..maxsim_residual`.

With ``normalize=True`` (the PLAID convention) the fused kernel decompresses and scores each
document tile in registers; the layout differs from the kernel's only in the bit order within a
byte, which one table lookup over the packed bytes converts (the collection is never
decompressed). ``normalize=False`` decompresses a chunk of documents at a time and scores it with
:func:`maxsim`.
"""

from .dispatch import maxsim_residual, maxsim_residual_varlen, plaid_approx_score

__all__ = ["maxsim_residual", "maxsim_residual_varlen", "plaid_approx_score"]
