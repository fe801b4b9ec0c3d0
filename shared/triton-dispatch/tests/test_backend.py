import pytest
import torch

from triton_dispatch import (
    BACKEND_ENV_VAR,
    BackendUnavailableError,
    common_device,
    interpreter_enabled,
    select_backend,
    uses_triton,
)


def test_auto_picks_interpreter_on_cpu_when_interpreting(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.delenv(BACKEND_ENV_VAR, raising=False)
    assert select_backend(torch.zeros(2)) == "interpret"


def test_auto_picks_reference_on_cpu_without_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.delenv(BACKEND_ENV_VAR, raising=False)
    assert not interpreter_enabled()
    assert select_backend(torch.zeros(2)) == "torch"


def test_auto_reference_for_other_devices(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert select_backend(torch.zeros(2, device="meta")) == "torch"


def test_keyword_forces_reference():
    assert select_backend(torch.zeros(2), backend="torch") == "torch"
    assert not uses_triton("torch")
    assert uses_triton("interpret") and uses_triton("triton")


def test_env_var_forces_backend_and_keyword_wins(monkeypatch):
    monkeypatch.setenv(BACKEND_ENV_VAR, "torch")
    assert select_backend(torch.zeros(2)) == "torch"
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert select_backend(torch.zeros(2), backend="interpret") == "interpret"


def test_forced_triton_on_cpu_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(BackendUnavailableError, match="needs CUDA tensors"):
        select_backend(torch.zeros(2), backend="triton")


def test_forced_triton_while_interpreting_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(BackendUnavailableError, match="TRITON_INTERPRET=1 is set"):
        select_backend(torch.zeros(2), backend="triton")


def test_forced_interpret_without_interpreter_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(BackendUnavailableError, match="needs TRITON_INTERPRET=1"):
        select_backend(torch.zeros(2), backend="interpret")


def test_forced_interpret_on_unsupported_device(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(BackendUnavailableError, match="CPU or CUDA"):
        select_backend(torch.zeros(2, device="meta"), backend="interpret")


@pytest.mark.parametrize("bad", ["cuda", "triton2", "reference", "gpu"])
def test_unknown_backend_names_the_choices(bad):
    with pytest.raises(ValueError, match="expected one of 'auto', 'triton', 'interpret', 'torch'"):
        select_backend(torch.zeros(2), backend=bad)


def test_unknown_backend_in_env_names_the_variable(monkeypatch):
    monkeypatch.setenv(BACKEND_ENV_VAR, "fast")
    with pytest.raises(ValueError, match=BACKEND_ENV_VAR):
        select_backend(torch.zeros(2))


def test_mixed_devices_are_rejected_with_names():
    with pytest.raises(ValueError, match="Q on cpu, D on meta"):
        common_device([torch.zeros(1), torch.zeros(1, device="meta")], names=["Q", "D"])
    with pytest.raises(ValueError, match="same device"):
        select_backend(torch.zeros(1), torch.zeros(1, device="meta"))


def test_none_tensors_are_ignored_and_no_tensor_means_cpu(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert select_backend(None, torch.zeros(1), None) == "torch"
    assert select_backend() == "torch"
    with pytest.raises(ValueError, match="at least one tensor"):
        common_device([None])


@pytest.mark.gpu
def test_auto_picks_triton_on_cuda(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert select_backend(torch.zeros(2, device="cuda")) == "triton"


@pytest.mark.parametrize(("interpret", "expected"), [("1", 3.0), ("0", 2.0)])
def test_select_backend_traces_under_fullgraph_compile(monkeypatch, interpret, expected):
    monkeypatch.setenv("TRITON_INTERPRET", interpret)
    monkeypatch.delenv(BACKEND_ENV_VAR, raising=False)

    def op(x):
        return x * 3 if uses_triton(select_backend(x)) else x + 1

    torch._dynamo.reset()
    out = torch.compile(op, fullgraph=True, backend="eager")(torch.ones(2))
    assert out.tolist() == [expected, expected]
