"""Packed (``cu_seqlens``) scoring: every query against every document, and arbitrary pair lists.

Every query against every document runs the MaxSim kernels on the packed tokens themselves (the
``VARLEN_ALL_PAIRS`` layout: each program finds its query's and its document's rows through the
offsets), forward and backward, with no padded copy. Pair lists, the float64 and PyTorch paths
lay the packed tokens out as padded blocks with masks (plain indexing, differentiable) and run
:func:`late_interaction_kernels.maxsim` / :func:`maxsim_pairs`. The ``(Nq, Nd, Lq, Ld)``
similarity tensor never exists.
"""

from .dispatch import maxsim_varlen, score_pairs_packed

__all__ = ["maxsim_varlen", "score_pairs_packed"]
