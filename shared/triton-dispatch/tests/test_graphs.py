"""CapturedStep and prepare_optimizer_for_capture (the capture itself needs CUDA)."""

import pytest
import torch

from triton_dispatch import CapturedStep, prepare_optimizer_for_capture


def test_warmup_below_one_is_refused():
    with pytest.raises(ValueError, match="warmup"):
        CapturedStep(lambda: torch.zeros(()), warmup=0)


def test_learning_rates_become_tensors_and_groups_capturable():
    p = torch.nn.Parameter(torch.zeros(3))
    opt = torch.optim.Adam([p], lr=0.1)
    prepare_optimizer_for_capture(opt)
    group = opt.param_groups[0]
    assert group["capturable"] is True
    assert isinstance(group["lr"], torch.Tensor) and group["lr"].item() == pytest.approx(0.1)


@pytest.mark.gpu
def test_replays_follow_eager_steps_and_registered_generators():
    x = torch.zeros(8, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(1)
    twin = torch.Generator(device="cuda").manual_seed(1)

    def step():
        x.add_(torch.rand(8, device="cuda", generator=gen))
        return x.sum()

    run = CapturedStep(step, warmup=2, generators=[gen])
    want = torch.zeros(8, device="cuda")
    for _ in range(5):
        loss = run()
        want += torch.rand(8, device="cuda", generator=twin)
        torch.testing.assert_close(loss, want.sum())
    assert run.captured
