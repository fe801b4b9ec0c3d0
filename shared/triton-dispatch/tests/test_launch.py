"""Launch plans: keys that never reuse a wrong plan, counted hits and misses, and launches that
equal the kernel's own."""

from types import SimpleNamespace

import pytest
import torch
import triton
import triton.language as tl

from triton_dispatch import device_facts
from triton_dispatch.launch import (
    PLAN_CACHE_ENV_VAR,
    KernelLaunch,
    PlanCache,
    _arg_spec,
    _direct_launcher,
    call_key,
    clear_plan_caches,
    plan_caches,
    tensor_key,
)
from triton_dispatch.testing import assert_close, randn


@triton.jit
def _scaled_copy(X, Y, n, scale, BLOCK: tl.constexpr, NEGATE: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + i, mask=i < n, other=0.0)
    if NEGATE:
        x = -x
    tl.store(Y + i, x * scale, mask=i < n)


def test_plan_cache_counts_hits_and_misses():
    cache = PlanCache("test.counting")
    built = []
    for key in ["a", "b", "a", "a", "b", "c"]:
        cache.get(key, lambda key=key: built.append(key) or key.upper())
    assert built == ["a", "b", "c"]
    assert (cache.hits, cache.misses, len(cache)) == (3, 3, 3)
    assert cache in plan_caches()
    clear_plan_caches()
    assert (cache.hits, cache.misses, len(cache)) == (0, 0, 0)


def test_plan_cache_is_bounded_and_can_be_switched_off(monkeypatch):
    cache = PlanCache("test.bounded", maxsize=2)
    for key in range(5):
        cache.get(key, lambda key=key: key)
    assert len(cache) == 2 and cache.get(4, lambda: "rebuilt") == 4
    monkeypatch.setenv(PLAN_CACHE_ENV_VAR, "0")
    off = PlanCache("test.off")
    assert off.get("k", lambda: 1) == 1 and off.get("k", lambda: 2) == 2
    assert len(off) == 0 and off.misses == 2


def test_a_failed_build_keeps_nothing():
    cache = PlanCache("test.errors")
    with pytest.raises(ValueError):
        cache.get("bad", lambda: (_ for _ in ()).throw(ValueError("bad input")))
    assert len(cache) == 0 and cache.misses == 0


def test_tensor_key_separates_everything_a_plan_depends_on():
    x = torch.zeros(4, 6)
    same = torch.ones(4, 6)
    assert tensor_key(x) == tensor_key(same)
    different = [
        x.to(torch.float64),  # dtype
        torch.zeros(4, 7),  # shape
        x.t(),  # strides: non-contiguous
        torch.zeros(1, 6).expand(4, 6),  # stride-0 expansion
        x.clone().requires_grad_(),  # autograd
    ]
    keys = {tensor_key(t) for t in different}
    assert len(keys) == len(different) and tensor_key(x) not in keys
    assert tensor_key(None) is None
    with pytest.raises(AttributeError):
        tensor_key([1, 2, 3])


def test_call_key_covers_tensors_settings_and_the_forced_backend(monkeypatch):
    monkeypatch.delenv("TRITON_DISPATCH_BACKEND", raising=False)
    x = torch.zeros(3, 4)
    key = call_key((x, None), "l2", 1)
    assert key == call_key((torch.ones(3, 4), None), "l2", 1)  # values are not part of it
    assert key != call_key((x.t(), None), "l2", 1)
    assert key != call_key((x, None), "cosine", 1)
    monkeypatch.setenv("TRITON_DISPATCH_BACKEND", "torch")
    assert key != call_key((x, None), "l2", 1)
    # what a plan cannot describe sends the op down its validating path
    assert call_key(([1.0], None), "l2", 1) is None
    assert call_key((x, None), ["unhashable"]) is None


def test_tensor_key_holds_the_device_index():
    """A plan built for one GPU is never reused on another (devices mocked: no GPU needed)."""

    def fake(index):
        return SimpleNamespace(
            dtype=torch.float16,
            device=torch.device("cuda", index),
            shape=torch.Size([2, 3]),
            is_contiguous=lambda: True,
            requires_grad=False,
        )

    assert tensor_key(fake(0)) == tensor_key(fake(0))
    assert tensor_key(fake(0)) != tensor_key(fake(1))


def test_arg_spec_follows_triton_specialisation():
    base = torch.zeros(64)
    assert _arg_spec([base])[0] != _arg_spec([base[1:]])[0]  # 4-byte offset: not 16-aligned
    assert _arg_spec([base])[0] == _arg_spec([base[4:]])[0]  # 16-byte offset
    assert _arg_spec([base])[0] != _arg_spec([base.half()])[0]
    assert len({_arg_spec([n])[0] for n in (1, 16, 17, 32)}) == 3
    assert _arg_spec([2**40])[0] != _arg_spec([2**4 * 3])[0]
    assert _arg_spec([None, True, 0.5]) == (None, True, float)


@pytest.mark.parametrize("negate", [False, True])
def test_kernel_launch_matches_the_kernel(rng, device, negate):
    n = 50
    x = randn((n,), generator=rng, device=device)
    launch = KernelLaunch(
        _scaled_copy,
        lambda meta: (triton.cdiv(meta["n"], meta["BLOCK"]),),
        {"n": n, "BLOCK": 16, "NEGATE": negate},
        device=x.device,
    )
    assert launch.free == ["X", "Y", "scale"]
    for scale in (2.0, -0.5):
        y = torch.full_like(x, float("nan"))
        launch(x, y, scale)
        assert_close(y, (-x if negate else x) * scale, tol=0)
    offset = torch.full((n + 1,), float("nan"), device=x.device)
    launch(x, offset[1:], 1.0)  # an unaligned output goes through Triton's own specialisation
    assert_close(offset[1:], -x if negate else x, tol=0)
    if x.device.type == "cuda":
        assert launch.direct_launches >= 1


def test_kernel_launch_rejects_unknown_parameters_and_wrong_arity(device):
    with pytest.raises(TypeError, match="no parameters"):
        KernelLaunch(_scaled_copy, (1,), {"BLOCKS": 16}, device=torch.device(device))
    launch = KernelLaunch(
        _scaled_copy, (1,), {"n": 1, "BLOCK": 16, "NEGATE": False}, device=torch.device(device)
    )
    with pytest.raises(TypeError, match="per-call arguments"):
        launch(torch.zeros(1, device=device))


@pytest.mark.gpu
def test_kernel_launch_direct_path_and_graph_capture():
    x = torch.randn(1000, device="cuda")
    y = torch.empty_like(x)
    launch = KernelLaunch(
        _scaled_copy, (triton.cdiv(1000, 256),), {"n": 1000, "BLOCK": 256, "NEGATE": True},
        device=x.device,
    )  # fmt: skip
    launch(x, y, 3.0)  # compiles
    launch(x, y, 3.0)
    assert launch.direct_launches == 1
    torch.testing.assert_close(y, -3.0 * x)
    graph = torch.cuda.CUDAGraph()
    y.zero_()
    with torch.cuda.graph(graph):
        launch(x, y, 2.0)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(y, -2.0 * x)
    assert device_facts(x.device).sm_count > 0


class CudaLauncher:
    """Stands in for Triton 3.6's launcher: records the C launch's arguments."""

    def __init__(self, global_scratch_size=0, profile_scratch_size=0):
        self.global_scratch_size, self.profile_scratch_size = (
            global_scratch_size,
            profile_scratch_size,
        )
        self.launch_cooperative_grid, self.launch_pdl = False, True
        self.calls = []
        self.launch = lambda *a: self.calls.append(a)


def test_direct_launcher_passes_what_the_launcher_would():
    run = CudaLauncher()
    compiled = SimpleNamespace(run=run, function="fn", packed_metadata="meta")
    _direct_launcher(compiled)(4, 1, 1, "stream", "x", 7)
    # the launcher's own call: grid, stream, function, cooperative, pdl, both scratch buffers,
    # then the metadata, the launch metadata, both hooks and the kernel's arguments
    assert run.calls == [
        (4, 1, 1, "stream", "fn", False, True, None, None, "meta", None, None, None, "x", 7)
    ]
    # scratch to allocate per launch, or another launcher: through ``compiled.run`` instead
    scratch = SimpleNamespace(
        run=CudaLauncher(global_scratch_size=8), function=0, packed_metadata=0
    )
    assert _direct_launcher(scratch) is None
    assert _direct_launcher(SimpleNamespace(run=lambda *a: None)) is None


def test_direct_launcher_follows_the_declared_argument_order():
    from triton_dispatch.launch import LAUNCH_ARGUMENT_ORDER

    run = CudaLauncher()
    compiled = SimpleNamespace(run=run, function="fn", packed_metadata="meta")
    _direct_launcher(compiled)(4, 2, 1, "stream", "x", 7)
    (call,) = run.calls
    named = dict(zip(LAUNCH_ARGUMENT_ORDER, call))
    assert named == {
        "gridX": 4, "gridY": 2, "gridZ": 1, "_stream": "stream", "_function": "fn",
        "launch_cooperative_grid": False, "launch_pdl": True, "global_scratch_obj": None,
        "profile_scratch_obj": None, "kernel_metadata": "meta", "launch_metadata": None,
        "launch_enter_hook": None, "launch_exit_hook": None,
    }  # fmt: skip
    assert call[len(LAUNCH_ARGUMENT_ORDER) :] == ("x", 7)  # then the kernel's own arguments


def _fast_launch_release():
    from triton_dispatch import triton_version
    from triton_dispatch.launch import FAST_LAUNCH_TRITON_VERSIONS

    return triton_version.installed_triton_release() in FAST_LAUNCH_TRITON_VERSIONS


@pytest.mark.skipif(not _fast_launch_release(), reason="direct launches are off on this Triton")
def test_the_installed_triton_launches_in_the_order_the_direct_launch_assumes():
    """Compiles a probe kernel for sm_90 (no GPU needed) and reads the launcher Triton generates
    for it: the C launch function's parameters, what the compiled kernel's metadata packs, and the
    calls ``JITFunction.run`` and ``CudaLauncher`` make, against what ``KernelLaunch`` passes."""
    from triton_dispatch.compile_check import launcher_facts, nvidia_backend_available
    from triton_dispatch.launch import LAUNCH_ARGUMENT_ORDER, fast_launch_supported

    if not nvidia_backend_available():
        pytest.skip("Triton's NVIDIA backend is not installed")
    assert fast_launch_supported()
    facts = launcher_facts(capability=90)
    lead = len(LAUNCH_ARGUMENT_ORDER)
    assert facts["c_launch_parameters"][:lead] == list(LAUNCH_ARGUMENT_ORDER)
    # every parameter of the kernel follows, constexprs included (KernelLaunch passes them all)
    arguments = facts["kernel_arguments"]
    assert facts["c_launch_parameters"][lead:] == [f"_arg{i}" for i in range(len(arguments))]
    assert facts["packed_metadata"] == facts["num_warps_ctas_shared"]
    assert "missing" not in facts["scratch_and_flags"].values()
    # CompiledKernel.run(gridX, gridY, gridZ, stream, function, packed_metadata, launch_metadata,
    # enter hook, exit hook, *args) reaches the C function through CudaLauncher.__call__
    assert facts["launcher_call"] == [
        "gridX", "gridY", "gridZ", "stream", "function", "self.launch_cooperative_grid",
        "self.launch_pdl", "global_scratch", "profile_scratch", "*args",
    ]  # fmt: skip
    assert facts["jit_run_call"] == [
        "grid_0", "grid_1", "grid_2", "stream", "kernel.function", "kernel.packed_metadata",
        "launch_metadata", "knobs.runtime.launch_enter_hook", "knobs.runtime.launch_exit_hook",
        "*bound_args.values()",
    ]  # fmt: skip


def test_fast_launch_follows_the_declared_triton_versions(monkeypatch):
    from triton_dispatch import launch, triton_version

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # decide as a GPU run would

    def cuda_launch():
        bound = {"n": 8, "BLOCK": 16, "NEGATE": False}
        return KernelLaunch(_scaled_copy, (1,), bound, device=torch.device("cuda", 0))

    assert cuda_launch().direct == launch.fast_launch_supported()
    installed = triton_version.installed_triton_release
    monkeypatch.setattr(triton_version, "installed_triton_release", lambda: "99.0")
    assert not launch.fast_launch_supported()
    fallback = cuda_launch()
    assert fallback.on_gpu and not fallback.direct
    monkeypatch.setattr(triton_version, "installed_triton_release", installed)
    monkeypatch.setattr(launch, "FAST_LAUNCH_TRITON_VERSIONS", ())
    assert not cuda_launch().direct


def test_the_public_launcher_fallback_gives_the_same_results(rng, device, monkeypatch):
    from triton_dispatch import launch

    n = 50
    x = randn((n,), generator=rng, device=device)
    bound = {"n": n, "BLOCK": 16, "NEGATE": True}

    def run_twice():
        plan = KernelLaunch(
            _scaled_copy, lambda meta: (triton.cdiv(meta["n"], meta["BLOCK"]),), bound,
            device=x.device,
        )  # fmt: skip
        outputs = []
        for scale in (2.0, -0.5):  # the second call is the one a supported Triton launches directly
            y = torch.full_like(x, float("nan"))
            plan(x, y, scale)
            outputs.append(y)
        return plan, outputs

    fast, expected = run_twice()
    monkeypatch.setattr(launch, "FAST_LAUNCH_TRITON_VERSIONS", ())
    public, got = run_twice()
    assert not public.direct and public.direct_launches == 0
    for y, want in zip(got, expected, strict=True):
        assert torch.equal(y, want)
        assert not torch.isnan(y).any()
    if fast.direct:
        assert fast.direct_launches == 1
