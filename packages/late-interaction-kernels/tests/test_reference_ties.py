"""The reference route's gradient on tied document tokens: all of it to the first, as the kernels
and ``torch.max(dim)`` do (``amax`` would split it)."""

import pytest
import torch

from late_interaction_kernels import maxsim


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_tie_sends_the_gradient_to_its_first_token(rng, dtype):
    # small integers: every product is exact whatever the summation order, so the tie is exact
    Q = torch.randint(-2, 3, (2, 3, 8), generator=rng).to(dtype)
    D = torch.randint(-2, 3, (2, 5, 8), generator=rng).to(dtype)
    Q[:, 0] = 2
    D[:, 1] = 6  # 96 with query token 0, above any other product (at most 32): it picks it
    D[:, 3] = D[:, 1]
    Q.requires_grad_()
    D.requires_grad_()
    maxsim(Q, D, backend="torch").sum().backward()
    assert D.grad[:, 1].abs().sum() > 0
    assert torch.equal(D.grad[:, 3], torch.zeros_like(D.grad[:, 3]))
