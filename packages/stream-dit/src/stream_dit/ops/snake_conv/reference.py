"""The spec of :func:`~.dispatch.snake_conv` in plain PyTorch (any device, float64 included).

Activations are channels-last, ``(B, L, C)``. A layer computes

    y[b, q, j] = bias[j] + Σ_tap Σ_c x[b, q + tap·dilation − padding, c] · weight[tap, c, j]

(``x`` is zero outside ``[0, L_in)``) for ``q`` in ``[0, rows)``, then optionally
``y ← snake_pw(round(y)) @ pw.weight + pw.bias`` (a residual unit's Snake and 1×1 convolution),
places column ``j = r·C_out + c`` of row ``q`` at time ``t = q·phases + r − shift`` (a transposed
convolution of stride ``phases``), adds ``residual``, rounds to ``x``'s dtype (``out``), and gives
``snake_out(out)`` too. ``round`` is the cast to ``x``'s dtype that an unfused network does
between layers. Snake is ``y + inv_beta · sin(alpha · y)²`` per channel. With a ``head`` (a
decoder's last convolution, which reads only the Snake of this layer's output), the layer gives
the head's output in place of ``snake_out``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class Snake(NamedTuple):
    """Per-channel constants of a Snake activation: ``alpha`` and ``1 / beta``, float32 ``(C,)``."""

    alpha: torch.Tensor
    inv_beta: torch.Tensor


class Pointwise(NamedTuple):
    """Snake, then a 1×1 convolution ``h @ weight + bias`` (``weight``: ``(C, C)``, in → out)."""

    snake: Snake
    weight: torch.Tensor
    bias: torch.Tensor | None


class Head(NamedTuple):
    """A convolution of the layer's Snake output, "same" length: ``weight`` ``(taps, C_out,
    C_head)``, ``bias`` ``(C_head,)`` or ``None``, taps ``dilation`` apart from ``−padding``."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    dilation: int
    padding: int


def snake(y: torch.Tensor, act: Snake) -> torch.Tensor:
    """Snake of ``y`` (channels last) in ``y``'s dtype, constants cast to it."""
    alpha, inv_beta = act.alpha.to(y.dtype), act.inv_beta.to(y.dtype)
    return y + inv_beta * torch.sin(alpha * y).pow(2)


def output_length(length_in: int, phases: int, shift: int) -> int:
    """Time steps out for ``length_in`` in: ``length_in`` for a convolution, and a transposed
    one's ``(length_in − 1)·stride − 2·shift + 2·stride`` (kernel twice the stride)."""
    return length_in if phases == 1 else (length_in + 1) * phases - 2 * shift


def rows_for(out_length: int, phases: int, shift: int) -> int:
    """GEMM rows that cover ``out_length`` time steps."""
    return (out_length - 1 + shift) // phases + 1


def snake_conv_reference(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    *,
    dilation: int,
    padding: int,
    phases: int,
    shift: int,
    out_length: int,
    pointwise: Pointwise | None,
    residual: torch.Tensor | None,
    out_snake: Snake | None,
    store_out: bool,
    head: Head | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(out, snake_out)`` of one layer (``None`` for what is not asked); ``(out, head_out)``
    with a ``head``."""
    batch, length_in, _ = x.shape
    taps, _, n = weight.shape
    rows = rows_for(out_length, phases, shift)
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    xf = x.to(acc)
    y = torch.zeros(batch, rows, n, dtype=acc, device=x.device)
    for tap in range(taps):
        off = tap * dilation - padding
        lo, hi = max(0, -off), min(rows, length_in - off)
        if hi > lo:
            y[:, lo:hi] += xf[:, lo + off : hi + off] @ weight[tap].to(acc)
    if bias is not None:
        y = y + bias.to(acc)
    if pointwise is not None:
        h = snake(y.to(x.dtype).to(acc), pointwise.snake).to(x.dtype).to(acc)
        y = h @ pointwise.weight.to(acc)
        if pointwise.bias is not None:
            y = y + pointwise.bias.to(acc)
    y = y.reshape(batch, rows * phases, n // phases)[:, shift : shift + out_length]
    if residual is not None:
        y = y + residual.to(acc)
    out = y.to(x.dtype).contiguous()
    activated = None if out_snake is None else snake(out.to(acc), out_snake).to(x.dtype)
    if head is not None:
        activated, _ = snake_conv_reference(
            activated, head.weight, head.bias, dilation=head.dilation, padding=head.padding,
            phases=1, shift=0, out_length=out_length, pointwise=None, residual=None,
            out_snake=None, store_out=True,
        )  # fmt: skip
    return (out if store_out else None), activated
