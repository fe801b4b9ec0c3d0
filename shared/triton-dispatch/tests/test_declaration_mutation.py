"""An in-place op on ``OpDeclaration``: inputs it updates (``mutates``), per-call arguments
outside the plan's key (``passed``), settings that may be ``None`` (``nullable``), optional
tensors made when left out (``TensorSpec.default``) and the public plan cache (``plans``), on
the eager route, the reference route and under ``torch.compile(fullgraph=True)``."""

from __future__ import annotations

import pytest
import torch

from triton_dispatch import interpreter_enabled
from triton_dispatch.declaration import OpDeclaration, PassedSpec, SettingSpec, TensorSpec

pytestmark = pytest.mark.skipif(
    not (torch.cuda.is_available() or interpreter_enabled()),
    reason="needs CUDA or TRITON_INTERPRET=1",
)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SEEN: list[dict] = []  # what each plan's forward got besides the tensors


def _blend_(x, state, noise, *, rate, noisy=False, generator=None, tag=None):
    """``state <- (1 - rate) * state + rate * (x + noise)`` in place (``rate=None``: keep the
    state); returns where the state grew."""
    SEEN.append({"generator": generator, "tag": tag, "noise": noise})
    before = state.clone()
    if rate is not None:
        state.mul_(1 - rate).add_(rate * (x if noise is None else x + noise))
    return state > before


class _BlendPlan:
    def __init__(self, call) -> None:
        self.rate = call["rate"]
        self.tagged = call.passed["tag"] is not None

    def forward(self, x, state, noise, *, generator=None, tag=None):
        assert (tag is not None) == self.tagged, "the key holds whether a tag was given"
        return _blend_(x, state, noise, rate=self.rate, generator=generator, tag=tag)


def _noise(call):
    """Noise drawn from the passed generator when the call asks for it (``noisy``)."""
    if not call["noisy"]:
        return None
    shape, device = call["x"].shape, call.device
    return lambda generator=None, tag=None: torch.randn(shape, generator=generator, device=device)


VECTOR = TensorSpec("x", (torch.float32,), "(N,)", fits=lambda shape: len(shape) == 1)
BLEND = OpDeclaration(
    "triton_dispatch_mutation::blend",
    inputs=[
        TensorSpec("x", (torch.float32,), "(N,)", fits=lambda shape: len(shape) == 1),
        TensorSpec(
            "state",
            (torch.float32,),
            "(N,)",
            contiguous=True,
            dtype_message="{name} is a float32 state, got {dtype}",
        ),
        TensorSpec("noise", (torch.float32,), "(N,)", optional=True, default=_noise),
    ],
    settings=[
        SettingSpec(
            "rate", float, 0.5, nullable=True, valid=lambda r: 0 <= r <= 1, expected="in [0, 1]"
        ),
        SettingSpec("noisy", bool, False),
    ],
    passed=[
        PassedSpec("generator"),
        PassedSpec("tag", schema="str?", to_op=lambda tag: f"<{tag}>", from_op=lambda s: s[1:-1]),
    ],
    mutates=("state",),
    outputs=("grew",),
    returns=("grew",),
    reference=_blend_,
    plan=_BlendPlan,
    fake=lambda x, state, noise, **settings: state.new_empty(state.shape, dtype=torch.bool),
)


@pytest.fixture(autouse=True)
def fresh():
    from triton_dispatch.launch import clear_plan_caches

    clear_plan_caches()
    SEEN.clear()
    yield
    clear_plan_caches()


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(6, generator=g).to(DEVICE), torch.randn(6, generator=g).to(DEVICE)


def _expected(x, state, rate=0.5, noise=None):
    want = state.clone()
    grew = _blend_(x, want, noise, rate=rate)
    SEEN.pop()
    return want, grew


def test_the_op_updates_its_input_in_place_and_returns_its_outputs():
    x, state = _inputs()
    want, want_grew = _expected(x, state)
    grew = BLEND(x, state, None)
    assert torch.equal(state, want) and torch.equal(grew, want_grew)
    # the custom op is functional: the updated state comes back after the outputs
    schema = str(BLEND.op._opoverload._schema)
    assert "!" not in schema and schema.endswith("-> (Tensor, Tensor)"), schema


def test_repeat_calls_hit_the_public_plan_cache_keyed_by_what_is_passed():
    x, state = _inputs()
    plans = BLEND.plans
    BLEND(x, state, None)
    BLEND(x, state, None, generator=torch.Generator())  # only presence is keyed
    assert (plans.hits, plans.misses) == (0, 2)
    BLEND(x, state, None, generator=torch.Generator())
    BLEND(x, state, None, tag="a")
    BLEND(x, state, None, tag="b")
    assert (plans.hits, plans.misses) == (2, 3)
    assert [s["tag"] for s in SEEN] == [None, None, None, "a", "b"]
    plans.clear()
    assert (plans.hits, plans.misses, len(plans)) == (0, 0, 0)


def test_a_nullable_setting_takes_none_and_still_checks_values():
    x, state = _inputs()
    kept = state.clone()
    assert not BLEND(x, state, None, rate=None).any()
    assert torch.equal(state, kept)
    assert BLEND.validate([x, state, None], None, {"rate": None}).settings["rate"] is None
    assert "float? rate" in str(BLEND.op._opoverload._schema)
    with pytest.raises(ValueError, match=r"rate must be in \[0, 1\], got 2.0"):
        BLEND(x, state, None, rate=2.0)
    with pytest.raises(TypeError, match="rate must be a float, got str"):
        BLEND(x, state, None, rate="fast")


def test_a_default_is_made_from_the_passed_generator_on_every_call():
    x, state = _inputs()
    reference_state = state.clone()
    for backend in (None, "torch"):
        target = state if backend is None else reference_state
        for seed in (1, 2):  # the second call hits the plan and draws again
            noise = torch.randn(6, generator=torch.Generator().manual_seed(seed)).to(DEVICE)
            want, want_grew = _expected(x, target, noise=noise)
            generator = torch.Generator(device=DEVICE).manual_seed(seed)
            grew = BLEND(x, target, None, noisy=True, generator=generator, backend=backend)
            assert torch.equal(target, want) and torch.equal(grew, want_grew)
            assert SEEN[-1]["generator"] is generator
            assert torch.equal(SEEN[-1]["noise"], noise)
    # a call that needs none gets None; a given tensor is used as it is
    BLEND(x, state, None)
    assert SEEN[-1]["noise"] is None
    given = torch.ones(6, device=DEVICE)
    BLEND(x, state, given, noisy=True)
    assert SEEN[-1]["noise"] is given


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compiled_calls_trace_the_functional_op_and_write_back(backend):
    x, state = _inputs()

    def step(x, state, tag=None):
        return BLEND(x, state, None, rate=0.25, tag=tag).float().sum() + state.sum()

    compiled = torch.compile(step, fullgraph=True, backend=backend)
    eager_state = state.clone()
    for tag in ("t", "t", None):
        got = compiled(x, state, tag)
        want = step(x, eager_state, tag)
        assert torch.equal(state, eager_state) and torch.equal(got, want)
    # the plan inside the custom op got the tag back through its schema type (None as None)
    assert [s["tag"] for s in SEEN] == ["t", "t", "t", "t", None, None]


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_a_state_that_requires_grad_is_updated_as_data(backend):
    x, state = _inputs()
    param = torch.nn.Parameter(state.clone())
    want, _ = _expected(x, state, rate=0.25)
    compiled = torch.compile(
        lambda x, p: BLEND(x, p, None, rate=0.25), fullgraph=True, backend=backend
    )
    compiled(x, param)
    assert torch.equal(param.detach(), want) and param.grad_fn is None


def test_the_dtype_message_and_construction_errors():
    x, state = _inputs()
    with pytest.raises(TypeError, match=r"^state is a float32 state, got torch.float64$"):
        BLEND(x, state.double(), None)
    common = dict(
        outputs=("y",), returns=("y",), reference=lambda x: x, plan=lambda call: None,
        fake=lambda x: x,
    )  # fmt: skip
    with pytest.raises(ValueError, match="mutates must name inputs"):
        OpDeclaration("triton_dispatch_mutation::bad1", inputs=[VECTOR], mutates=("y",), **common)
    with pytest.raises(ValueError, match="only an optional tensor may have a default"):
        OpDeclaration(
            "triton_dispatch_mutation::bad2",
            inputs=[TensorSpec("x", (torch.float32,), "(N,)", default=_noise)],
            **common,
        )
    with pytest.raises(ValueError, match="passed arguments are for ops without a backward"):
        OpDeclaration(
            "triton_dispatch_mutation::bad3",
            inputs=[VECTOR],
            passed=[PassedSpec("generator")],
            saved=("x",),
            backward_fake=lambda grad, x: x,
            **common,
        )
