"""``OpDeclaration(grad_setting=..., node_name=...)``: a forward that keeps more for its backward
only when the call will be differentiated learns it through a setting the declaration fills in,
on the eager route and under ``torch.compile``; the eager node carries the given name."""

from __future__ import annotations

import pytest
import torch

from triton_dispatch import interpreter_enabled
from triton_dispatch.declaration import OpDeclaration, SettingSpec, TensorSpec

pytestmark = pytest.mark.skipif(
    not (torch.cuda.is_available() or interpreter_enabled()),
    reason="needs CUDA or TRITON_INTERPRET=1",
)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BUILT: list[bool] = []


class _SquarePlan:
    """``x * x``, keeping a copy of ``x`` for the backward only when told to."""

    def __init__(self, keep: bool) -> None:
        BUILT.append(keep)
        self.keep = keep

    def forward(self, x):
        return x * x, x.clone() if self.keep else x.new_empty((0,))

    def backward(self, grad, kept):
        assert kept.shape == grad.shape, "the forward kept nothing for a differentiated call"
        return 2 * grad * kept


SQUARE = OpDeclaration(
    "triton_dispatch_grad_setting::kept_square",
    inputs=[TensorSpec("x", (torch.float32,), "(N,)", fits=lambda shape: len(shape) == 1)],
    settings=[SettingSpec("keep", bool, False)],
    grad_setting="keep",
    outputs=("y", "kept"),
    returns=("y",),
    saved=("kept",),
    reference=lambda x, keep: x * x,
    plan=lambda call: _SquarePlan(call["keep"]),
    fake=lambda x, keep: (x.new_empty(x.shape), x.new_empty(x.shape if keep else (0,))),
    backward_fake=lambda grad, kept, keep: (kept.new_empty(kept.shape),),
    backward_plan=lambda named: _SquarePlan(named["keep"]),
    node_name="KeptSquare",
)


@pytest.fixture(autouse=True)
def fresh():
    from triton_dispatch.launch import clear_plan_caches

    clear_plan_caches()
    BUILT.clear()
    yield
    clear_plan_caches()


def test_the_setting_says_whether_the_call_is_differentiated():
    x = torch.randn(5, device=DEVICE)
    xg = x.clone().requires_grad_()
    assert SQUARE.validate([x]).settings["keep"] is False
    assert SQUARE.validate([xg]).settings["keep"] is True
    with torch.no_grad():
        assert SQUARE.validate([xg]).settings["keep"] is False
    assert SQUARE.validate([x], None, {"keep": True}).settings["keep"] is True  # given: stays


def test_eager_calls_keep_only_for_a_gradient_through_the_named_node():
    x = torch.randn(5, device=DEVICE)
    assert torch.equal(SQUARE(x), x * x) and BUILT == [False]
    xg = x.clone().requires_grad_()
    y = SQUARE(xg)
    assert type(y.grad_fn).__name__ == "KeptSquareBackward"
    y.sum().backward()
    assert torch.allclose(xg.grad, 2 * x) and BUILT == [False, True]


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_traced_calls_pass_the_setting_to_the_custom_op():
    torch._dynamo.reset()
    x = torch.randn(5, device=DEVICE)

    @torch.compile(fullgraph=True, backend="aot_eager")
    def f(t):
        return SQUARE(t).sum()

    xg = x.clone().requires_grad_()
    f(xg).backward()
    assert torch.allclose(xg.grad, 2 * x)
    assert True in BUILT
    BUILT.clear()
    with torch.no_grad():
        assert torch.allclose(f(x), (x * x).sum())
    assert BUILT == [False]
