"""MaxSim against the hidden states of the document encoder, with the ColBERT projection head
fused in.

On the Triton backend one kernel (:mod:`.kernels`) projects, normalises and scores each document
tile in registers: the projected ``(Nd, Ld, d)`` documents are never written. The backward pass
(:mod:`.op`) recomputes the projection one chunk of documents at a time. The PyTorch path builds
the projected documents one chunk at a time and, when gradients are needed, recomputes them chunk
by chunk in the backward pass (activation checkpointing). Either way memory is that of one chunk,
whatever ``Nd``.
"""

from .dispatch import maxsim_from_hidden

__all__ = ["maxsim_from_hidden"]
