"""Packed (``cu_seqlens``) all-pairs scoring: :func:`maxsim_varlen`."""

from .ops.varlen import maxsim_varlen

__all__ = ["maxsim_varlen"]
