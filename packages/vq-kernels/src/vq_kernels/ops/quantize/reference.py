"""Plain-PyTorch specification of the nearest-code search: the CPU path and the test oracle.

Distances, per row ``x`` and code ``c``:

* ``"l2"``: ``‖c‖² − 2·x·c`` (the squared distance minus the row's own ``‖x‖²``, which does not
  change the ranking);
* ``"cosine"``: ``−(x·c) / max(‖c‖, eps)`` (the row's norm does not change the ranking).

Ties go to the lowest code index, as with ``torch.argmin``. A distance that is NaN (a row holding
NaN) counts as +inf, so such a row maps to code 0.
"""

from __future__ import annotations

import torch

METRICS = ("l2", "cosine")
COSINE_EPS = 1e-12


def code_scores(codebook: torch.Tensor, metric: str, dtype: torch.dtype) -> torch.Tensor:
    """Per-code term of the distance: ``‖c‖²`` (l2) or ``1 / max(‖c‖, eps)`` (cosine), in ``dtype``."""
    c = codebook.to(dtype)
    if metric == "l2":
        return (c * c).sum(-1)
    return 1.0 / torch.linalg.vector_norm(c, dim=-1).clamp_min(COSINE_EPS)


def distances_reference(x: torch.Tensor, codebook: torch.Tensor, metric: str) -> torch.Tensor:
    """``(B, K)`` ranking distances (see the module docstring), computed in ``x``'s dtype promoted
    to at least fp32."""
    dtype = torch.promote_types(x.dtype, torch.float32)
    dots = x.to(dtype) @ codebook.to(dtype).T
    term = code_scores(codebook, metric, dtype)
    d = term[None, :] - 2.0 * dots if metric == "l2" else -dots * term[None, :]
    return torch.nan_to_num(d, nan=float("inf"))


def quantize_reference(
    x: torch.Tensor, codebook: torch.Tensor, metric: str = "l2", k: int = 1, chunk: int = 4096
) -> torch.Tensor:
    """Codes of the nearest ``k`` codes, ``(B,)`` for ``k = 1`` else ``(B, k)`` int64, nearest first.

    Codes are scanned in chunks of ``chunk`` so memory is ``O(B · (chunk + k))``, not ``O(B · K)``.
    Within equal distances the lower index comes first.
    """
    batch = x.shape[0]
    num_codes = codebook.shape[0]
    if k == 1:
        best = torch.full((batch,), float("inf"), device=x.device)
        codes = torch.zeros(batch, dtype=torch.int64, device=x.device)
        for start in range(0, num_codes, chunk):
            d = distances_reference(x, codebook[start : start + chunk], metric)
            idx = torch.argmin(d, dim=1)  # the first of equal minima
            value = d.gather(1, idx[:, None])[:, 0]
            better = value < best.to(value.dtype)  # strict: an earlier chunk keeps a tie
            codes = torch.where(better, idx + start, codes)
            best = torch.where(better, value, best.to(value.dtype))
        return codes
    best_d = x.new_empty(batch, 0, dtype=torch.promote_types(x.dtype, torch.float32))
    best_i = torch.empty(batch, 0, dtype=torch.int64, device=x.device)
    for start in range(0, num_codes, chunk):
        d = distances_reference(x, codebook[start : start + chunk], metric)
        idx = torch.arange(start, start + d.shape[1], device=x.device).expand(batch, -1)
        # Earlier (lower-index) candidates come first, so a stable sort keeps ties lowest-first.
        cat_d = torch.cat([best_d, d], 1)
        cat_i = torch.cat([best_i, idx], 1)
        order = torch.sort(cat_d, dim=1, stable=True).indices[:, :k]
        best_d, best_i = cat_d.gather(1, order), cat_i.gather(1, order)
    return best_i[:, 0] if k == 1 else best_i
