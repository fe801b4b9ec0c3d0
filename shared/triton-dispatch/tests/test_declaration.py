"""An op declared once (``triton_dispatch.declaration``) runs the same numbers through every route
it derives: the eager plan (with and without a gradient), the registered custom ops (``opcheck``
runs their fakes, schema and autograd formula), and the reference; bad arguments are named."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from triton_dispatch import interpreter_enabled
from triton_dispatch.declaration import OpDeclaration, TensorSpec
from triton_dispatch.testing import assert_close, poisoned_like

pytestmark = pytest.mark.skipif(
    not (torch.cuda.is_available() or interpreter_enabled()),
    reason="needs CUDA or TRITON_INTERPRET=1",
)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@triton.jit
def _exp_kernel(x_ptr, y_ptr, twice_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    tl.store(y_ptr + offs, tl.exp(x), mask=mask)
    tl.store(twice_ptr + offs, 2.0 * x, mask=mask)


@triton.jit
def _exp_backward_kernel(g_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(g_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, g * tl.load(y_ptr + offs, mask=mask), mask=mask)


class _ExpPlan:
    """exp(x) of a contiguous (N, D) float32 tensor, with 2x as an internal second output."""

    builds = 0

    def __init__(self, n: int) -> None:
        type(self).builds += 1
        self.n, self.grid = n, (triton.cdiv(max(n, 1), 64),)

    def forward(self, x):
        y, twice = torch.empty_like(x), torch.empty_like(x)
        if self.n:
            _exp_kernel[self.grid](x, y, twice, self.n, BLOCK=64)
        return y, twice

    def backward(self, grad_y, y):
        out = torch.empty_like(y)
        if self.n:
            _exp_backward_kernel[self.grid](grad_y, y, out, self.n, BLOCK=64)
        return (out,)


EXP = OpDeclaration(
    "triton_dispatch_tests::exp",
    inputs=[
        TensorSpec(
            "x",
            (torch.float32,),
            "(N, D)",
            fits=lambda shape: len(shape) == 2,
            contiguous=True,
        )
    ],
    outputs=("y", "twice"),
    returns=("y",),
    saved=("y",),
    reference=torch.exp,
    plan=lambda call: _ExpPlan(call["x"].numel()),
    fake=lambda x: (torch.empty_like(x), torch.empty_like(x)),
    backward_fake=lambda grad, y: (torch.empty_like(y),),
    backward_plan=lambda saved: _ExpPlan(saved["y"].numel()),
)


def _x(rows: int = 5, cols: int = 7, grad: bool = False) -> torch.Tensor:
    return torch.randn(rows, cols, device=DEVICE).requires_grad_(grad)


def test_eager_route_matches_the_reference_with_gradients():
    x = _x(grad=True)
    y = EXP(x)
    want = torch.exp(x.detach().double())
    assert_close(y, want)
    grad = torch.randn_like(y)
    (got,) = torch.autograd.grad(y, x, grad)
    assert_close(got, grad.double() * want)


def test_repeat_calls_reuse_one_plan_and_rebuild_for_new_metadata():
    EXP._plans.clear()
    EXP._kernel_plans.clear()
    before = _ExpPlan.builds
    x = _x()
    for _ in range(3):
        EXP(x)
    assert EXP._plans.hits == 2 and _ExpPlan.builds == before + 1
    EXP(_x(rows=3))  # a new shape: a new plan
    assert _ExpPlan.builds == before + 2
    # the same shape with other strides is another kind of call: here one the spec refuses
    with pytest.raises(ValueError, match="x must be contiguous"):
        EXP(_x(rows=5, cols=14)[:, ::2])


def test_outputs_written_by_the_kernels_not_left_from_memory():
    x = _x()
    out = EXP(x)
    assert torch.isfinite(out).all()  # torch.empty memory would be garbage somewhere
    assert_close(out, torch.exp(poisoned_like(x).copy_(x).double()))


def test_custom_ops_pass_opcheck():
    torch.library.opcheck(EXP.op, (_x(grad=True),))
    torch.library.opcheck(EXP.op, (_x(rows=0),))


def test_custom_op_route_matches_eager():
    x = _x(grad=True)
    y, twice = torch.ops.triton_dispatch_tests.exp(x)
    assert_close(twice, 2 * x.detach().double())
    assert not twice.requires_grad  # internal outputs carry no gradient
    (got,) = torch.autograd.grad(y.sum(), x)
    assert_close(got, torch.exp(x.detach().double()))


def test_reference_backend_runs_the_reference():
    x = _x()
    assert_close(EXP(x, backend="torch"), torch.exp(x.double()))


@pytest.mark.parametrize(
    ("value", "error", "match"),
    [
        ([1.0, 2.0], TypeError, "x must be a torch.Tensor"),
        (torch.zeros(3, 4, dtype=torch.float64), TypeError, "x must be float32"),
        (torch.zeros(3), ValueError, r"x must have shape \(N, D\)"),
    ],
)
def test_bad_arguments_are_named(value, error, match):
    with pytest.raises(error, match=match):
        EXP(value)


def test_declaration_rejects_unknown_names():
    with pytest.raises(ValueError, match="unknown"):
        OpDeclaration(
            "triton_dispatch_tests::broken",
            inputs=[TensorSpec("x", (torch.float32,), "(N,)")],
            outputs=("y",),
            returns=("z",),
            reference=torch.exp,
            plan=lambda call: None,
            fake=lambda x: (x,),
        )
