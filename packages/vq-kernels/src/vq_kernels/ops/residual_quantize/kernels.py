"""Triton kernels of the residual search: every level in one launch, and the one-launch backward.

``residual_quantize_kernel``: each program takes a tile of ``BLOCK_B`` rows and runs all ``L``
levels for them. Per level it scans the level's codebook with ``quantize``'s own scan
(:func:`vq_kernels.ops.quantize.kernels.nearest_code_scan`: the same distances, fp32 accumulation in
``BLOCK_D`` chunks, products, NaN rule and lowest-index tie rule as the one-level search), then
walks ``D`` in chunks: ``r_{l+1} = r_l − q_l`` and the running sum ``Σ q`` in the input dtype (as a
per-level loop in PyTorch rounds them), the sum of squares of ``r_{l+1}`` for the loss. The
residuals live in the ``(L + 1, N, D)`` output, which is also what the EMA update and the backward
read: level ``l + 1``'s scan reads what level ``l`` wrote, after a block barrier (threads of one
program read rows other threads wrote; ``__syncthreads`` makes global writes of the block visible
to it). So ``D`` has no cap and nothing else is stored.

Each program writes the sum of squares of its rows, scaled by ``weight / (N·D)``; the loss is the
sum of those partials (one small reduction launch, none with a single program).

``residual_grad_kernel``: ``∂x = g_out + coef · g_loss · Σ_l r_{l+1}``, one pointwise launch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from triton_dispatch import autotune, config_space, interpreter_enabled, shape_bucket
from triton_dispatch.launch import KernelLaunch, PlanCache

from ..quantize.kernels import k_splits, nearest_code_scan

#: Past this many codes over all levels the fused kernel (one program walks every code of every
#: level for its rows) is used only when the one-level search would not split K either: then the
#: per-level search, whose K splits spread a small batch over the GPU, takes over. An estimate of
#: the crossover from the kernels' structure, not a measured one.
FUSED_MAX_SERIAL_CODES = 8192

#: The first calls' stand-in config (run while the tuned one compiles): 32-code tiles without
#: software pipelining compile in about half the time of the tuned 128-code, 3-stage tiles, and
#: give the same codes (the same per-code distances and lowest-index rule; a GPU test checks it).
STAND_IN_BLOCK_K = 32
STAND_IN_OPTIONS = {"num_warps": 4, "num_stages": 1}


def fused_fits(batch: int, num_codes: int, levels: int, device: torch.device) -> bool:
    """Whether the one-launch kernel serves a search of ``batch`` rows in ``levels × num_codes``
    codes (else the op runs the one-level search level by level)."""
    return levels * num_codes <= FUSED_MAX_SERIAL_CODES or k_splits(batch, num_codes, device) == 1


@autotune(
    config_space({"BLOCK_K": [32, 64, 128]}, num_warps=[4], num_stages=[2, 3]),
    key=["K_BUCKET", "D_BUCKET", "BLOCK_B", "COSINE", "PRECISION"],
    interpret_config=triton.Config({"BLOCK_K": 16}, num_warps=4),
)
# The shape-regime keys are plain ints read only by the autotuner (see nearest_code_kernel).
@triton.jit(do_not_specialize=["levels", "K_BUCKET", "D_BUCKET"])
def residual_quantize_kernel(
    x_ptr, cb_ptr, norm_ptr, out_ptr, codes_ptr, level_codes_ptr, res_ptr, partial_ptr,
    B, K, D, levels, loss_scale,
    COSINE: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
    K_BUCKET, D_BUCKET,
    BLOCK_B: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """x (B, D), codebooks (L, K, D) in x's dtype, norms (L, K) fp32 ‖c‖, all contiguous; writes
    out (B, D) the straight-through value, codes (B, L) and level_codes (L, B) int64, the residuals
    (L + 1, B, D) and this program's scaled sum of squares."""
    pid = tl.program_id(0)
    rows = pid * BLOCK_B + tl.arange(0, BLOCK_B)
    row_mask = rows < B
    rows64 = rows.to(tl.int64)
    row_off = rows64[:, None] * D
    cols = tl.arange(0, BLOCK_D)
    plane = tl.cast(B, tl.int64) * D
    # r_0 = x, and the sum of the quantized rows starts at 0 (in out)
    for d0 in range(0, D, BLOCK_D):
        c = d0 + cols
        m = row_mask[:, None] & (c < D)[None, :]
        xt = tl.load(x_ptr + row_off + c[None, :], mask=m)
        tl.store(res_ptr + row_off + c[None, :], xt, mask=m)
        tl.store(out_ptr + row_off + c[None, :], tl.zeros_like(xt), mask=m)
    tl.debug_barrier()
    squares = tl.zeros([BLOCK_B], tl.float32)
    for level in range(0, levels):
        cur = res_ptr + level * plane + row_off
        codebook = cb_ptr + tl.cast(level, tl.int64) * K * D
        best, code = nearest_code_scan(
            cur, row_mask, codebook, norm_ptr + level * K, D, 0, K, K, D,
            COSINE, UPCAST, PRECISION, BLOCK_B, BLOCK_K, BLOCK_D,
        )  # fmt: skip
        code = tl.where(best == float("inf"), 0, code)  # a row holding NaN takes code 0
        tl.store(codes_ptr + rows64 * levels + level, code.to(tl.int64), mask=row_mask)
        tl.store(
            level_codes_ptr + tl.cast(level, tl.int64) * B + rows64,
            code.to(tl.int64),
            mask=row_mask,
        )
        code_rows = codebook + code.to(tl.int64)[:, None] * D
        for d0 in range(0, D, BLOCK_D):
            c = d0 + cols
            m = row_mask[:, None] & (c < D)[None, :]
            r = tl.load(cur + c[None, :], mask=m, other=0.0)
            q = tl.load(code_rows + c[None, :], mask=m, other=0.0)
            # each operation rounded to the input dtype, as PyTorch computes it (via fp32)
            nxt = (r.to(tl.float32) - q.to(tl.float32)).to(r.dtype)
            tl.store(cur + plane + c[None, :], nxt, mask=m)
            f = nxt.to(tl.float32)
            squares += tl.sum(f * f, axis=1)
            total = tl.load(out_ptr + row_off + c[None, :], mask=m, other=0.0)
            total = (total.to(tl.float32) + q.to(tl.float32)).to(r.dtype)
            tl.store(out_ptr + row_off + c[None, :], total, mask=m)
        tl.debug_barrier()
    # the straight-through value x + (Σ q − x), rounded like the module's expression
    for d0 in range(0, D, BLOCK_D):
        c = d0 + cols
        m = row_mask[:, None] & (c < D)[None, :]
        xt = tl.load(x_ptr + row_off + c[None, :], mask=m, other=0.0)
        total = tl.load(out_ptr + row_off + c[None, :], mask=m, other=0.0)
        diff = (total.to(tl.float32) - xt.to(tl.float32)).to(xt.dtype)
        value = (xt.to(tl.float32) + diff.to(tl.float32)).to(xt.dtype)
        tl.store(out_ptr + row_off + c[None, :], value, mask=m)
    tl.store(partial_ptr + pid, tl.sum(squares, axis=0) * loss_scale)


@triton.jit(do_not_specialize=["levels"])
def residual_grad_kernel(
    gout_ptr, gloss_ptr, res_ptr, gx_ptr, n, levels, coef,
    HAS_GOUT: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """gx[i] = gout[i] + coef · gloss · Σ_{l=1..L} res[l, i] over the n = N·D elements."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    total = tl.zeros([BLOCK], tl.float32)
    for level in range(1, levels + 1):
        total += tl.load(res_ptr + tl.cast(level, tl.int64) * n + offs, mask=m, other=0.0).to(
            tl.float32
        )
    grad = (coef * tl.load(gloss_ptr).to(tl.float32)) * total
    if HAS_GOUT:
        grad += tl.load(gout_ptr + offs, mask=m, other=0.0).to(tl.float32)
    tl.store(gx_ptr + offs, grad.to(gx_ptr.dtype.element_ty), mask=m)


class ResidualQuantizePlan:
    """The launch of one kind of fused residual search (sizes, dtype, device, metric, precision,
    loss scale): row tile, grid and kernel binding resolved once; a call allocates and launches."""

    def __init__(self, batch, num_codes, dim, levels, dtype, device, metric, loss_scale):
        interpreting = interpreter_enabled()
        if interpreting or dtype != torch.float32:
            precision = "ieee"  # bf16/fp16 products are exact in fp32 accumulation anyway
        else:
            precision = "tf32" if torch.backends.cuda.matmul.allow_tf32 else "tf32x3"
        # 64 rows per program, the smallest tile of quantize's space: its tensor-core instruction
        # shape (wgmma on Hopper) as well as its chunk of D, so the distances are its own. A
        # program's time is its walk over L·K codes, which smaller row tiles would not shorten.
        block_b = 16 if interpreting else 64
        self.programs = triton.cdiv(batch, block_b)
        self.shape = (batch, dim, levels)
        self.dtype, self.device = dtype, device
        bound = dict(
            B=batch,
            K=num_codes,
            D=dim,
            levels=levels,
            loss_scale=float(loss_scale),
            COSINE=metric == "cosine",
            UPCAST=interpreting or dtype == torch.float32,
            PRECISION=precision,
            K_BUCKET=shape_bucket(num_codes, minimum=32, maximum=1 << 16),
            D_BUCKET=shape_bucket(dim, minimum=16, maximum=1024),
            BLOCK_B=block_b,
            # quantize's chunk of D (nearest_code_kernel's space), so the arithmetic is its own
            BLOCK_D=16 if interpreting else 32,
        )
        self.launch = KernelLaunch(
            residual_quantize_kernel,
            (self.programs,),
            bound,
            device=device,
            stand_in=KernelLaunch(
                residual_quantize_kernel.base_jit, (self.programs,),
                dict(bound, BLOCK_K=STAND_IN_BLOCK_K), device=device, options=STAND_IN_OPTIONS,
            ),
        )  # fmt: skip

    def __call__(self, x, codebooks, norms):
        """x (N, D) and codebooks (L, K, D) contiguous in one dtype, norms (L, K) fp32 ‖c‖.
        Returns ``(quantized, codes, level_codes, residuals, loss)``."""
        batch, dim, levels = self.shape
        device = self.device
        out = torch.empty(batch, dim, device=device, dtype=self.dtype)
        codes = torch.empty(batch, levels, device=device, dtype=torch.int64)
        level_codes = torch.empty(levels, batch, device=device, dtype=torch.int64)
        residuals = torch.empty(levels + 1, batch, dim, device=device, dtype=self.dtype)
        if self.programs == 1:  # the one partial is the loss: no reduction launch
            loss = torch.empty((), device=device, dtype=torch.float32)
            self.launch(x, codebooks, norms, out, codes, level_codes, residuals, loss)
            return out, codes, level_codes, residuals, loss
        partials = torch.empty(self.programs, device=device, dtype=torch.float32)
        self.launch(x, codebooks, norms, out, codes, level_codes, residuals, partials)
        return out, codes, level_codes, residuals, partials.sum()


_PLANS: PlanCache[ResidualQuantizePlan] = PlanCache("vq_kernels.residual_quantize_kernel")


def residual_quantize_fused(
    x: torch.Tensor, codebooks: torch.Tensor, norms: torch.Tensor, metric: str, loss_scale: float
):
    """The fused search of ``x (N, D)`` (``N > 0``) through ``codebooks (L, K, D)``; see
    :meth:`ResidualQuantizePlan.__call__`."""
    levels, num_codes, dim = codebooks.shape
    meta = (
        x.shape[0], num_codes, dim, levels, x.dtype, x.device, metric, float(loss_scale),
        torch.backends.cuda.matmul.allow_tf32,
    )  # fmt: skip
    plan = _PLANS.get(meta, lambda: ResidualQuantizePlan(*meta[:-1]))
    return plan(x, codebooks, norms)


class ResidualGradPlan:
    """The bound launch of ``residual_grad_kernel`` for one shape and coefficient."""

    def __init__(self, batch, dim, levels, device, coef):
        n = batch * dim
        block = 256 if interpreter_enabled() else 1024
        self.n = n
        self.launches = {
            has_gout: KernelLaunch(
                residual_grad_kernel,
                (triton.cdiv(n, block),),
                dict(n=n, levels=levels, coef=float(coef), HAS_GOUT=has_gout, BLOCK=block),
                device=device,
                options={"num_warps": 4},
            )
            for has_gout in (False, True)
        }

    def compile_ahead(self, dtype: torch.dtype) -> None:
        """Compile the launch a training step's backward takes (an upstream gradient, an fp32
        loss gradient) on a background thread while the forward compiles."""
        self.launches[True].compile_ahead(dtype, torch.float32, dtype, dtype)

    def __call__(self, grad_out, grad_loss, residuals, like):
        """``grad_out`` (N, D) or None, ``grad_loss`` 0-d, ``residuals`` (L + 1, N, D)
        contiguous; returns the gradient of x in ``like``'s dtype."""
        grad_x = torch.empty_like(like, memory_format=torch.contiguous_format)
        if grad_out is None:
            self.launches[False](grad_x, grad_loss, residuals, grad_x)
        else:
            self.launches[True](grad_out.contiguous(), grad_loss, residuals, grad_x)
        return grad_x
