"""Triton kernels of ``plane_tv``: a partial-sum pass and a one-program finish for the value, one
pointwise pass for the gradient.

The planes are walked in memory order. For a dense tensor (contiguous or channels-last, any
permutation of a contiguous layout) the memory offset ``o`` of an element gives its row and column
as ``(o // stride_h) % H`` and ``(o // stride_w) % W``, and its neighbours sit at ``o ± stride_h``
and ``o ± stride_w``; the gradient is written with the planes' own strides.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from triton_dispatch import interpreter_enabled
from triton_dispatch.compile_ahead import backward_follows
from triton_dispatch.launch import KernelLaunch, PlanCache


@triton.jit(do_not_specialize=["numel", "H", "W", "stride_h", "stride_w"])
def _partials_kernel(p_ptr, partial_ptr, numel, H, W, stride_h, stride_w, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    inside = offs < numel
    row = (offs // stride_h) % H
    col = (offs // stride_w) % W
    x = tl.load(p_ptr + offs, mask=inside, other=0.0)
    has_down = inside & (row < H - 1)
    has_right = inside & (col < W - 1)
    down = tl.load(p_ptr + offs + stride_h, mask=has_down, other=0.0)
    right = tl.load(p_ptr + offs + stride_w, mask=has_right, other=0.0)
    dh = tl.where(has_down, down - x, 0.0)
    dw = tl.where(has_right, right - x, 0.0)
    tl.store(partial_ptr + 2 * pid, tl.sum(dh * dh, axis=0))
    tl.store(partial_ptr + 2 * pid + 1, tl.sum(dw * dw, axis=0))


@triton.jit(do_not_specialize=["programs", "count_h", "count_w"])
def _finish_kernel(
    partial_ptr, out_ptr, programs, count_h, count_w, BLOCK: tl.constexpr, TILES: tl.constexpr
):
    # a constexpr trip count: Triton 3.6's interpreter reads a runtime loop bound with int() of a
    # one-element array, which numpy 2.4 refuses
    acc_h = tl.zeros([BLOCK], dtype=out_ptr.dtype.element_ty)
    acc_w = tl.zeros([BLOCK], dtype=out_ptr.dtype.element_ty)
    for tile in range(TILES):
        i = tile * BLOCK + tl.arange(0, BLOCK)
        m = i < programs
        acc_h += tl.load(partial_ptr + 2 * i, mask=m, other=0.0)
        acc_w += tl.load(partial_ptr + 2 * i + 1, mask=m, other=0.0)
    dtype = out_ptr.dtype.element_ty
    tv = tl.sum(acc_h, axis=0) / count_h.to(dtype) + tl.sum(acc_w, axis=0) / count_w.to(dtype)
    tl.store(out_ptr, tv)


@triton.jit(do_not_specialize=["numel", "H", "W", "stride_h", "stride_w", "count_h", "count_w"])
def _backward_kernel(
    p_ptr, grad_ptr, g_ptr, numel, H, W, stride_h, stride_w, count_h, count_w,
    BLOCK: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    inside = offs < numel
    row = (offs // stride_h) % H
    col = (offs // stride_w) % W
    dtype = grad_ptr.dtype.element_ty
    g = tl.load(g_ptr).to(dtype)
    # d/dp of mean(d²): 2 d / count, each difference d feeding the two texels it joins
    scale_h = g / count_h.to(dtype) * 2.0
    scale_w = g / count_w.to(dtype) * 2.0
    x = tl.load(p_ptr + offs, mask=inside, other=0.0)
    has_up = inside & (row > 0)
    has_down = inside & (row < H - 1)
    has_left = inside & (col > 0)
    has_right = inside & (col < W - 1)
    up = tl.load(p_ptr + offs - stride_h, mask=has_up, other=0.0)
    down = tl.load(p_ptr + offs + stride_h, mask=has_down, other=0.0)
    left = tl.load(p_ptr + offs - stride_w, mask=has_left, other=0.0)
    right = tl.load(p_ptr + offs + stride_w, mask=has_right, other=0.0)
    grad_h = tl.where(has_up, x - up, 0.0) - tl.where(has_down, down - x, 0.0)
    grad_w = tl.where(has_left, x - left, 0.0) - tl.where(has_right, right - x, 0.0)
    tl.store(grad_ptr + offs, scale_h * grad_h + scale_w * grad_w, mask=inside)


class PlaneTVPlan:
    """Launches of one kind of call (shape, strides, dtype, device): grids and sizes fixed once."""

    def __init__(self, shape, stride, dtype, device) -> None:
        *_, h, w = shape
        numel = 1
        for s in shape:
            numel *= s
        self.device, self.dtype, self.shape, self.stride = device, dtype, shape, stride
        block = 1024 if interpreter_enabled() else 2048
        self.programs = triton.cdiv(numel, block)
        count_h, count_w = numel // h * (h - 1), numel // w * (w - 1)
        sizes = dict(numel=numel, H=h, W=w, stride_h=stride[-2], stride_w=stride[-1])
        warps = {"num_warps": 1 if interpreter_enabled() else 8}
        self.partials = KernelLaunch(
            _partials_kernel, (self.programs,), dict(sizes, BLOCK=block), device=device,
            options=warps,
        )  # fmt: skip
        self.finish = KernelLaunch(
            _finish_kernel,
            (1,),
            dict(
                programs=self.programs,
                count_h=count_h,
                count_w=count_w,
                BLOCK=1024,
                TILES=triton.cdiv(self.programs, 1024),
            ),
            device=device,
            options={"num_warps": 1 if interpreter_enabled() else 4},
        )
        self.backward_launch = KernelLaunch(
            _backward_kernel,
            (self.programs,),
            dict(sizes, count_h=count_h, count_w=count_w, BLOCK=block),
            device=device,
            options=warps,
        )

    def compile_ahead(self, backward: bool) -> None:
        """Compile the launches on background threads (the partial sums may come after another
        op's kernel, the finishing pass after them, the backward later still)."""
        self.partials.compile_ahead(self.dtype, self.dtype)
        self.finish.compile_ahead(self.dtype, self.dtype)
        if backward:
            self.backward_launch.compile_ahead(self.dtype, self.dtype, self.dtype)

    def forward(self, planes: torch.Tensor) -> torch.Tensor:
        partial = torch.empty(2 * self.programs, dtype=self.dtype, device=self.device)
        out = torch.empty((), dtype=self.dtype, device=self.device)
        self.partials(planes, partial)
        self.finish(partial, out)
        return out

    def backward(self, grad_out: torch.Tensor, planes: torch.Tensor) -> torch.Tensor:
        """The planes' gradient, with their strides, for the 0-d ``grad_out``."""
        grad = torch.empty_strided(self.shape, self.stride, dtype=self.dtype, device=self.device)
        self.backward_launch(planes, grad, grad_out)
        return grad


class _DenseCopyPlan:
    """Planes in a layout the kernels cannot walk in memory order (a strided view): the plan of
    a dense copy, and a gradient in that copy's layout."""

    def __init__(self, plan: PlaneTVPlan) -> None:
        self.plan = plan

    def forward(self, planes: torch.Tensor) -> torch.Tensor:
        return self.plan.forward(planes.contiguous())

    def backward(self, grad_out: torch.Tensor, planes: torch.Tensor) -> torch.Tensor:
        return self.plan.backward(grad_out, planes.contiguous())


def dense(planes: torch.Tensor) -> bool:
    """Whether the kernels walk ``planes`` as they lie (contiguous or channels-last)."""
    return planes.is_contiguous() or (
        planes.dim() == 4 and planes.is_contiguous(memory_format=torch.channels_last)
    )


def covered(planes: torch.Tensor) -> bool:
    """Whether the kernels take ``planes`` at all: some elements, int32 offsets."""
    return 0 < planes.numel() < 2**31


_PLANS: PlanCache[PlaneTVPlan] = PlanCache("tomo_kplanes.plane_tv_kernels")


def plan_for(planes: torch.Tensor) -> PlaneTVPlan:
    """The launch plan of dense ``planes`` (validated by the caller)."""
    return _plan(planes, planes.stride())


def _plan(planes: torch.Tensor, stride: tuple[int, ...]) -> PlaneTVPlan:
    meta = (tuple(planes.shape), stride, planes.dtype, planes.device)

    def build() -> PlaneTVPlan:
        plan = PlaneTVPlan(*meta)
        plan.compile_ahead(backward=backward_follows(planes))
        return plan

    return _PLANS.get(meta, build)


def plane_tv_plan(planes: torch.Tensor) -> PlaneTVPlan | _DenseCopyPlan | None:
    """The plan of validated ``planes``: their own layout's where it is dense, a dense copy's
    where it is not, ``None`` (the reference) where the kernels do not take them."""
    if not covered(planes):
        return None
    if dense(planes):
        return plan_for(planes)
    return _DenseCopyPlan(_plan(planes, torch.empty(planes.shape, device="meta").stride()))
