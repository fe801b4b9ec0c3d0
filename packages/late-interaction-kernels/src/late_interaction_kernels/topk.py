"""Top-k MaxSim search, fused on CUDA (see :mod:`late_interaction_kernels.ops.maxsim_topk`)."""

from .ops.maxsim_topk import maxsim_topk

__all__ = ["maxsim_topk"]
