"""Triton kernels of ``nearest_rotation``: all ``T`` matrices in one program, no host round trip.

Forward: scaled Newton iteration for the orthogonal polar factor ``Q`` of ``M``
(``X ← (γX + X⁻ᵀ/γ) / 2``, ``X⁻ᵀ`` from cofactors), which converges quadratically from any
non-singular start. Where ``det M < 0``, ``Q`` is a reflection; the nearest rotation is then
``Q (I − 2 v vᵀ)`` with ``v`` the eigenvector of ``H = Qᵀ M`` of smallest eigenvalue (Newton on
the characteristic polynomial, then a cross product of two rows of ``H − λI``). The kernel also writes the
symmetric factor ``Hs = sym(Rᵀ M)`` that the backward needs.

Backward: with ``K = tr(Hs) I − Hs`` and ``c = K⁻¹ vee(Rᵀ G − Gᵀ R)``, the gradient is
``R [c]×`` (the identity ``S[ω]× + [ω]×S = [(tr S · I − S) ω]×`` turns the Sylvester equation of
the polar factor's derivative into a 3×3 solve; ``K``'s eigenvalues are the ``s_i + s_j`` of the SVD
form, so it stays finite at the identity).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from triton_dispatch import next_power_of_2
from triton_dispatch.compile_ahead import backward_follows
from triton_dispatch.launch import KernelLaunch, PlanCache

_NEWTON_STEPS = 12
_EIGEN_STEPS = 40


# fmt: off
@triton.jit
def _cofactors(a00, a01, a02, a10, a11, a12, a20, a21, a22):
    """Cofactor matrix (``A⁻ᵀ = cof / det``) and the determinant."""
    c00 = a11 * a22 - a12 * a21
    c01 = a12 * a20 - a10 * a22
    c02 = a10 * a21 - a11 * a20
    c10 = a02 * a21 - a01 * a22
    c11 = a00 * a22 - a02 * a20
    c12 = a01 * a20 - a00 * a21
    c20 = a01 * a12 - a02 * a11
    c21 = a02 * a10 - a00 * a12
    c22 = a00 * a11 - a01 * a10
    det = a00 * c00 + a01 * c01 + a02 * c02
    return c00, c01, c02, c10, c11, c12, c20, c21, c22, det


@triton.jit
def _matmul(a00, a01, a02, a10, a11, a12, a20, a21, a22,
            b00, b01, b02, b10, b11, b12, b20, b21, b22):
    return (
        a00 * b00 + a01 * b10 + a02 * b20, a00 * b01 + a01 * b11 + a02 * b21,
        a00 * b02 + a01 * b12 + a02 * b22,
        a10 * b00 + a11 * b10 + a12 * b20, a10 * b01 + a11 * b11 + a12 * b21,
        a10 * b02 + a11 * b12 + a12 * b22,
        a20 * b00 + a21 * b10 + a22 * b20, a20 * b01 + a21 * b11 + a22 * b21,
        a20 * b02 + a21 * b12 + a22 * b22,
    )


@triton.jit
def _load9(ptr, offs, mask, stride_t, stride_i, stride_j):
    base = ptr + offs * stride_t
    return (
        tl.load(base, mask=mask, other=1.0),
        tl.load(base + stride_j, mask=mask, other=0.0),
        tl.load(base + 2 * stride_j, mask=mask, other=0.0),
        tl.load(base + stride_i, mask=mask, other=0.0),
        tl.load(base + stride_i + stride_j, mask=mask, other=1.0),
        tl.load(base + stride_i + 2 * stride_j, mask=mask, other=0.0),
        tl.load(base + 2 * stride_i, mask=mask, other=0.0),
        tl.load(base + 2 * stride_i + stride_j, mask=mask, other=0.0),
        tl.load(base + 2 * stride_i + 2 * stride_j, mask=mask, other=1.0),
    )


@triton.jit
def _store9(ptr, offs, mask, a00, a01, a02, a10, a11, a12, a20, a21, a22):
    base = ptr + offs * 9
    tl.store(base, a00, mask=mask)
    tl.store(base + 1, a01, mask=mask)
    tl.store(base + 2, a02, mask=mask)
    tl.store(base + 3, a10, mask=mask)
    tl.store(base + 4, a11, mask=mask)
    tl.store(base + 5, a12, mask=mask)
    tl.store(base + 6, a20, mask=mask)
    tl.store(base + 7, a21, mask=mask)
    tl.store(base + 8, a22, mask=mask)


@triton.jit
def _forward_kernel(
    m_ptr, r_ptr, h_ptr, T, stride_t, stride_i, stride_j,
    BLOCK_T: tl.constexpr, NEWTON_STEPS: tl.constexpr, EIGEN_STEPS: tl.constexpr,
):
    offs = tl.arange(0, BLOCK_T)
    mask = offs < T
    m00, m01, m02, m10, m11, m12, m20, m21, m22 = _load9(m_ptr, offs, mask, stride_t, stride_i, stride_j)
    tiny = 1e-30
    x00, x01, x02, x10, x11, x12, x20, x21, x22 = m00, m01, m02, m10, m11, m12, m20, m21, m22
    for _ in range(NEWTON_STEPS):  # a real loop: unrolled, it compiles for seconds
        c00, c01, c02, c10, c11, c12, c20, c21, c22, det = _cofactors(
            x00, x01, x02, x10, x11, x12, x20, x21, x22
        )
        det = tl.where(tl.abs(det) < tiny, tiny, det)
        norm_x = tl.sqrt(x00 * x00 + x01 * x01 + x02 * x02 + x10 * x10 + x11 * x11 + x12 * x12
                         + x20 * x20 + x21 * x21 + x22 * x22)
        norm_c = tl.sqrt(c00 * c00 + c01 * c01 + c02 * c02 + c10 * c10 + c11 * c11 + c12 * c12
                         + c20 * c20 + c21 * c21 + c22 * c22)
        # γ = sqrt(‖X⁻¹‖ / ‖X‖) balances the two terms (Higham's scaling)
        gamma = tl.sqrt(norm_c / (tl.abs(det) * norm_x + tiny))
        a = 0.5 * gamma
        b = 0.5 / (gamma * det)
        x00, x01, x02 = a * x00 + b * c00, a * x01 + b * c01, a * x02 + b * c02
        x10, x11, x12 = a * x10 + b * c10, a * x11 + b * c11, a * x12 + b * c12
        x20, x21, x22 = a * x20 + b * c20, a * x21 + b * c21, a * x22 + b * c22

    # H = Qᵀ M (symmetric positive semi-definite at convergence)
    h00, h01, h02, h10, h11, h12, h20, h21, h22 = _matmul(
        x00, x10, x20, x01, x11, x21, x02, x12, x22, m00, m01, m02, m10, m11, m12, m20, m21, m22
    )
    h01 = 0.5 * (h01 + h10)
    h02 = 0.5 * (h02 + h20)
    h12 = 0.5 * (h12 + h21)
    # smallest eigenvalue of H: Newton on the characteristic polynomial p from a Gershgorin lower
    # bound. p is increasing and concave left of its smallest root, so the steps never overshoot.
    c2 = h00 + h11 + h22
    c1 = h00 * h11 - h01 * h01 + h00 * h22 - h02 * h02 + h11 * h22 - h12 * h12
    c0 = h00 * (h11 * h22 - h12 * h12) - h01 * (h01 * h22 - h12 * h02) + h02 * (h01 * h12 - h11 * h02)
    lam = tl.minimum(
        tl.minimum(h00 - tl.abs(h01) - tl.abs(h02), h11 - tl.abs(h01) - tl.abs(h12)),
        h22 - tl.abs(h02) - tl.abs(h12),
    )
    for _ in range(EIGEN_STEPS):
        p = ((lam - c2) * lam + c1) * lam - c0
        dp = (3.0 * lam - 2.0 * c2) * lam + c1
        lam = tl.where(dp > 0, lam - p / tl.where(dp > 0, dp, 1.0), lam)
    # its eigenvector: the longest cross product of two rows of H − λI
    d00, d11, d22 = h00 - lam, h11 - lam, h22 - lam
    x01_0, x01_1, x01_2 = h01 * h12 - h02 * d11, h02 * h01 - d00 * h12, d00 * d11 - h01 * h01
    x02_0, x02_1, x02_2 = h01 * d22 - h02 * h12, h02 * h02 - d00 * d22, d00 * h12 - h01 * h02
    x12_0, x12_1, x12_2 = d11 * d22 - h12 * h12, h12 * h02 - h01 * d22, h01 * h12 - d11 * h02
    n0 = x01_0 * x01_0 + x01_1 * x01_1 + x01_2 * x01_2
    n1 = x02_0 * x02_0 + x02_1 * x02_1 + x02_2 * x02_2
    n2 = x12_0 * x12_0 + x12_1 * x12_1 + x12_2 * x12_2
    use0 = (n0 >= n1) & (n0 >= n2)
    use1 = (~use0) & (n1 >= n2)
    v0 = tl.where(use0, x01_0, tl.where(use1, x02_0, x12_0))
    v1 = tl.where(use0, x01_1, tl.where(use1, x02_1, x12_1))
    v2 = tl.where(use0, x01_2, tl.where(use1, x02_2, x12_2))
    # a repeated smallest eigenvalue (e.g. M a pure reflection) leaves H − λI of rank ≤ 1 and every
    # cross product ~0; any unit vector of the eigenspace is then a nearest answer: one orthogonal
    # to the largest row, or e_z when H − λI vanishes
    hn2 = h00 * h00 + h11 * h11 + h22 * h22 + 2.0 * (h01 * h01 + h02 * h02 + h12 * h12)
    m0 = d00 * d00 + h01 * h01 + h02 * h02
    m1 = h01 * h01 + d11 * d11 + h12 * h12
    m2 = h02 * h02 + h12 * h12 + d22 * d22
    row0 = (m0 >= m1) & (m0 >= m2)
    row1 = (~row0) & (m1 >= m2)
    s0 = tl.where(row0, d00, tl.where(row1, h01, h02))
    s1 = tl.where(row0, h01, tl.where(row1, d11, h12))
    s2 = tl.where(row0, h02, tl.where(row1, h12, d22))
    ax0 = (tl.abs(s0) <= tl.abs(s1)) & (tl.abs(s0) <= tl.abs(s2))
    ax1 = (~ax0) & (tl.abs(s1) <= tl.abs(s2))
    f0 = tl.where(ax0, 0.0, tl.where(ax1, -s2, s1))
    f1 = tl.where(ax0, s2, tl.where(ax1, 0.0, -s0))
    f2 = tl.where(ax0, -s1, tl.where(ax1, s0, 0.0))
    flat = tl.maximum(tl.maximum(m0, m1), m2) <= 1e-12 * hn2
    f0 = tl.where(flat, 0.0, f0)
    f1 = tl.where(flat, 0.0, f1)
    f2 = tl.where(flat, 1.0, f2)
    degenerate = tl.maximum(tl.maximum(n0, n1), n2) <= 1e-12 * hn2 * hn2
    v0 = tl.where(degenerate, f0, v0)
    v1 = tl.where(degenerate, f1, v1)
    v2 = tl.where(degenerate, f2, v2)
    inv = 1.0 / tl.sqrt(v0 * v0 + v1 * v1 + v2 * v2 + tiny)
    _c, _c, _c, _c, _c, _c, _c, _c, _c, det_m = _cofactors(m00, m01, m02, m10, m11, m12, m20, m21, m22)
    # only reflections get the Householder flip (w = 0 leaves Q as it is)
    flip = tl.where(det_m < 0, inv, 0.0)
    w0, w1, w2 = v0 * flip, v1 * flip, v2 * flip
    qw0 = x00 * w0 + x01 * w1 + x02 * w2
    qw1 = x10 * w0 + x11 * w1 + x12 * w2
    qw2 = x20 * w0 + x21 * w1 + x22 * w2
    r00, r01, r02 = x00 - 2.0 * qw0 * w0, x01 - 2.0 * qw0 * w1, x02 - 2.0 * qw0 * w2
    r10, r11, r12 = x10 - 2.0 * qw1 * w0, x11 - 2.0 * qw1 * w1, x12 - 2.0 * qw1 * w2
    r20, r21, r22 = x20 - 2.0 * qw2 * w0, x21 - 2.0 * qw2 * w1, x22 - 2.0 * qw2 * w2
    # Hs = sym(Rᵀ M): the signed symmetric factor (its eigenvalues are the folded singular values)
    s00, s01, s02, s10, s11, s12, s20, s21, s22 = _matmul(
        r00, r10, r20, r01, r11, r21, r02, r12, r22, m00, m01, m02, m10, m11, m12, m20, m21, m22
    )
    s01 = 0.5 * (s01 + s10)
    s02 = 0.5 * (s02 + s20)
    s12 = 0.5 * (s12 + s21)
    _store9(r_ptr, offs, mask, r00, r01, r02, r10, r11, r12, r20, r21, r22)
    _store9(h_ptr, offs, mask, s00, s01, s02, s01, s11, s12, s02, s12, s22)


@triton.jit
def _backward_kernel(
    g_ptr, r_ptr, h_ptr, out_ptr, T, stride_gt, stride_gi, stride_gj,
    BLOCK_T: tl.constexpr,
):
    offs = tl.arange(0, BLOCK_T)
    mask = offs < T
    g00, g01, g02, g10, g11, g12, g20, g21, g22 = _load9(g_ptr, offs, mask, stride_gt, stride_gi, stride_gj)
    r00, r01, r02, r10, r11, r12, r20, r21, r22 = _load9(r_ptr, offs, mask, 9, 3, 1)
    h00, h01, h02, _h10, h11, h12, _h20, _h21, h22 = _load9(h_ptr, offs, mask, 9, 3, 1)
    # B = Rᵀ G; b = vee(B − Bᵀ) = (B21 − B12, B02 − B20, B10 − B01)
    _b00, b01, b02, b10, _b11, b12, b20, b21, _b22 = _matmul(
        r00, r10, r20, r01, r11, r21, r02, r12, r22, g00, g01, g02, g10, g11, g12, g20, g21, g22
    )
    e0 = b21 - b12
    e1 = b02 - b20
    e2 = b10 - b01
    tr = h00 + h11 + h22
    k00, k11, k22 = tr - h00, tr - h11, tr - h22
    k01, k02, k12 = -h01, -h02, -h12
    i00, i01, i02, _i10, i11, i12, _i20, _i21, i22, det = _cofactors(
        k00, k01, k02, k01, k11, k12, k02, k12, k22
    )
    eps = 1e-30
    det = tl.where(tl.abs(det) < eps, eps, det)
    c0 = (i00 * e0 + i01 * e1 + i02 * e2) / det
    c1 = (i01 * e0 + i11 * e1 + i12 * e2) / det
    c2 = (i02 * e0 + i12 * e1 + i22 * e2) / det
    # R [c]×, [c]× = [[0, −c2, c1], [c2, 0, −c0], [−c1, c0, 0]]
    o00, o01, o02, o10, o11, o12, o20, o21, o22 = _matmul(
        r00, r01, r02, r10, r11, r12, r20, r21, r22, 0.0 * c0, -c2, c1, c2, 0.0 * c0, -c0, -c1, c0, 0.0 * c0
    )
    _store9(out_ptr, offs, mask, o00, o01, o02, o10, o11, o12, o20, o21, o22)
# fmt: on


class RotationPlan:
    """The forward and backward launches of ``T`` matrices with given strides, bound once."""

    def __init__(self, t, stride, dtype, device) -> None:
        self.t, self.dtype, self.device = t, dtype, device
        block = max(next_power_of_2(t), 2)
        self.forward_launch = KernelLaunch(
            _forward_kernel,
            (1,),
            dict(
                T=t,
                stride_t=stride[0],
                stride_i=stride[1],
                stride_j=stride[2],
                BLOCK_T=block,
                NEWTON_STEPS=_NEWTON_STEPS,
                EIGEN_STEPS=_EIGEN_STEPS,
            ),
            device=device,
            options={"num_warps": 1},
        )
        self.backward_launch = KernelLaunch(
            _backward_kernel,
            (1,),
            dict(T=t, stride_gt=9, stride_gi=3, stride_gj=1, BLOCK_T=block),
            device=device,
            options={"num_warps": 1},
        )

    def compile_backward_ahead(self) -> None:
        """Compile the backward on a background thread while the forward compiles."""
        self.backward_launch.compile_ahead(*(self.dtype,) * 4)

    def forward(self, matrices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rot = torch.empty((self.t, 3, 3), dtype=self.dtype, device=self.device)
        sym = torch.empty_like(rot)
        if self.t:
            self.forward_launch(matrices, rot, sym)
        return rot, sym

    def backward(self, grad: torch.Tensor, rot: torch.Tensor, sym: torch.Tensor) -> torch.Tensor:
        """The gradient of a contiguous ``grad`` (``rot`` and ``sym`` as the forward made them)."""
        out = torch.empty((self.t, 3, 3), dtype=self.dtype, device=self.device)
        if self.t:
            self.backward_launch(grad, rot, sym, out)
        return out


_PLANS: PlanCache[RotationPlan] = PlanCache("tomo_kplanes.nearest_rotation_kernels")


def rotation_plan(matrices: torch.Tensor) -> RotationPlan:
    """The cached plan of validated ``(T, 3, 3)`` matrices."""
    meta = (matrices.shape[0], matrices.stride(), matrices.dtype, matrices.device)

    def build() -> RotationPlan:
        plan = RotationPlan(*meta)
        if backward_follows(matrices):
            plan.compile_backward_ahead()
        return plan

    return _PLANS.get(meta, build)
