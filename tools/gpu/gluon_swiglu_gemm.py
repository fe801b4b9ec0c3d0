"""A Hopper GEMM in Gluon with the SwiGLU MLP's gate in its epilogue (``SWIGLU=True``) or a
plain product (``SWIGLU=False``): an experiment timed by ``dit_swiglu_linear.py``, not shipped
(it runs at 500-540 TFLOP/s where cuBLAS's warp-specialised, cluster-multicast kernels reach
700 on an H200, so the fused pair is slower than cuBLAS's GEMM plus the separate SwiGLU pass).

One persistent program per SM walks output tiles of ``BLOCK_M`` rows × ``HALF_N`` columns. A
tile's weight block is the ``HALF_N`` gate rows and the ``HALF_N`` matching up rows, loaded by
two TMA copies into the two halves of one ``(2·HALF_N, BLOCK_K)`` buffer, so one warpgroup MMA of
``BLOCK_M × 2·HALF_N`` computes both projections of the tile and the epilogue writes
``silu(gate)·up`` from the float32 accumulator: the ``(M, 2I)`` projection is never stored, and
the separate SwiGLU pass over it is gone.

The loads run ``STAGES - 1`` steps ahead of the MMAs across tile boundaries (one counter over
every k-step of every tile the program owns), so the next tile's first operands are in flight
while this tile's epilogue runs.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)


@gluon.jit
def _tile_coords(tile, num_pid_m, num_pid_n, GROUP_M: gl.constexpr):
    """Row and column block of a tile, in groups of ``GROUP_M`` row blocks sharing weight
    blocks in L2."""
    per_group = GROUP_M * num_pid_n
    first_m = (tile // per_group) * GROUP_M
    rows_in_group = gl.minimum(num_pid_m - first_m, GROUP_M)
    within = tile % per_group
    return first_m + within % rows_in_group, within // rows_in_group


@gluon.jit
def _issue_loads(step, x_desc, gate_desc, up_desc, a_bufs, b_bufs, ready, k_steps,
                 num_pid_m, num_pid_n, GROUP_M: gl.constexpr, STAGES: gl.constexpr,
                 SWIGLU: gl.constexpr):  # fmt: skip
    """TMA copies of the program's ``step``-th k-step (its tile: ``step // k_steps``)."""
    BLOCK_M: gl.constexpr = x_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = x_desc.block_type.shape[1]
    HALF_N: gl.constexpr = gate_desc.block_type.shape[0]
    tile = gl.program_id(0) + (step // k_steps) * gl.num_programs(0)
    pid_m, pid_n = _tile_coords(tile, num_pid_m, num_pid_n, GROUP_M)
    k = (step % k_steps) * BLOCK_K
    slot = step % STAGES
    bar = ready.index(slot)
    b = b_bufs.index(slot)
    mbarrier.expect(bar, x_desc.block_type.nbytes + 2 * gate_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(x_desc, [pid_m * BLOCK_M, k], bar, a_bufs.index(slot))
    if SWIGLU:
        tma.async_copy_global_to_shared(gate_desc, [pid_n * HALF_N, k], bar, b.slice(0, HALF_N))
        tma.async_copy_global_to_shared(up_desc, [pid_n * HALF_N, k], bar, b.slice(HALF_N, HALF_N))
    else:  # a plain product: the tile's 2·HALF_N weight rows from one descriptor
        tma.async_copy_global_to_shared(gate_desc, [pid_n * 2 * HALF_N, k], bar, b.slice(0, HALF_N))
        tma.async_copy_global_to_shared(gate_desc, [pid_n * 2 * HALF_N + HALF_N, k], bar,
                                        b.slice(HALF_N, HALF_N))


@gluon.jit
def swiglu_linear_kernel(
    x_desc, gate_desc, up_desc, out_desc, M, N, K,
    GROUP_M: gl.constexpr, STAGES: gl.constexpr, SWIGLU: gl.constexpr, num_warps: gl.constexpr,
):  # fmt: skip
    BLOCK_M: gl.constexpr = x_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = x_desc.block_type.shape[1]
    HALF_N: gl.constexpr = gate_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = 2 * HALF_N
    dtype: gl.constexpr = x_desc.dtype

    a_bufs = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, BLOCK_K], x_desc.layout)
    b_bufs = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, BLOCK_K], gate_desc.layout)
    OUT_N: gl.constexpr = out_desc.block_type.shape[1]
    out_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, OUT_N], out_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)

    warps_m: gl.constexpr = num_warps if 16 * num_warps <= BLOCK_M else BLOCK_M // 16
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[warps_m, num_warps // warps_m], instr_shape=[16, BLOCK_N // (num_warps // warps_m), 16]
    )

    num_pid_m = gl.cdiv(M, BLOCK_M)
    num_pid_n = gl.cdiv(N, OUT_N)
    num_tiles = num_pid_m * num_pid_n
    my_tiles = (num_tiles - gl.program_id(0) + gl.num_programs(0) - 1) // gl.num_programs(0)
    k_steps = gl.cdiv(K, BLOCK_K)
    total = my_tiles * k_steps

    for p in gl.static_range(STAGES - 1):
        if p < total:
            _issue_loads(p, x_desc, gate_desc, up_desc, a_bufs, b_bufs, ready, k_steps,
                         num_pid_m, num_pid_n, GROUP_M, STAGES, SWIGLU)  # fmt: skip

    acc = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=acc_layout)
    c = 0  # the program's k-steps consumed so far, over all its tiles
    for t in range(my_tiles):
        for kk in range(k_steps):
            slot = c % STAGES
            mbarrier.wait(ready.index(slot), (c // STAGES) & 1)
            acc = warpgroup_mma(a_bufs.index(slot), b_bufs.index(slot).permute((1, 0)), acc,
                                use_acc=kk > 0, is_async=True)  # fmt: skip
            # the MMA before this one is done, so its slot takes the load STAGES - 1 steps ahead
            acc = warpgroup_mma_wait(1, deps=(acc,))
            if c + STAGES - 1 < total:
                _issue_loads(c + STAGES - 1, x_desc, gate_desc, up_desc, a_bufs, b_bufs, ready,
                             k_steps, num_pid_m, num_pid_n, GROUP_M, STAGES, SWIGLU)  # fmt: skip
            c += 1
        acc = warpgroup_mma_wait(0, deps=(acc,))
        pid_m, pid_n = _tile_coords(gl.program_id(0) + t * gl.num_programs(0), num_pid_m,
                                    num_pid_n, GROUP_M)  # fmt: skip
        if SWIGLU:
            gate, up = acc.reshape([BLOCK_M, 2, HALF_N]).permute([0, 2, 1]).split()
            out = (gate / (1.0 + gl.exp(-gate)) * up).to(dtype)
        else:
            out = acc.to(dtype)
        tma.store_wait(pendings=0)  # the previous tile's store has left out_smem
        out_smem.store(out)
        fence_async_shared()
        tma.async_copy_shared_to_global(out_desc, [pid_m * BLOCK_M, pid_n * OUT_N], out_smem)
    tma.store_wait(pendings=0)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(i))
