"""FP8 MaxSim inference: quantisation helpers and :func:`maxsim_inference_fp8`.

On CUDA the Triton kernel of :mod:`.kernels` multiplies the stored 8-bit operands on the tensor
cores (``tl.dot`` on float8, which needs compute capability 8.9 or newer: Ada, Hopper, Blackwell);
an older GPU raises ``RuntimeError`` rather than silently running something slower. On CPU and
other devices the scores are computed from the dequantised tokens in PyTorch.
"""

from .dispatch import maxsim_inference_fp8
from .op import FP8_MIN_CAPABILITY
from .quantization import (
    dequantize_fp8_per_tensor,
    dequantize_fp8_per_token,
    quantize_fp8_per_tensor,
    quantize_fp8_per_token,
)

__all__ = [
    "FP8_MIN_CAPABILITY",
    "dequantize_fp8_per_tensor",
    "dequantize_fp8_per_token",
    "maxsim_inference_fp8",
    "quantize_fp8_per_tensor",
    "quantize_fp8_per_token",
]
