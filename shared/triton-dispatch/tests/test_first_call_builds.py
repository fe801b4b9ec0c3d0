"""First-call helpers: launcher builds at -O1 through Triton's build hook, and kernels compiled
ahead of their launch on background threads."""

import subprocess
import threading

import pytest
import torch
import triton
import triton.language as tl

from triton_dispatch import compile_ahead, host_build
from triton_dispatch.launch import KernelLaunch
from triton_dispatch.testing import assert_close, randn
from triton_dispatch.warmup import counting_compiles

_EXTENSION = r"""
#include <Python.h>
static PyObject *answer(PyObject *self, PyObject *args) { return PyLong_FromLong(%d); }
static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, ""}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "%s", NULL, -1, methods};
PyMODINIT_FUNC PyInit_%s(void) { return PyModule_Create(&module); }
"""


@pytest.fixture
def fresh_hook(monkeypatch, tmp_path):
    """Triton's build hook empty and its cache in a temporary folder; restored afterwards."""
    from triton import knobs

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    saved = knobs.build.impl
    host_build.uninstall_fast_host_builds()
    knobs.build.impl = None
    yield knobs
    host_build.uninstall_fast_host_builds()
    knobs.build.impl = saved


def _build_extension(name: str, value: int):
    from triton.runtime.build import compile_module_from_src

    return compile_module_from_src(_EXTENSION % (value, name, name), name)


def test_fast_build_builds_triton_modules_at_o1(fresh_hook, monkeypatch):
    commands = []
    real = subprocess.check_call

    def spy(command, **kwargs):
        commands.append(command)
        return real(command, **kwargs)

    monkeypatch.setattr(host_build.subprocess, "check_call", spy)
    assert host_build.install_fast_host_builds()
    assert fresh_hook.build.impl is host_build.fast_build
    value = int(torch.randint(1, 10_000, ()).item())  # a new source: no cache hit
    module = _build_extension("fast_build_probe", value)
    assert module.answer() == value
    assert len(commands) == 1 and host_build.OPT_LEVEL in commands[0]
    assert "-O3" not in commands[0]


def test_a_users_build_hook_and_the_switch_are_respected(fresh_hook, monkeypatch):
    def own(*args):
        raise AssertionError("not called here")

    fresh_hook.build.impl = own
    assert not host_build.install_fast_host_builds()
    assert fresh_hook.build.impl is own
    host_build.uninstall_fast_host_builds()
    assert fresh_hook.build.impl is own  # uninstall only removes its own hook

    fresh_hook.build.impl = None
    monkeypatch.setenv(host_build.FAST_HOST_BUILD_ENV_VAR, "0")
    assert not host_build.install_fast_host_builds()
    assert fresh_hook.build.impl is None


def test_wait_for_waits_on_that_kernels_background_compiles():
    release = threading.Event()
    done = []
    kernel, other = object(), object()

    def slow():
        release.wait(10)
        done.append("slow")

    before = compile_ahead.submitted_count()
    compile_ahead.submit(other, lambda: done.append("other"))
    compile_ahead.submit(kernel, slow)
    compile_ahead.wait_for(other)  # returns while the slow one still waits
    assert done == ["other"]
    release.set()
    compile_ahead.wait_for(kernel)
    assert done == ["other", "slow"]
    assert compile_ahead.submitted_count() == before + 2
    # a failing job is dropped: the real launch raises its error
    compile_ahead.submit(kernel, lambda: 1 / 0)
    compile_ahead.wait_all()


@triton.jit
def _add_one(X, Y, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(Y + i, tl.load(X + i, mask=i < n) + 1.0, mask=i < n)


def test_compile_ahead_checks_its_arguments_and_does_nothing_when_interpreting():
    launch = KernelLaunch(
        _add_one, (1,), {"n": 4, "BLOCK": 16}, device=torch.device("cpu")
    )  # fmt: skip
    with pytest.raises(TypeError, match="per-call arguments"):
        launch.compile_ahead(torch.float32)
    before = compile_ahead.submitted_count()
    launch.compile_ahead(torch.float32, torch.float32)
    assert compile_ahead.submitted_count() == before  # nothing to compile off the GPU


@pytest.mark.gpu
def test_a_kernel_compiled_ahead_is_not_compiled_again_at_its_launch(monkeypatch, tmp_path):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    n = 1000
    block = 128 << int(torch.randint(0, 4, ()).item())  # a variant this process has not built
    launch = KernelLaunch(
        _add_one, (triton.cdiv(n, block),), {"n": n, "BLOCK": block}, device=torch.device("cuda")
    )  # fmt: skip
    before = compile_ahead.submitted_count()
    launch.compile_ahead(torch.float32, torch.float32)
    assert compile_ahead.submitted_count() == before + 1
    compile_ahead.wait_all()
    x = randn((n,), device="cuda")
    y = torch.full_like(x, float("nan"))
    with counting_compiles() as count:
        launch(x, y)
    torch.cuda.synchronize()
    assert count.compiled == 0
    assert_close(y, x.double() + 1)


def test_claim_gives_each_key_once():
    key = ("claimed once", object())
    assert compile_ahead.claim(key)
    assert not compile_ahead.claim(key)


@triton.jit(do_not_specialize=["scale"])
def _scaled(X, Y, n, scale, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(Y + i, tl.load(X + i, mask=i < n) * scale, mask=i < n)


@pytest.mark.gpu
def test_launches_that_share_a_kernel_compile_it_once_ahead(monkeypatch, tmp_path):
    """Two launches that differ only in an argument Triton does not specialise on (1 and 16
    would be two kernels otherwise) submit one background compile, and neither compiles again."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    n = 1000
    block = 128 << int(torch.randint(0, 4, ()).item())  # a variant this process has not built
    launches = [
        KernelLaunch(_scaled, (triton.cdiv(n, block),), {"n": n, "scale": s, "BLOCK": block},
                     device=torch.device("cuda"))
        for s in (1, 16)
    ]  # fmt: skip
    before = compile_ahead.submitted_count()
    for launch in launches:
        launch.compile_ahead(torch.float32, torch.float32)
    assert compile_ahead.submitted_count() == before + 1
    compile_ahead.wait_all()
    x = randn((n,), device="cuda")
    with counting_compiles() as count:
        for launch, s in zip(launches, (1, 16), strict=True):
            y = torch.full_like(x, float("nan"))
            launch(x, y)
            assert_close(y, x.double() * s)
    assert count.compiled == 0


def test_fast_builds_follow_the_declared_triton_versions(fresh_hook, monkeypatch):
    from triton_dispatch import triton_version

    installed = triton_version.installed_triton_release
    monkeypatch.setattr(triton_version, "installed_triton_release", lambda: "99.0")
    assert not host_build.install_fast_host_builds()
    assert fresh_hook.build.impl is None  # Triton keeps its own builds
    host_build.uninstall_fast_host_builds()
    monkeypatch.setattr(triton_version, "installed_triton_release", installed)
    if triton_version.installed_triton_release() in host_build.FAST_HOST_BUILD_TRITON_VERSIONS:
        monkeypatch.setattr(host_build, "FAST_HOST_BUILD_TRITON_VERSIONS", ())
        assert not host_build.install_fast_host_builds()


class _Recorded:
    """A stand-in launch's stub: a future of its compile, and the calls it ran."""

    def __init__(self, future):
        self.future, self.calls, self._compiled = future, [], {}

    def compile_ahead(self, *args):
        return self.future

    def _through_triton(self, args, wait_ahead=True):
        self.calls.append((args, wait_ahead))


def _stand_in_setup(monkeypatch, own_future, quick_future):
    launch = KernelLaunch(
        _add_one, (1,), {"n": 4, "BLOCK": 16}, device=torch.device("cpu")
    )  # fmt: skip
    assert launch.stand_in is None  # nothing is compiled ahead off the GPU
    launch.direct = True  # as on a GPU with fast launches
    launch.stand_in = _Recorded(quick_future)
    own_calls = []
    monkeypatch.setattr(launch, "compile_ahead", lambda *args: own_future)
    monkeypatch.setattr(launch, "_through_triton", lambda args: own_calls.append(args))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    return launch, own_calls


def test_a_stand_in_runs_the_first_calls_until_the_own_kernel_is_built(monkeypatch):
    from concurrent.futures import Future

    own, quick = Future(), Future()
    quick.set_result(None)
    launch, own_calls = _stand_in_setup(monkeypatch, own, quick)
    stand_in = launch.stand_in
    launch("a", "b")
    launch("c", "d")
    # the stand-in ran both, without waiting for the own compile of the same kernel
    assert stand_in.calls == [(("a", "b"), False), (("c", "d"), False)]
    assert own_calls == [] and launch.stand_in_calls == 2
    own.set_result(None)
    launch("e", "f")
    assert own_calls == [("e", "f")] and launch.stand_in is None
    launch("g", "h")
    assert own_calls[-1] == ("g", "h") and len(stand_in.calls) == 2


def test_the_own_kernel_runs_when_it_is_built_first_or_under_graph_capture(monkeypatch):
    from concurrent.futures import Future

    own, quick = Future(), Future()
    own.set_result(None)  # a load from Triton's disk cache finishes first
    launch, own_calls = _stand_in_setup(monkeypatch, own, quick)
    stand_in = launch.stand_in
    launch("a", "b")
    assert own_calls == [("a", "b")] and stand_in.calls == [] and launch.stand_in is None

    pending, quick = Future(), Future()
    quick.set_result(None)
    launch, own_calls = _stand_in_setup(monkeypatch, pending, quick)
    stand_in = launch.stand_in
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    launch("a", "b")  # a graph keeps what it records: the own kernel, waited for
    assert own_calls == [("a", "b")] and stand_in.calls == []

    launch, own_calls = _stand_in_setup(monkeypatch, None, quick)  # compiling ahead is off
    launch("a", "b")
    assert own_calls == [("a", "b")] and launch.stand_in is None


@triton.jit
def _add_one_again(X, Y, n, BLOCK: tl.constexpr):  # compiled by the stand-in test alone
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(Y + i, tl.load(X + i, mask=i < n) + 1.0, mask=i < n)


@pytest.mark.gpu
def test_a_stand_in_gives_the_first_call_while_the_own_kernel_compiles(monkeypatch, tmp_path):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    n = 1000
    block = 64 << int(torch.randint(0, 4, ()).item())
    own = KernelLaunch(
        _add_one_again, (triton.cdiv(n, block),), {"n": n, "BLOCK": block},
        device=torch.device("cuda"),
        stand_in=KernelLaunch(_add_one_again, (triton.cdiv(n, 32),), {"n": n, "BLOCK": 32},
                              device=torch.device("cuda")),
    )  # fmt: skip
    compile_own = own._compile_only
    started = threading.Event()

    def slow_compile(args):  # the own kernel's compile outlasts the stand-in's
        started.wait(10)
        compile_own(args)

    monkeypatch.setattr(own, "_compile_only", slow_compile)
    x = randn((n,), device="cuda")
    y = torch.full_like(x, float("nan"))
    own(x, y)
    assert own.stand_in_calls == 1
    torch.cuda.synchronize()
    assert_close(y, x.double() + 1)
    started.set()
    compile_ahead.wait_all()
    y.fill_(float("nan"))
    own(x, y)
    own(x, y)
    torch.cuda.synchronize()
    assert own.stand_in is None and own.stand_in_calls == 1 and own.direct_launches == 1
    assert_close(y, x.double() + 1)


def test_a_warm_up_waits_for_the_compiles_its_calls_started_in_the_background():
    from triton_dispatch.warmup import run_warmup

    release, done = threading.Event(), []

    def call():  # a call that leaves a compile running, as a stand-in's first call does
        compile_ahead.submit(call, lambda: (release.wait(10), done.append(True)))
        threading.Timer(0.2, release.set).start()

    report = run_warmup([call])
    assert done == [True] and report.calls == 1
