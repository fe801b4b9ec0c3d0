"""Top-k MaxSim search over a document collection without the ``(Nq, Nd)`` score matrix.

On the Triton backend, for one or two queries, one launch (:mod:`.kernels`) scores every document
and offers each score to a running top-k per query that lives in a fixed-size state (the ``k``
best so far, a ring of recent offers), so memory does not grow with the number of documents, and
its last program writes the sorted results. Elsewhere (batches of queries, other backends,
shapes the kernel does not take) documents are scored ``chunk_size`` at a time with
:func:`maxsim` and a running top-k is merged after each chunk. The op is declared in :mod:`.op`.
"""

from .dispatch import maxsim_topk
from .op import CHUNK_SCORES, FUSED_MAX_QUERIES, MIN_CHUNK_SIZE

__all__ = ["CHUNK_SCORES", "FUSED_MAX_QUERIES", "MIN_CHUNK_SIZE", "maxsim_topk"]
