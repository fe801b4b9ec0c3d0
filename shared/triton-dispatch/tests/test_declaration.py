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


def test_plan_for_builds_the_plan_the_call_then_runs():
    EXP._plans.clear()
    EXP._kernel_plans.clear()
    before = _ExpPlan.builds
    x = _x(rows=4, cols=6)
    plan = EXP.plan_for(x, None, scale=2.0)
    assert isinstance(plan, _ExpPlan) and _ExpPlan.builds == before + 1
    assert EXP.plan_for(x, None, scale=2.0) is plan
    assert_close(EXP(_x(rows=4, cols=6).copy_(x), None, scale=2.0), torch.exp(2 * x.double()))
    assert _ExpPlan.builds == before + 1  # the call found the plan plan_for built
    # where the reference runs the call there is no plan; bad arguments raise as the call does
    assert EXP.plan_for(x, None, scale=11.0) is None
    assert EXP.plan_for(x, None, backend="torch") is None
    with pytest.raises(ValueError, match="shift must have x's shape"):
        EXP.plan_for(x, _x(rows=3, cols=6))
    with pytest.raises(TypeError, match="takes 2 tensors"):
        EXP.plan_for(x)


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
    value = {k: v.to(DEVICE) if isinstance(v, torch.Tensor) else v for k, v in value.items()}
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


@triton.jit
def _mul_kernel(a_ptr, b_ptr, out_ptr, cols, sa0, sa1, sb0, sb1, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < cols
    a = tl.load(a_ptr + row * sa0 + offs * sa1, mask=mask)
    b = tl.load(b_ptr + row * sb0 + offs * sb1, mask=mask)
    tl.store(out_ptr + row * cols + offs, a * b, mask=mask)


class _MulPlan:
    """``a * b`` of (N, D) float32 tensors read with the strides the plan was built for; its
    backward makes only the gradients autograd asks for."""

    launches = 0

    def __init__(self, a, b) -> None:
        self.shape, self.strides = tuple(a.shape), (a.stride(), b.stride())
        self.block = triton.next_power_of_2(max(a.shape[1], 1))

    def _mul(self, x, y, x_stride, y_stride):
        type(self).launches += 1
        out = torch.empty(self.shape, device=x.device)
        if out.numel():
            grid = (self.shape[0],)
            _mul_kernel[grid](x, y, out, self.shape[1], *x_stride, *y_stride, BLOCK=self.block)
        return out

    def forward(self, a, b):
        return self._mul(a, b, *self.strides)

    def backward(self, grad, a, b, needs):
        rows = (self.shape[1], 1)  # the gradient arrives contiguous
        grad_a = self._mul(grad, b, rows, self.strides[1]) if needs[0] else None
        grad_b = self._mul(grad, a, rows, self.strides[0]) if needs[1] else None
        return grad_a, grad_b


def _same_shapes(call) -> None:
    if call["a"].shape != call["b"].shape:
        raise ValueError(f"b must have a's shape {tuple(call['a'].shape)}")


MUL = OpDeclaration(
    "triton_dispatch_tests::mul",
    inputs=[
        TensorSpec("a", (torch.float32,), "(N, D)", fits=_rows_and_columns),
        TensorSpec("b", (torch.float32,), "(N, D)", fits=_rows_and_columns),
    ],
    check=_same_shapes,
    outputs=("y",),
    returns=("y",),
    saved=("a", "b"),
    # the plan binds the inputs' strides: a contiguous copy would be read with the wrong ones
    keep_strides=("a", "b"),
    backward_needs=True,
    reference=lambda a, b: a * b,
    plan=lambda call: _MulPlan(call["a"], call["b"]),
    fake=lambda a, b: a.new_empty(a.shape),
    backward_fake=lambda grad, a, b, needs: (a.new_empty(a.shape), b.new_empty(b.shape)),
)


def _strided_pair(grad_a: bool = True, grad_b: bool = True):
    a = torch.randn(5, 14, device=DEVICE)[:, ::2].requires_grad_(grad_a)  # a strided view
    b = torch.randn(7, 5, device=DEVICE).t().requires_grad_(grad_b)  # column-major
    return a, b


@pytest.mark.parametrize(("grad_a", "grad_b"), [(True, True), (True, False), (False, True)])
def test_saved_inputs_keep_their_strides_and_unneeded_gradients_are_skipped(grad_a, grad_b):
    a, b = _strided_pair(grad_a, grad_b)
    y = MUL(a, b)
    assert_close(y, a.detach().double() * b.detach().double())
    grad = torch.randn_like(y)
    inputs = [x for x in (a, b) if x.requires_grad]
    before = _MulPlan.launches
    got = torch.autograd.grad(y, inputs, grad)
    assert _MulPlan.launches == before + len(inputs)  # no launch for a gradient nobody reads
    expected = {id(a): b.detach().double(), id(b): a.detach().double()}
    for x, g in zip(inputs, got, strict=True):
        assert_close(g, grad.double() * expected[id(x)])


def test_custom_ops_with_kept_strides_and_needs_pass_opcheck():
    for grads in ((True, True), (True, False)):  # a gradient left None comes out as zeros
        torch.library.opcheck(MUL.op, _strided_pair(*grads))


def test_keep_strides_names_saved_inputs_only():
    with pytest.raises(ValueError, match="keep_strides"):
        OpDeclaration(
            "triton_dispatch_tests::broken_strides",
            inputs=[TensorSpec("x", (torch.float32,), "(N,)")],
            outputs=("y",),
            returns=("y",),
            saved=("y",),
            keep_strides=("y",),
            reference=torch.exp,
            plan=lambda call: None,
            fake=lambda x: x.new_empty(x.shape),
            backward_fake=lambda grad, y: y.new_empty(y.shape),
        )


def test_dtypes_in_words_name_the_argument():
    spec = TensorSpec("x", (torch.float32,), "(N,)", dtypes_expected="a float32 (floating) tensor")
    with pytest.raises(
        TypeError, match=r"x must be a float32 \(floating\) tensor, got torch.int64"
    ):
        spec.check(torch.zeros(3, dtype=torch.int64))


def test_type_error_picks_the_exception_of_a_wrong_kind_or_dtype():
    spec = TensorSpec("codes", (torch.int64,), "(B, L)", type_error=ValueError)
    with pytest.raises(ValueError, match=r"codes must be int64, got torch\.float32"):
        spec.check(torch.zeros(3))
    with pytest.raises(ValueError, match=r"codes must be a torch\.Tensor, got list"):
        spec.check([1, 2])


@triton.jit
def _double_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, 2.0 * tl.load(x_ptr + offs, mask=mask), mask=mask)


class _DoublePlan:
    """2x of an (N, D) float32 tensor of any strides: copied when it is not contiguous, so the
    plan binds no strides."""

    builds = 0

    def __init__(self, n: int) -> None:
        type(self).builds += 1
        self.n = n

    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        if self.n:
            _double_kernel[(triton.cdiv(self.n, 64),)](x, y, self.n, BLOCK=64)
        return y


DOUBLE = OpDeclaration(
    "triton_dispatch_tests::double",
    inputs=[
        TensorSpec("x", (torch.float32,), "(N, D)", fits=_rows_and_columns, binds_strides=False)
    ],
    outputs=("y",),
    returns=("y",),
    reference=lambda x: 2 * x,
    plan=lambda call: _DoublePlan(call["x"].numel()),
    fake=lambda x: torch.empty_like(x, memory_format=torch.contiguous_format),
)


def test_a_tensor_whose_strides_the_plan_does_not_bind_is_keyed_by_contiguity():
    DOUBLE._plans.clear()
    before = _DoublePlan.builds
    views = [
        torch.randn(5, 14, device=DEVICE)[:, ::2],  # strides (14, 2)
        torch.randn(5, 21, device=DEVICE)[:, ::3],  # strides (21, 3): the same plan
        torch.randn(1, 7, device=DEVICE).expand(5, 7),  # strides (0, 1): the same plan
        torch.randn(5, 7, device=DEVICE),  # contiguous: a plan of its own
    ]
    for x in views:
        assert_close(DOUBLE(x), 2 * x.double())
    assert (DOUBLE._plans.hits, DOUBLE._plans.misses) == (2, 2)
    assert _DoublePlan.builds == before + 2


class _SquaredSumPlan:
    """``y = x + s²`` with ``s = table.sum(0)``, ``s`` also returned; the table's gradient,
    ``2·s·Σ_rows grad`` in every row, needs its row count and dtype but not its values."""

    def __init__(self, table_shape, table_dtype) -> None:
        self.rows, self.dtype = table_shape[0], table_dtype

    def forward(self, x, table):
        s = table.sum(0)
        return x + (s * s).to(x.dtype), s

    def backward(self, grad_y, s):
        column = 2 * s * grad_y.sum(0).to(s.dtype)
        return grad_y, column.expand(self.rows, -1).to(self.dtype).contiguous()


SQUARED_SUM = OpDeclaration(
    "triton_dispatch_tests::squared_sum",
    inputs=[
        TensorSpec("x", (torch.float32,), "(N, D)", fits=_rows_and_columns),
        TensorSpec("table", (torch.float32, torch.float64), "(K, D)", fits=_rows_and_columns),
    ],
    outputs=("y", "s"),
    returns=("y", "s"),
    differentiable_outputs=("y",),  # s reaches the caller detached
    saved=("s",),
    saved_meta=("table",),  # the table may change in place before the backward
    reference=lambda x, table: (x + (table.sum(0) ** 2).to(x.dtype), table.sum(0).detach()),
    plan=lambda call: _SquaredSumPlan(call["table"].shape, call["table"].dtype),
    fake=lambda x, table: (torch.empty_like(x), table.new_empty(table.shape[1:])),
    backward_fake=lambda grad, s, *, table_shape, table_dtype: (
        torch.empty_like(grad),
        s.new_empty(table_shape, dtype=table_dtype),
    ),
    backward_plan=lambda named: _SquaredSumPlan(named["table_shape"], named["table_dtype"]),
)


def _squared_sum_inputs(dtype=torch.float64):
    x = torch.randn(5, 3, device=DEVICE, requires_grad=True)
    return x, torch.randn(4, 3, device=DEVICE, dtype=dtype, requires_grad=True)


@pytest.mark.parametrize("route", ["eager", "custom op", "reference"])
def test_detached_outputs_and_a_table_changed_in_place_before_the_backward(route):
    x, table = _squared_sum_inputs()
    s_before = table.detach().sum(0)
    if route == "eager":
        y, s = SQUARED_SUM(x, table)
    elif route == "custom op":
        y, s = torch.ops.triton_dispatch_tests.squared_sum(x, table)
    else:
        y, s = SQUARED_SUM(x, table, backend="torch")
    assert y.requires_grad and not s.requires_grad
    with torch.no_grad():
        table.add_(1.0)  # saving the table would make the backward refuse to run
    grad = torch.randn_like(y)
    grad_x, grad_table = torch.autograd.grad(y, [x, table], grad)
    assert torch.equal(grad_x, grad)  # passed through (the backward op returns a copy)
    assert grad_table.dtype == torch.float64
    assert_close(grad_table, (2 * s_before * grad.double().sum(0)).expand(4, -1), tol=1e-6)


def test_custom_ops_with_detached_outputs_and_saved_meta_pass_opcheck():
    schema = str(torch.ops.triton_dispatch_tests.squared_sum_backward.default._schema)
    assert "Tensor? grad_y, Tensor s, *, SymInt[] table_shape, ScalarType table_dtype" in schema
    for dtype in (torch.float32, torch.float64):
        torch.library.opcheck(SQUARED_SUM.op, _squared_sum_inputs(dtype))


def test_saved_meta_and_differentiable_outputs_name_what_they_must():
    common = dict(
        inputs=[TensorSpec("x", (torch.float32,), "(N,)")],
        outputs=("y", "z"),
        returns=("y",),
        saved=("y",),
        reference=torch.exp,
        plan=lambda call: None,
        fake=lambda x: x.new_empty(x.shape),
        backward_fake=lambda grad, y: y.new_empty(y.shape),
    )
    with pytest.raises(ValueError, match="differentiable_outputs"):
        OpDeclaration("triton_dispatch_tests::broken_graded", differentiable_outputs=("z",),
                      **common)  # fmt: skip
    with pytest.raises(ValueError, match="saved_meta"):  # and without backward_plan
        OpDeclaration("triton_dispatch_tests::broken_meta", saved_meta=("x",), **common)


def test_setting_type_errors_and_float_subclasses():
    np = pytest.importorskip("numpy")
    metric = SettingSpec("metric", str, "l2", choices=("l2", "cosine"), type_error=ValueError)
    with pytest.raises(ValueError, match="metric must be a str, got int"):
        metric.check(3)
    with pytest.raises(TypeError, match="k must be an int, got float"):
        SettingSpec("k", int, 1).check(1.5)
    weight = SettingSpec("weight", float, 1.0)
    assert weight.check(np.float64(0.25)) == 0.25 and type(weight.check(np.float64(1))) is float
    with pytest.raises(TypeError, match="weight must be a float, got bool"):
        weight.check(True)


@pytest.mark.parametrize("rows", [4, 0])
def test_traced_calls_take_the_custom_op_or_for_empty_inputs_the_reference(rows):
    """Under ``torch.compile`` (dynamo with the eager backend: no C compiler needed) a call goes
    through the registered custom op, and an empty one through the reference, gradients
    included."""
    x = _x(rows=rows, grad=True)

    @torch.compile(backend="eager", fullgraph=True)
    def loss(x):
        return EXP(x, None, scale=2.0).sum()

    (got,) = torch.autograd.grad(loss(x), x)
    assert_close(got, 2 * torch.exp(2 * x.detach().double()))


def test_a_kept_plan_does_not_skip_the_checks_of_a_different_call():
    """A repeat call runs its kept entry unchecked; a call whose checks would fail never
    matches one, whatever was called before (a bool equals 1.0 but is no float, a name that is
    not a setting, a wrong count, a strided view of a shape already seen)."""
    x = torch.zeros(3, 4, device=DEVICE)
    for _ in range(2):
        EXP(x, None)
        EXP(x, None, scale=1.0)
        EXP(x, None, scale=1)  # an int for a float setting passes its check
        with pytest.raises(TypeError, match="scale must be a float, got bool"):
            EXP(x, None, scale=True)
        with pytest.raises(TypeError, match="unexpected settings"):
            EXP(x, None, gain=2.0)
        with pytest.raises(TypeError, match="takes 2 tensors"):
            EXP(x)
        with pytest.raises(TypeError, match=r"shift must be a torch\.Tensor"):
            EXP(x, 1.0)
        with pytest.raises(ValueError, match="x must be contiguous"):
            EXP(torch.zeros(3, 8, device=DEVICE)[:, ::2], None)
        with pytest.raises(ValueError, match="shift must have x's shape"):
            EXP(x, torch.zeros(4, 3, device=DEVICE))


def test_grad_mode_and_requires_grad_pick_the_entry():
    x = _x(grad=True)
    with torch.no_grad():
        assert not EXP(x, None).requires_grad
    assert EXP(x, None).requires_grad
    assert not EXP(x.detach(), None).requires_grad
    shift = _x(grad=True)  # only the optional input tracked
    y = EXP(x.detach(), shift)
    (got,) = torch.autograd.grad(y.sum(), shift)
    assert_close(got, torch.exp(x.detach().double() + shift.detach().double()))


def test_the_forced_backend_is_part_of_the_key(monkeypatch):
    from triton_dispatch import BACKEND_ENV_VAR
    from triton_dispatch.launch import forced_backend_key

    monkeypatch.delenv(BACKEND_ENV_VAR, raising=False)
    x = _x()
    unset = forced_backend_key()
    EXP(x, None)
    before = _ExpPlan.builds
    monkeypatch.setenv(BACKEND_ENV_VAR, "torch")
    assert forced_backend_key() != unset
    misses = EXP._plans.misses
    assert_close(EXP(x, None, scale=0.5), torch.exp(0.5 * x.double()))
    assert EXP._plans.misses == misses + 1 and _ExpPlan.builds == before  # the reference ran
    monkeypatch.delenv(BACKEND_ENV_VAR)
    assert forced_backend_key() == unset
