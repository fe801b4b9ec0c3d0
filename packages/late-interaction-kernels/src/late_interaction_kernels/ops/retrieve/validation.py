"""The checks of queries against a held collection, and how errors describe a bad argument."""

from __future__ import annotations

import torch


def check_queries(Q, q_mask) -> None:
    if not isinstance(Q, torch.Tensor) or Q.dim() != 3:
        raise ValueError(f"Q must be a (Nq, Lq, d) tensor, got {describe(Q)}")
    check_query_mask(Q, q_mask)


def check_query_mask(Q: torch.Tensor, q_mask) -> None:
    if q_mask is not None and (
        not isinstance(q_mask, torch.Tensor)
        or q_mask.dtype != torch.bool
        or tuple(q_mask.shape) != tuple(Q.shape[:2])
    ):
        raise ValueError(
            f"q_mask must be a bool tensor of shape {tuple(Q.shape[:2])}, got {describe(q_mask)}"
        )


def describe(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"a {x.dtype} tensor of shape {tuple(x.shape)}"
    return f"a {type(x).__name__}"
