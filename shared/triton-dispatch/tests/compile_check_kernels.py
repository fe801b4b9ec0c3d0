"""Two kernels for ``test_compile_check``: one the GPU compiler takes, one it rejects (a name bound
to two shapes in the two branches of a runtime test) though the interpreter runs it."""

import triton
import triton.language as tl


@triton.jit
def good_kernel(X, Y, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(Y + i, tl.load(X + i, mask=i < n) * 2.0, mask=i < n)


@triton.jit
def branch_shape_kernel(X, Y, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    if pid < 1:
        m = tl.arange(0, BLOCK) < n
        tl.store(Y + tl.arange(0, BLOCK), tl.load(X + tl.arange(0, BLOCK), mask=m), mask=m)
    else:
        m = tl.arange(0, 2 * BLOCK) < n
        tl.store(Y + tl.arange(0, 2 * BLOCK), 0.0, mask=m)
