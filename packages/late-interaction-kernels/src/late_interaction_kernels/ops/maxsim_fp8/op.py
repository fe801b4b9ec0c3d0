"""``maxsim_inference_fp8``'s declaration (checks, backend choice, plan cache, the custom op
``late_interaction_kernels::maxsim_inference_fp8`` with its fake, and the reference route: the
dequantised tokens scored in PyTorch in float32, also for float8 operands under the interpreter,
which has no 8-bit floats). The plan binds the launch of :mod:`.kernels` once per kind of call
(grid, tuned config, constexprs; the TMA kernel for short documents on Hopper). A scale is per
tensor (one element) or per token (``(N, L)``); one that is not float32 is cast per call.
"""

from __future__ import annotations

import torch
import triton

from triton_dispatch import device_facts, interpreter_enabled, next_power_of_2, padded_dim
from triton_dispatch.declaration import OpDeclaration, TensorSpec
from triton_dispatch.launch import KernelLaunch

from ..common import tma
from ..common.buffers import output_buffer
from ..common.validation import FLOAT_DTYPES
from .reference import maxsim_fp8_reference

#: Compute capability from which ``tl.dot`` takes float8 operands.
FP8_MIN_CAPABILITY = (8, 9)
FP8_DTYPES = tuple(
    dt for dt in (getattr(torch, "float8_e4m3fn", None), getattr(torch, "float8_e5m2", None)) if dt
)
#: Programs per SM the kernel's grid aims for; each takes a run of documents (H100: 8 to 32 per
#: SM measure the same, 2 and 4 are slower on batches of queries).
PROGRAMS_PER_SM = 8
#: Documents of at most this many 64-token tiles run as one flat (document, tile) loop (H100,
#: per-token scales: 1.34x faster at 300 tokens; at 1024 tokens the nested loop is 1.6x faster).
FLAT_MAX_TILES = 8
#: The TMA kernel's config (H100 sweep at 1 × 10,000 × 32 × 300: 64-token tiles, 4 warps and 3
#: stages were the fastest; 128-token tiles, 8 warps and 4 stages slower).
TMA_BLOCK_D = 64
TMA_OPTIONS = dict(num_warps=4, num_stages=3)
#: Programs per SM of the TMA kernel (same sweep: 4 per SM fastest, 8 and 16 about 2 % slower).
TMA_PROGRAMS_PER_SM = 4


def uses_tma(Q, D, sd) -> bool:
    """Whether the documents go through the TMA kernel: on Hopper, short documents (the flat loop)
    with one scale for all of ``D``, 16-byte rows, coordinates that fit in int32. (H100: at
    1 × 1000 × 128 × 1024 the pointer kernel measured faster, and with per-token document scales
    at 1 × 10,000 × 32 × 300 too: 0.184 against 0.205 ms.)"""
    nd, ld, dim = D.shape
    tile = 16 if interpreter_enabled() else TMA_BLOCK_D
    return (
        triton.cdiv(ld, tile) <= FLAT_MAX_TILES
        and sd.dim() < 2
        and tma.rows_fit(dim, D.element_size(), nd * ld)
        and tma.tma_supported(D.device)
    )


def geometry(Q, D, sq, sd, q_mask, d_mask, use_tma=False) -> tuple[dict, tuple[int, int], int, int]:
    """The kernel's bound arguments, its grid, the query blocks and the output rows; ``use_tma``: for
    :func:`.kernels.fp8_maxsim_tma_kernel` (its tile fixed, its own programs per SM)."""
    nq, lq, dim = Q.shape
    nd, ld, _ = D.shape
    interp = interpreter_enabled()
    # fp8 dots need K >= 32 on the tensor cores
    block_k = max(padded_dim(dim), 32)
    block_q = 16 if interp else min(max(padded_dim(lq), 16), 128)
    query_blocks = triton.cdiv(lq, block_q)
    # short queries share a program (up to 128 stacked token rows): the documents are read once
    # per group of queries, not once per query
    queries = 1 if query_blocks > 1 else min(next_power_of_2(nq), max(128 // block_q, 1))
    groups = triton.cdiv(nq, queries) * query_blocks
    if interp:
        runs = min(nd, 3)
    else:
        per_sm = TMA_PROGRAMS_PER_SM if use_tma else PROGRAMS_PER_SM
        target = per_sm * device_facts(Q.device).sm_count
        runs = max(1, min(nd, triton.cdiv(target, groups)))
    per_run = triton.cdiv(nd, runs)
    flat = triton.cdiv(ld, 64 if not interp else 16) <= FLAT_MAX_TILES
    bound = dict(
        nq=nq, nd=nd, lq=lq, ld=ld, dim=dim, docs_per_prog=per_run,
        Q_PER_TOKEN=sq.dim() == 2, D_PER_TOKEN=sd.dim() == 2, HAS_QM=q_mask is not None,
        HAS_DM=d_mask is not None, IEEE=Q.dtype == torch.float32, FLAT=flat, QUERIES=queries,
        BLOCK_Q=block_q, BLOCK_K=block_k,
    )  # fmt: skip
    if use_tma:
        bound["BLOCK_D"] = 16 if interp else TMA_BLOCK_D
    else:
        # short documents with per-token scales: (document tokens, query rows) tiles (H100,
        # 1 × 10,000 × 32 × 300: 0.150 against 0.175 ms); long documents keep (query rows,
        # document tokens), 0.070 against 0.075 ms at 1 × 1000 × 128 × 1024
        bound["TRANS"] = flat and sd.dim() == 2
    rows = nq * query_blocks
    return bound, (groups, triton.cdiv(nd, per_run)), query_blocks, rows


class FP8Plan:
    """The kernel launch of one kind of call, bound once; ``forward`` takes the call's tensors
    (copying a strided one, casting a scale that is not float32) and returns ``(Nq, Nd)`` float32
    (a long query's per-block partial scores summed)."""

    def __init__(self, call) -> None:
        from .kernels import fp8_maxsim_kernel, fp8_maxsim_tma_kernel

        tensors = tuple(call.tensors.values())
        Q, D, sq, sd, qm, dm = tensors
        self.device = device = Q.device
        bound, grid, self.query_blocks, rows = geometry(Q, D, sq, sd, qm, dm)
        self.launch = KernelLaunch(fp8_maxsim_kernel, grid, bound, device=device)
        self.tma_launch = None
        if uses_tma(Q, D, sd):
            self.tma_bound, tma_grid, _, _ = geometry(Q, D, sq, sd, qm, dm, use_tma=True)
            options = {} if interpreter_enabled() else TMA_OPTIONS
            self.tma_launch = KernelLaunch(
                fp8_maxsim_tma_kernel, tma_grid, self.tma_bound, device=device, options=options
            )
        self.nq, self.nd = Q.shape[0], D.shape[0]
        self.shape = (self.nq, self.nd) if self.query_blocks == 1 else (rows, self.nd)
        self.copy = not all(t is None or t.is_contiguous() for t in tensors)
        self.cast_q, self.cast_d = sq.dtype != torch.float32, sd.dtype != torch.float32

    def forward(self, Q, D, scale_Q, scale_D, q_mask, d_mask):
        if self.copy:
            Q, D, scale_Q, scale_D, q_mask, d_mask = (
                None if t is None else t.contiguous()
                for t in (Q, D, scale_Q, scale_D, q_mask, d_mask)
            )
        if self.cast_q:
            scale_Q = scale_Q.to(torch.float32)
        if self.cast_d:
            scale_D = scale_D.to(torch.float32)
        out = output_buffer(self.shape, dtype=torch.float32, device=self.device)
        qm = Q if q_mask is None else q_mask.view(torch.uint8)
        dm = D if d_mask is None else d_mask.view(torch.uint8)
        if self.tma_launch is not None and tma.aligned(D):
            bound = self.tma_bound
            desc = tma.rows_descriptor(D, bound["dim"], [bound["BLOCK_D"], bound["BLOCK_K"]])
            self.tma_launch(Q, D, desc, scale_Q, scale_D, qm, dm, out)
        else:
            self.launch(Q, D, scale_Q, scale_D, qm, dm, out)
        if self.query_blocks > 1:
            out = out.view(self.nq, self.query_blocks, self.nd).sum(1)
        return out


def _plan(call):
    Q, D = call["Q"], call["D"]
    if min(*Q.shape[:2], *D.shape[:2]) == 0:  # nothing to launch: the reference's zeros
        return None
    # the interpreter has no 8-bit floats: there it runs fp16/fp32 stand-ins only
    if call.backend == "interpret" and Q.dtype in FP8_DTYPES:
        return None
    return FP8Plan(call)


def _check(call) -> None:
    Q, D = call["Q"], call["D"]
    if Q.dtype != D.dtype:
        raise TypeError(f"Q and D must share one dtype, got {Q.dtype} and {D.dtype}")
    if Q.shape[-1] != D.shape[-1]:
        raise ValueError(
            f"Q and D must share the embedding dim d; got {Q.shape[-1]} and {D.shape[-1]}"
        )
    for name, x in (("Q", Q), ("D", D)):
        rows, scale, mask = tuple(x.shape[:2]), call[f"scale_{name}"], call[f"{name.lower()}_mask"]
        if not (scale.numel() == 1 and scale.dim() < 2) and tuple(scale.shape) != rows:
            raise ValueError(
                f"scale_{name} must be a per-tensor scale (one element) or per-token {rows}, "
                f"got shape {tuple(scale.shape)}"
            )
        if mask is not None and tuple(mask.shape) != rows:
            raise ValueError(
                f"{name.lower()}_mask must be a bool tensor of shape {rows}, got shape "
                f"{tuple(mask.shape)}"
            )
    if call.backend == "triton":
        if Q.dtype not in FP8_DTYPES:
            raise TypeError(f"Q and D must be float8 tensors on CUDA, got {Q.dtype}")
        facts = device_facts(Q.device)
        if facts.capability < FP8_MIN_CAPABILITY:
            raise RuntimeError(
                f"FP8 MaxSim needs a GPU of compute capability >= 8.9 (float8 tl.dot); "
                f"{facts.name} is {facts.capability[0]}.{facts.capability[1]}. Score the bf16 "
                "embeddings with late_interaction_kernels.maxsim instead."
            )


@torch.no_grad()
def _reference(Q, D, scale_Q, scale_D, q_mask, d_mask):
    return maxsim_fp8_reference(Q, D, scale_Q, scale_D, q_mask, d_mask, dtype=torch.float32)


def _operand(name: str, shape: str) -> TensorSpec:
    # 2-D operands arrive as batches of one; strided ones are copied per call
    return TensorSpec(name, (*FP8_DTYPES, *FLOAT_DTYPES), shape, fits=lambda s: len(s) == 3,
                      binds_strides=False, dtypes_expected="float8_e4m3fn or float8_e5m2 "
                      "(float16 or float32 stand-ins under the interpreter)")  # fmt: skip


def _scale(name: str, shape: str) -> TensorSpec:
    dtypes = (*FLOAT_DTYPES, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)
    return TensorSpec(name, dtypes, shape, binds_strides=False,
                      dtypes_expected="a float32 tensor (other real dtypes are cast)")  # fmt: skip


def _mask(name: str, shape: str) -> TensorSpec:
    return TensorSpec(name, (torch.bool,), shape, fits=lambda s: len(s) == 2, optional=True,
                      binds_strides=False, type_error=ValueError,
                      dtypes_expected=f"a bool tensor of shape {shape}")  # fmt: skip


FP8 = OpDeclaration(
    "late_interaction_kernels::maxsim_inference_fp8",
    inputs=[
        _operand("Q", "(Nq, Lq, d) or (Lq, d)"),
        _operand("D", "(Nd, Ld, d) or (Ld, d)"),
        _scale("scale_Q", "() or (Nq, Lq)"),
        _scale("scale_D", "() or (Nd, Ld)"),
        _mask("q_mask", "(Nq, Lq)"),
        _mask("d_mask", "(Nd, Ld)"),
    ],
    check=_check,
    outputs=("scores",),
    returns=("scores",),
    reference=_reference,
    plan=_plan,
    fake=lambda Q, D, *_: Q.new_empty((Q.shape[0], D.shape[0]), dtype=torch.float32),
)
