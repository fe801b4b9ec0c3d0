"""A compressed late-interaction index for large collections (:class:`CompressedMaxSimIndex`):
tokens as k-means centroid codes plus packed residual buckets, candidates from inverted lists, and
fused Triton kernels that score each (query, candidate) pair from the compressed codes."""

from .index import CompressedMaxSimIndex

__all__ = ["CompressedMaxSimIndex"]
