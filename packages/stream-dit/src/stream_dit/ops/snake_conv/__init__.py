"""A Snake-activated convolution layer (plain, dilated, or transposed) as one implicit GEMM over
channels-last activations, with the next layer's activation, a residual unit's 1×1 half and its
residual add folded in: the building block of :mod:`stream_dit.decode.fused`."""

from .dispatch import SnakeConv, prepare_snake_conv, snake_conv, snake_conv_ahead
from .reference import Head, Pointwise, Snake, snake_conv_reference

__all__ = [
    "Head",
    "Pointwise",
    "Snake",
    "SnakeConv",
    "prepare_snake_conv",
    "snake_conv",
    "snake_conv_ahead",
    "snake_conv_reference",
]
