"""PLAID / ColBERTv2 scoring: candidate pruning (:func:`plaid_approx_score`) and exact rerank of
residual-compressed documents, padded (:func:`maxsim_residual`) or ragged
(:func:`maxsim_residual_varlen`), decompressed in registers. The layout is described in
:mod:`late_interaction_kernels.ops.plaid.reference`."""

from .ops.plaid import maxsim_residual, maxsim_residual_varlen, plaid_approx_score
from .ops.plaid.reference import maxsim_residual_reference, plaid_approx_score_reference

__all__ = [
    "maxsim_residual",
    "maxsim_residual_reference",
    "maxsim_residual_varlen",
    "plaid_approx_score",
    "plaid_approx_score_reference",
]
