"""Scoring listed ``(query, document)`` pairs of packed batches: :func:`score_pairs_packed`."""

from .ops.varlen import score_pairs_packed

__all__ = ["score_pairs_packed"]
