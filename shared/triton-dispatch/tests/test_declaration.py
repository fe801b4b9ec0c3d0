"""An op declared once (``triton_dispatch.declaration``) runs the same numbers through every route
it derives: the eager plan (with and without a gradient), the registered custom ops (``opcheck``
runs their fakes, schema and autograd formula), and the reference; bad arguments are named."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from triton_dispatch import interpreter_enabled
from triton_dispatch.declaration import OpDeclaration, SettingSpec, TensorSpec
from triton_dispatch.testing import assert_close, poisoned_like

pytestmark = pytest.mark.skipif(
    not (torch.cuda.is_available() or interpreter_enabled()),
    reason="needs CUDA or TRITON_INTERPRET=1",
)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@triton.jit
def _exp_kernel(x_ptr, shift_ptr, y_ptr, twice_ptr, n, scale, HAS_SHIFT: tl.constexpr,
                BLOCK: tl.constexpr):  # fmt: skip
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    z = scale * x
    if HAS_SHIFT:
        z += tl.load(shift_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, tl.exp(z), mask=mask)
    tl.store(twice_ptr + offs, 2.0 * x, mask=mask)


@triton.jit
def _exp_backward_kernel(g_ptr, y_ptr, dx_ptr, dshift_ptr, n, scale, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    gy = tl.load(g_ptr + offs, mask=mask) * tl.load(y_ptr + offs, mask=mask)
    tl.store(dx_ptr + offs, scale * gy, mask=mask)
    tl.store(dshift_ptr + offs, gy, mask=mask)


class _ExpPlan:
    """exp(scale * x + shift) of contiguous (N, D) float32 tensors (shift optional), with 2x as an
    internal second output."""

    builds = 0

    def __init__(self, n: int, scale: float, has_shift: bool) -> None:
        type(self).builds += 1
        self.n, self.scale, self.has_shift = n, scale, has_shift
        self.grid = (triton.cdiv(max(n, 1), 64),)

    def forward(self, x, shift):
        y, twice = torch.empty_like(x), torch.empty_like(x)
        if self.n:
            _exp_kernel[self.grid](
                x, x if shift is None else shift, y, twice, self.n, self.scale,
                HAS_SHIFT=shift is not None, BLOCK=64,
            )  # fmt: skip
        return y, twice

    def backward(self, grad_y, y):
        dx, dshift = torch.empty_like(y), torch.empty_like(y)
        if self.n:
            _exp_backward_kernel[self.grid](grad_y, y, dx, dshift, self.n, self.scale, BLOCK=64)
        return dx, (dshift if self.has_shift else None)


def _reference(x, shift, *, scale):
    return torch.exp(scale * x + (0 if shift is None else shift))


def _rows_and_columns(shape) -> bool:
    return len(shape) == 2


def _same_shape(call) -> None:
    if call["shift"] is not None and call["shift"].shape != call["x"].shape:
        raise ValueError(
            f"shift must have x's shape {tuple(call['x'].shape)}, got {tuple(call['shift'].shape)}"
        )


EXP = OpDeclaration(
    "triton_dispatch_tests::exp",
    inputs=[
        TensorSpec("x", (torch.float32,), "(N, D)", fits=_rows_and_columns, contiguous=True),
        TensorSpec(
            "shift",
            (torch.float32,),
            "(N, D)",
            fits=_rows_and_columns,
            contiguous=True,
            optional=True,
        ),
    ],
    settings=[
        SettingSpec("scale", float, 1.0, valid=lambda v: v > 0, expected="a number > 0"),
    ],
    check=_same_shape,
    outputs=("y", "twice"),
    returns=("y",),
    saved=("y",),
    reference=_reference,
    # a plan may decline a call: here the reference runs scales above 10
    plan=lambda call: (
        None
        if call["scale"] > 10
        else _ExpPlan(call["x"].numel(), call["scale"], call["shift"] is not None)
    ),
    fake=lambda x, shift, *, scale: (torch.empty_like(x), torch.empty_like(x)),
    backward_fake=lambda grad, y, *, scale: (torch.empty_like(y), torch.empty_like(y)),
    backward_plan=lambda named: _ExpPlan(named["y"].numel(), named["scale"], True),
)


def _x(rows: int = 5, cols: int = 7, grad: bool = False) -> torch.Tensor:
    return torch.randn(rows, cols, device=DEVICE).requires_grad_(grad)


@pytest.mark.parametrize("with_shift", [False, True])
def test_eager_route_matches_the_reference_with_gradients(with_shift):
    x = _x(grad=True)
    shift = _x(grad=True) if with_shift else None
    y = EXP(x, shift, scale=0.5)
    ref_x = x.detach().double().requires_grad_()
    ref_shift = shift.detach().double().requires_grad_() if with_shift else None
    want = _reference(ref_x, ref_shift, scale=0.5)
    assert_close(y, want)
    grad = torch.randn_like(y)
    inputs = [x, shift] if with_shift else [x]
    got = torch.autograd.grad(y, inputs, grad)
    ref_inputs = [ref_x, ref_shift] if with_shift else [ref_x]
    expected = torch.autograd.grad(want, ref_inputs, grad.double())
    for g, e in zip(got, expected, strict=True):
        assert_close(g, e)


def test_repeat_calls_reuse_one_plan_and_rebuild_for_new_metadata():
    EXP._plans.clear()
    EXP._kernel_plans.clear()
    before = _ExpPlan.builds
    x = _x()
    for _ in range(3):
        EXP(x, None)
    assert EXP._plans.hits == 2 and _ExpPlan.builds == before + 1
    EXP(_x(rows=3), None)  # a new shape: a new plan
    assert _ExpPlan.builds == before + 2
    EXP(x, None, scale=2.0)  # a new setting: a new plan
    assert _ExpPlan.builds == before + 3
    # the same shape with other strides is another kind of call: here one the spec refuses
    with pytest.raises(ValueError, match="x must be contiguous"):
        EXP(_x(rows=5, cols=14)[:, ::2], None)


def test_outputs_written_by_the_kernels_not_left_from_memory():
    x = _x()
    out = EXP(x, None)
    assert torch.isfinite(out).all()  # torch.empty memory would be garbage somewhere
    assert_close(out, torch.exp(poisoned_like(x).copy_(x).double()))


def test_custom_ops_pass_opcheck():
    torch.library.opcheck(EXP.op, (_x(grad=True), None), {"scale": 1.5})
    torch.library.opcheck(EXP.op, (_x(grad=True), _x(grad=True)), {"scale": 0.5})
    torch.library.opcheck(EXP.op, (_x(rows=0), None), {"scale": 1.0})


def test_custom_op_route_matches_eager():
    x = _x(grad=True)
    y, twice = torch.ops.triton_dispatch_tests.exp(x, None, scale=2.0)
    assert_close(twice, 2 * x.detach().double())
    assert not twice.requires_grad  # internal outputs carry no gradient
    (got,) = torch.autograd.grad(y.sum(), x)
    assert_close(got, 2 * torch.exp(2 * x.detach().double()))


def test_a_declined_call_runs_the_reference():
    before = _ExpPlan.builds
    x = _x(grad=True)
    y = EXP(x, None, scale=11.0)
    assert _ExpPlan.builds == before
    assert_close(y, torch.exp(11 * x.detach().double()))
    (got,) = torch.autograd.grad(y.sum(), x)  # the reference's own autograd
    assert_close(got, 11 * torch.exp(11 * x.detach().double()))


def test_reference_backend_runs_the_reference():
    x, shift = _x(), _x()
    assert_close(EXP(x, shift, backend="torch", scale=3.0), torch.exp(3 * x.double() + shift))


@pytest.mark.parametrize(
    ("value", "error", "match"),
    [
        ({"x": [1.0, 2.0]}, TypeError, "x must be a torch.Tensor"),
        ({"x": torch.zeros(3, 4, dtype=torch.float64)}, TypeError, "x must be float32"),
        ({"x": torch.zeros(3)}, ValueError, r"x must have shape \(N, D\)"),
        ({"shift": torch.zeros(3)}, ValueError, r"shift must have shape \(N, D\)"),
        ({"shift": torch.zeros(4, 3)}, ValueError, r"shift must have x's shape \(3, 4\)"),
        ({"scale": -1.0}, ValueError, "scale must be a number > 0"),
        ({"scale": "big"}, TypeError, "scale must be a float"),
        ({"scale": [1.0]}, TypeError, "scale must be a float"),  # unhashable: no plan key
        ({"gain": 2.0}, TypeError, "unexpected settings"),
    ],
)
def test_bad_arguments_are_named(value, error, match):
    args = {"x": torch.zeros(3, 4, device=DEVICE), "shift": None, **value}
    settings = {k: v for k, v in args.items() if k not in ("x", "shift")}
    with pytest.raises(error, match=match):
        EXP(args["x"], args["shift"], **settings)


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
