"""torch.compile(fullgraph=True) and CUDA graphs: the op is a custom op with a fake impl and an
autograd formula, so neither breaks the graph."""

import pytest
import torch

from late_interaction_kernels import maxsim, maxsim_pairs
from late_interaction_kernels.ops.maxsim import maxsim_varlen
from late_interaction_kernels.ops.maxsim.reference import maxsim_reference
from triton_dispatch.testing import assert_close, assert_gradients_match, rand_mask, randn

pytestmark = pytest.mark.filterwarnings(
    "ignore:Conversion of an array with ndim:DeprecationWarning"
)

gpu = pytest.mark.gpu


@pytest.mark.parametrize("backend", ["torch", None])
def test_fullgraph_compile_on_cpu(rng, backend):
    torch._dynamo.reset()
    Q = randn((2, 6, 16), generator=rng, requires_grad=True)
    D = randn((2, 3, 9, 16), generator=rng, requires_grad=True)
    qm = rand_mask((2, 6), generator=rng)

    @torch.compile(fullgraph=True, backend="aot_eager")
    def loss_fn(q, d):
        return maxsim(q, d, qm, backend=backend, backward="lowmem").logsumexp(-1).sum()

    loss = loss_fn(Q, D)
    loss.backward()
    Qr = Q.detach().double().requires_grad_()
    Dr = D.detach().double().requires_grad_()
    ref = maxsim_reference(Qr, Dr, qm).logsumexp(-1).sum()
    ref.backward()
    assert_close(loss, ref, dtype=torch.float32)
    assert_close(Q.grad, Qr.grad, dtype=torch.float32)
    assert_close(D.grad, Dr.grad, dtype=torch.float32)


@gpu
@pytest.mark.parametrize("method", ["unified", "lowmem"])
def test_bf16_on_gpu(rng, method):
    Q = randn((8, 32, 128), generator=rng, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    D = randn(
        (16, 300, 128), generator=rng, device="cuda", dtype=torch.bfloat16, requires_grad=True
    )
    dm = rand_mask((16, 300), generator=rng, device="cuda")
    assert_gradients_match(
        lambda q, d: maxsim(q, d, None, dm, backward=method),
        lambda q, d: maxsim_reference(q, d, None, dm),
        [Q, D],
        generator=rng,
        names=["Q", "D"],
    )


@gpu
@pytest.mark.parametrize("normalize", [False, True])
def test_dense_lowmem_on_gpu(rng, normalize):
    """lowmem's dense grad_D kernel with bf16 tensor-core dots: hard negatives (4-D) and a rerank
    with gradients (one query against many documents), against float64."""
    from late_interaction_kernels.ops.maxsim.backward_plan import uses_dense_kernel

    assert uses_dense_kernel(1, 6, 32) and uses_dense_kernel(0, 1, 32)
    Q = randn((6, 32, 128), generator=rng, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    D = randn(
        (6, 8, 300, 128), generator=rng, device="cuda", dtype=torch.bfloat16, requires_grad=True
    )
    dm = rand_mask((6, 8, 300), generator=rng, device="cuda")
    assert_gradients_match(
        lambda q, d: maxsim(q, d, None, dm, normalize=normalize, backward="lowmem"),
        lambda q, d: maxsim_reference(q, d, None, dm, normalize=normalize),
        [Q, D],
        generator=rng,
        names=["Q", "D"],
    )
    Q = randn((1, 32, 128), generator=rng, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    D = randn(
        (500, 300, 128), generator=rng, device="cuda", dtype=torch.bfloat16, requires_grad=True
    )
    assert_gradients_match(
        lambda q, d: maxsim(q, d, normalize=normalize),
        lambda q, d: maxsim_reference(q, d, normalize=normalize),
        [Q, D],
        generator=rng,
        names=["Q", "D"],
    )


@gpu
@pytest.mark.parametrize("lq", [32, 128, 1030])
def test_gpu_shapes_against_reference(rng, lq):
    Q = randn((4, lq, 96), generator=rng, device="cuda", dtype=torch.float16, requires_grad=True)
    D = randn(
        (4, 3, 257, 96), generator=rng, device="cuda", dtype=torch.float16, requires_grad=True
    )
    assert_gradients_match(maxsim, maxsim_reference, [Q, D], generator=rng, names=["Q", "D"])


@gpu
def test_gpu_varlen_and_pairs(rng):
    lens_q, lens_d = [3, 40, 17], [300, 5, 129]
    Qp = randn((sum(lens_q), 64), generator=rng, device="cuda", dtype=torch.bfloat16)
    Dp = randn((sum(lens_d), 64), generator=rng, device="cuda", dtype=torch.bfloat16)
    cu_q = torch.tensor([0, 3, 43, 60], device="cuda", dtype=torch.int32)
    cu_d = torch.tensor([0, 300, 305, 434], device="cuda", dtype=torch.int32)
    from late_interaction_kernels.ops.maxsim.reference import maxsim_varlen_reference

    out = maxsim_varlen(Qp, Dp, cu_q, cu_d, 40, 300)
    assert_close(
        out, maxsim_varlen_reference(Qp.double(), Dp.double(), cu_q, cu_d), dtype=torch.bfloat16
    )
    Q = randn((5, 32, 64), generator=rng, device="cuda", dtype=torch.bfloat16)
    D = randn((5, 77, 64), generator=rng, device="cuda", dtype=torch.bfloat16)
    from late_interaction_kernels.ops.maxsim.reference import maxsim_pairs_reference

    assert_close(
        maxsim_pairs(Q, D), maxsim_pairs_reference(Q.double(), D.double()), dtype=torch.bfloat16
    )


@gpu
def test_inductor_fullgraph_on_gpu(rng):
    torch._dynamo.reset()
    Q = randn((4, 32, 128), generator=rng, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    D = randn(
        (4, 2, 100, 128), generator=rng, device="cuda", dtype=torch.bfloat16, requires_grad=True
    )
    # scores of 32 tokens at d=128 are in the hundreds: scaled down so that the softmax is not
    # saturated, whose gradients (exp of minus a few hundred) underflow in fp32 but not in float64
    step = torch.compile(lambda q, d: (maxsim(q, d) / 64).softmax(-1)[:, 0].sum(), fullgraph=True)
    step(Q, D).backward()
    Qr = Q.detach().double().requires_grad_()
    Dr = D.detach().double().requires_grad_()
    (maxsim_reference(Qr, Dr) / 64).softmax(-1)[:, 0].sum().backward()
    assert_close(Q.grad, Qr.grad, dtype=torch.bfloat16)
    assert_close(D.grad, Dr.grad, dtype=torch.bfloat16)


@gpu
@pytest.mark.parametrize("method", ["unified", "lowmem"])
def test_cuda_graph_capture(rng, method):
    Q = randn((8, 32, 128), generator=rng, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    D = randn(
        (8, 4, 64, 128), generator=rng, device="cuda", dtype=torch.bfloat16, requires_grad=True
    )

    def step():
        Q.grad = D.grad = None
        maxsim(Q, D, backward=method).sum().backward()
        return Q.grad, D.grad

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):  # autotune and warm up outside the capture
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    Q.grad = D.grad = None
    with torch.cuda.graph(graph):
        maxsim(Q, D, backward=method).sum().backward()
        gq, gd = Q.grad, D.grad
    with torch.no_grad():
        Q.copy_(randn(Q.shape, generator=rng, device="cuda", dtype=torch.bfloat16))
    graph.replay()
    torch.cuda.synchronize()
    Qr = Q.detach().double().requires_grad_()
    Dr = D.detach().double().requires_grad_()
    maxsim_reference(Qr, Dr).sum().backward()
    assert_close(gq, Qr.grad, dtype=torch.bfloat16)
    assert_close(gd, Dr.grad, dtype=torch.bfloat16)


_AUTOTUNED_CHECK = """
import torch
from late_interaction_kernels import maxsim
from late_interaction_kernels.ops.maxsim.reference import maxsim_reference
from triton_dispatch.testing import assert_gradients_match, generator, randn
rng = generator(0)
for method in ("unified", "lowmem"):
    for lq, d_shape in ((32, (4, 3, 300, 128)), (130, (6, 257, 128))):
        Q = randn((4, lq, 128), generator=rng, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        D = randn(d_shape, generator=rng, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        assert_gradients_match(
            lambda q, d: maxsim(q, d, backward=method), maxsim_reference, [Q, D], generator=rng
        )
print("autotuned kernels agree")
"""


@gpu
def test_autotuned_kernels_on_gpu(tmp_path):
    """The rest of the suite runs the shipped table's configs; here autotuning is switched on and
    every config space is searched, in a fresh process: the tuned kernels must still match the
    reference, and the results are kept on disk for the next process."""
    import os
    import subprocess
    import sys

    env = dict(
        os.environ, LATE_INTERACTION_KERNELS_AUTOTUNE="1", TRITON_DISPATCH_CACHE_DIR=str(tmp_path)
    )
    proc = subprocess.run(
        [sys.executable, "-c", _AUTOTUNED_CHECK],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert list(tmp_path.glob("late_interaction_kernels.maxsim_fwd_kernel-*.json"))


@gpu
@pytest.mark.parametrize("method", ["unified", "lowmem"])
def test_gpu_varlen_all_pairs_on_packed_tokens(rng, method):
    """The packed all-pairs layout on the GPU: bf16, ragged lengths, an empty document and a
    query long enough to be chunked, forward and backward against float64."""
    from late_interaction_kernels.reference import maxsim_reference_varlen
    from late_interaction_kernels.varlen import maxsim_varlen as all_pairs

    lens_q, lens_d = [3, 40, 17, 600], [300, 5, 0, 129, 1030]
    Qp = randn(
        (sum(lens_q), 128), generator=rng, device="cuda", dtype=torch.bfloat16, requires_grad=True
    )
    Dp = randn(
        (sum(lens_d), 128), generator=rng, device="cuda", dtype=torch.bfloat16, requires_grad=True
    )
    cu_q = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], device="cuda")
    cu_d = torch.tensor(
        [0, *torch.tensor(lens_d).cumsum(0).tolist()], device="cuda", dtype=torch.int32
    )
    assert_gradients_match(
        lambda q, d: all_pairs(q, d, cu_q, cu_d, backward=method),
        lambda q, d: maxsim_reference_varlen(q, d, cu_q, cu_d),
        [Qp, Dp],
        generator=rng,
        names=["Q_packed", "D_packed"],
    )


@gpu
@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("lq", [200, 700])
def test_tma_forward_on_gpu(rng, lq, normalize):
    """Long bf16 queries take the TMA kernel on Hopper (one 200-row chunk looped in 128-row
    blocks; 128-token chunks of a 700-token query): scores with masks, and gradients through its
    argmax, against float64."""
    from late_interaction_kernels.ops.common import tma
    from late_interaction_kernels.ops.maxsim.dispatch import MAXSIM_PLANS
    from late_interaction_kernels.ops.maxsim.plan import FORWARD_PLANS

    Q = randn((3, lq, 128), generator=rng, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    D = randn(
        (2, 4, 301, 128), generator=rng, device="cuda", dtype=torch.bfloat16, requires_grad=True
    )
    qm = rand_mask((3, lq), generator=rng, device="cuda")
    dm = rand_mask((2, 4, 301), generator=rng, device="cuda")
    MAXSIM_PLANS.clear()
    FORWARD_PLANS.clear()
    with torch.no_grad():
        got = maxsim(Q[:2], D, qm[:2], dm, normalize=normalize)
        want = maxsim_reference(Q[:2].double(), D.double(), qm[:2], dm, normalize=normalize)
        assert_close(got, want, dtype=torch.bfloat16)
        got = maxsim(Q, D[0], qm, dm[0], normalize=normalize)
        want = maxsim_reference(Q.double(), D[0].double(), qm, dm[0], normalize=normalize)
        assert_close(got, want, dtype=torch.bfloat16)
    hopper = tma.tma_supported(Q.device)
    assert all((p.tma is not None) == hopper for p in FORWARD_PLANS._plans.values())
    assert_gradients_match(
        lambda q, d: maxsim(q[:2], d, qm[:2], dm, normalize=normalize),
        lambda q, d: maxsim_reference(q[:2], d, qm[:2], dm, normalize=normalize),
        [Q, D], generator=rng, names=["Q", "D"],
    )  # fmt: skip
