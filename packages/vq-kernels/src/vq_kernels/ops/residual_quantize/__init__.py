"""``residual_quantize``: every level of a residual vector quantizer in one launch, with the
straight-through output, the stacked inputs of the EMA update and the training losses."""

from .dispatch import ResidualQuantized, residual_quantize

__all__ = ["ResidualQuantized", "residual_quantize"]
