"""FP8 MaxSim inference (compute capability 8.9+: Ada, Hopper, Blackwell) and the quantisation
helpers; see :mod:`late_interaction_kernels.ops.maxsim_fp8`."""

from .ops.maxsim_fp8 import (
    dequantize_fp8_per_tensor,
    dequantize_fp8_per_token,
    maxsim_inference_fp8,
    quantize_fp8_per_tensor,
    quantize_fp8_per_token,
)

__all__ = [
    "dequantize_fp8_per_tensor",
    "dequantize_fp8_per_token",
    "maxsim_inference_fp8",
    "quantize_fp8_per_tensor",
    "quantize_fp8_per_token",
]
