"""The checks of the padded and packed MaxSim calls, and the validated form of a padded call."""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..common.layout import ALL_PAIRS, GROUPED, PAIRS
from ..common.validation import backend_for, check_mask, check_pair, check_tensor
from .backward_method import resolve_backward


def needs_grad(*tensors: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def check_normalize(normalize) -> bool:
    if not isinstance(normalize, bool):
        raise TypeError(f"normalize must be a bool, got {type(normalize).__name__}")
    return normalize


def _no_grad_through_empty_docs(ld: int, Q: torch.Tensor, D: torch.Tensor) -> None:
    if ld == 0 and needs_grad(Q, D):
        raise ValueError(
            "documents have zero length (Ld=0) while gradients are required: MaxSim has no "
            "gradient there; drop empty documents or mask them with d_mask instead"
        )


class Call(NamedTuple):
    """A validated padded-layout call: what the kernels need besides the tensors."""

    layout: int
    n_query: int
    n_doc: int
    lq: int
    ld: int
    dim: int
    backend: str
    method: str
    normalize: bool
    out_shape: tuple[int, ...]


def resolve_maxsim(Q, D, q_mask, d_mask, normalize, backward, backend) -> Call:
    check_tensor("Q", Q, 3, "(Nq, Lq, d)")
    check_tensor("D", D, (3, 4), "(Nd, Ld, d) or (Nq, K, Ld, d)")
    check_pair(Q, D)
    nq, lq, d = Q.shape
    if D.dim() == 4 and D.shape[0] != nq:
        raise ValueError(
            f"a 4-D D must be (Nq, K, Ld, d) with Nq={nq} from Q; got shape {tuple(D.shape)}"
        )
    layout = ALL_PAIRS if D.dim() == 3 else GROUPED
    n_doc = D.shape[0] if layout == ALL_PAIRS else D.shape[1]
    ld = D.shape[-2]
    check_mask("q_mask", q_mask, (nq, lq))
    check_mask("d_mask", d_mask, tuple(D.shape[:-1]))
    chosen = backend_for([Q, D, q_mask, d_mask], ["Q", "D", "q_mask", "d_mask"], backend)
    method = resolve_backward(backward, layout, nq, n_doc, lq)
    normalize = check_normalize(normalize)
    _no_grad_through_empty_docs(ld, Q, D)
    return Call(layout, nq, n_doc, lq, ld, d, chosen, method, normalize, (nq, n_doc))


def resolve_pairs(Q, D, q_mask, d_mask, normalize, backward, backend) -> Call:
    check_tensor("Q", Q, 3, "(B, Lq, d)")
    check_tensor("D", D, 3, "(B, Ld, d)")
    check_pair(Q, D)
    b, lq, d = Q.shape
    if D.shape[0] != b:
        raise ValueError(f"Q and D must hold the same number of pairs B; got {b} and {D.shape[0]}")
    ld = D.shape[1]
    check_mask("q_mask", q_mask, (b, lq))
    check_mask("d_mask", d_mask, (b, ld))
    chosen = backend_for([Q, D, q_mask, d_mask], ["Q", "D", "q_mask", "d_mask"], backend)
    method = resolve_backward(backward, PAIRS, b, 1, lq)
    normalize = check_normalize(normalize)
    _no_grad_through_empty_docs(ld, Q, D)
    return Call(PAIRS, b, 1, lq, ld, d, chosen, method, normalize, (b,))


def check_cu(name: str, cu) -> None:
    if not isinstance(cu, torch.Tensor):
        raise TypeError(f"{name} must be an int32/int64 tensor of shape (B + 1,)")
    if cu.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name} must be int32 or int64, got {cu.dtype}")
    if cu.dim() != 1 or cu.numel() < 1:
        raise ValueError(f"{name} must have shape (B + 1,), got {tuple(cu.shape)}")


def seqlens(name: str, cu: torch.Tensor, rows: int) -> torch.Tensor:
    lengths = cu[1:] - cu[:-1]
    if cu.numel() > 1 and (bool((lengths < 0).any()) or int(cu[0]) < 0 or int(cu[-1]) > rows):
        raise ValueError(
            f"{name} must be non-decreasing offsets within the {rows} packed rows; got {cu.tolist()}"
        )
    return lengths
