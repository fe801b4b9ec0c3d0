"""What a user would otherwise run: the EMA update written in plain PyTorch, with the counts and
sums from a (B, K) one-hot or from ``index_add_``, and the nearest-code search by ``torch.cdist``
or a matmul. The update math is the package's active-only semantics, dead-code restarts included,
with no host sync (restart rows drawn for every code, applied with ``torch.where``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def onehot_statistics(x, codes, num_codes):
    onehot = F.one_hot(codes, num_codes).to(x.dtype)  # (B, K)
    return onehot.sum(0), onehot.T @ x


def index_add_statistics(x, codes, num_codes):
    counts = torch.zeros(num_codes, device=x.device, dtype=x.dtype)
    sums = torch.zeros(num_codes, x.shape[1], device=x.device, dtype=x.dtype)
    counts.index_add_(0, codes, torch.ones_like(codes, dtype=x.dtype))
    sums.index_add_(0, codes, x)
    return counts, sums


def ema_step(
    stats, x, codes, codebook, size, embed_sum, counter, *, decay=0.99, eps=1e-5, threshold=20
):
    counts, sums = stats(x, codes, codebook.shape[0])
    active = counts > 0
    size_new = torch.where(active, decay * size + (1 - decay) * counts, size)
    sum_new = torch.where(active[:, None], decay * embed_sum + (1 - decay) * sums, embed_sum)
    code_new = torch.where(active[:, None], sum_new / size_new.clamp_min(eps)[:, None], codebook)
    counter_new = torch.where(active, torch.zeros_like(counter), counter + 1)
    dead = counter_new >= threshold
    rows = x[torch.randint(0, x.shape[0], (codebook.shape[0],), device=x.device)]
    codebook.copy_(torch.where(dead[:, None], rows, code_new))
    embed_sum.copy_(torch.where(dead[:, None], rows, sum_new))
    size.copy_(torch.where(dead, torch.ones_like(size_new), size_new))
    counter.copy_(torch.where(dead, torch.zeros_like(counter_new), counter_new))


def cdist_argmin(x, codebook):
    return torch.cdist(x, codebook).argmin(1)


def matmul_argmin(x, codebook):
    d = (codebook * codebook).sum(1)[None, :] - 2.0 * (x @ codebook.T)
    return d.argmin(1)
