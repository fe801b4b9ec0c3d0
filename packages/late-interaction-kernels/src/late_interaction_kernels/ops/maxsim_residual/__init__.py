"""MaxSim against PLAID / ColBERTv2 compressed documents (centroid id + packed n-bit residuals).

The Triton path (:mod:`.kernels`, declared in :mod:`.op`) decompresses each document
tile in registers and scores it at once; the collection is never expanded. The PyTorch path
decompresses a chunk of documents at a time (one chunk of ``(tokens, d)`` embeddings exists at once)
and scores it with :func:`late_interaction_kernels.maxsim`. The storage layout is described in
:mod:`.reference`.
"""

from .dispatch import maxsim_residual, maxsim_residual_prechecked

__all__ = ["maxsim_residual", "maxsim_residual_prechecked"]
