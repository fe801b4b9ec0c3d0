"""How far a window edge corrupts an Oobleck decoder's output, from the decoder's own layers.

A window of latent frames ``[a, b)`` decoded alone differs from the full decode only where an
output sample depends on something the window lacks: positions before ``a`` or after ``b`` at some
layer, which the window's convolutions replace by their zero padding. Walking the decoder's
convolutions in order and adding how far each one pushes that corruption inward gives, in output
samples, the depth from each window edge beyond which the window's output equals the full decode
(up to the rounding of a different summation order). Context latents of at least that depth on each
side of a window's kept part therefore make a windowed decode exact.

Per layer, at a layer whose positions are ``h`` output samples apart:

* ``Conv1d`` (stride 1, kernel ``k``, dilation ``d``, padding ``p``): output ``n`` reads inputs
  ``n - p .. n - p + (k - 1) d``, so ``p`` positions on the left and ``(k - 1) d - p`` on the right;
* ``ConvTranspose1d`` (stride ``s``, kernel ``k``, padding ``p``): output ``j`` reads inputs ``i``
  with ``i s <= j + p < i s + k``, which moves the first exact output ``k - s - p`` positions to the
  right of ``s`` times the first exact input and the last one ``p`` positions to the left;
* pointwise layers (Snake) and the residual skips (the branch reaches further than the skip) add
  nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch import nn


@dataclass(frozen=True)
class ReceptiveField:
    """Corruption depth of a window edge, in output samples.

    Attributes:
        left: output samples after a window's left edge that its missing left neighbours reach.
        right: output samples before a window's right edge that its missing right neighbours reach.
        hop: output samples per latent frame.
    """

    left: int
    right: int
    hop: int

    def context_frames(self) -> int:
        """Latent frames of context on each side that make a window exact: ``ceil(depth / hop)``
        for the deeper side."""
        return math.ceil(max(self.left, self.right) / self.hop)


def oobleck_receptive_field(decoder: nn.Module) -> ReceptiveField:
    """The :class:`ReceptiveField` of an Oobleck decoder (diffusers' ``OobleckDecoder``, or any
    module whose ``Conv1d``/``ConvTranspose1d`` layers, in registration order, are its forward
    order along one time axis with stride-1 convolutions between transposed upsamplings).

    Raises:
        TypeError: ``decoder`` is not an ``nn.Module``.
        ValueError: a layer that does not keep the length exact (a strided ``Conv1d``, a transposed
            convolution whose output is not ``stride`` times its input, a ``Conv1d`` that changes
            the length), or no upsampling at all.
    """
    if not isinstance(decoder, nn.Module):
        raise TypeError(f"decoder must be an nn.Module, got {type(decoder).__name__}")
    convs = [m for m in decoder.modules() if isinstance(m, (nn.Conv1d, nn.ConvTranspose1d))]
    strides = [_one(m.stride, "stride") for m in convs if isinstance(m, nn.ConvTranspose1d)]
    if not strides:
        raise ValueError("decoder has no ConvTranspose1d: not an upsampling decoder")
    hop = math.prod(strides)
    step = hop  # output samples between two positions of the current layer
    left = right = 0
    for m in convs:
        k, p = _one(m.kernel_size, "kernel_size"), _one(m.padding, "padding")
        d = _one(m.dilation, "dilation")
        if isinstance(m, nn.ConvTranspose1d):
            s = _one(m.stride, "stride")
            if d != 1 or _one(m.output_padding, "output_padding") != 0 or k - 2 * p != s:
                raise ValueError(
                    f"ConvTranspose1d(kernel={k}, stride={s}, padding={p}, dilation={d}) does not "
                    f"map T inputs to exactly {s}·T outputs: windows would not line up"
                )
            step //= s
            left += (k - s - p) * step
            right += p * step
        else:
            if _one(m.stride, "stride") != 1:
                raise ValueError(f"a strided Conv1d (stride {m.stride}) in a decoder")
            if 2 * p != (k - 1) * d:
                raise ValueError(
                    f"Conv1d(kernel={k}, dilation={d}, padding={p}) changes the sequence length"
                )
            left += p * step
            right += ((k - 1) * d - p) * step
    return ReceptiveField(left=left, right=right, hop=hop)


def _one(value, name: str) -> int:
    if isinstance(value, tuple):
        if len(value) != 1:
            raise ValueError(f"{name}={value} is not one-dimensional")
        value = value[0]
    if not isinstance(value, int):
        raise ValueError(f"{name}={value!r} is not an int (string paddings are not supported)")
    return value
