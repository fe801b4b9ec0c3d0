"""A kernel whose shared memory grows with its tile and pipeline depth, for ``test_gpu_targets``
and ``test_shared_memory_guard``: one (BLOCK_M, BLOCK_N) tile of ``A @ B``, ``K`` walked in
``BLOCK_K`` steps (each stage keeps an A and a B tile in shared memory)."""

import triton
import triton.language as tl

from triton_dispatch import config_space


@triton.jit
def tile_dot_kernel(
    A, B, C, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr
):
    m, n, k = tl.arange(0, BLOCK_M), tl.arange(0, BLOCK_N), tl.arange(0, BLOCK_K)
    a = A + m[:, None] * K + k[None, :]
    b = B + k[:, None] * BLOCK_N + n[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for _ in range(0, K, BLOCK_K):
        acc = tl.dot(tl.load(a), tl.load(b), acc)
        a += BLOCK_K
        b += BLOCK_K * BLOCK_N
    tl.store(C + m[:, None] * BLOCK_N + n[None, :], acc)


#: BLOCK_K 32/64/128 × 2-4 stages (128×128 fp16 tiles): at BLOCK_K 128 and 3 stages an sm_120
#: program needs 128 KB (two buffers of 64 KB), more than its 99 KB; sm_90 keeps three, 192 KB
#: of its 227
SPACE = config_space({"BLOCK_K": [32, 64, 128]}, num_warps=[8], num_stages=[2, 3, 4])


def launch(block_k: int, *, k: int = 1024) -> dict:
    """The arguments of one tile's launch (fp16 operands, 128×128 tile)."""
    import torch

    return dict(A=torch.float16, B=torch.float16, C=torch.float32, K=k, BLOCK_M=128,
                BLOCK_N=128, BLOCK_K=block_k)  # fmt: skip
