"""A document collection held for repeated MaxSim scoring and top-k search (:class:`MaxSimIndex`).

Documents are scored in chunks: only one ``(Nq, chunk)`` block of scores (and, for a list of
uneven documents, one padded chunk) exists at a time, and a running top-k is merged after each
chunk, so memory stays bounded whatever the collection size. Inference only (no autograd graph is
kept).
"""

from .index import DEFAULT_CHUNK_SIZE, MaxSimIndex, pad_documents

__all__ = ["DEFAULT_CHUNK_SIZE", "MaxSimIndex", "pad_documents"]
