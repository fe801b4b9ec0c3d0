"""The bad-input kit against toy ops: a careful op passes every case, careless ones are caught."""

import pytest
import torch

from triton_dispatch.testing import (
    CASE_KINDS,
    OpSpec,
    TensorArg,
    bad_input_cases,
    bad_input_params,
    check_bad_input,
    generator,
    randint,
    randn,
)


def gather_rows_reference(x, idx):
    return x[idx].sum(-1)


def careful_gather_rows(x, idx):
    """rows of ``x (N, D)`` picked by ``idx (M,)`` int64 in [0, N), summed."""
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError(f"x must be (N, D), got {getattr(x, 'shape', x)}")
    if not x.is_floating_point():
        raise TypeError(f"x must be floating point, got {x.dtype}")
    if idx.dim() != 1 or idx.dtype != torch.int64:
        raise TypeError(f"idx must be int64 (M,), got {idx.dtype} {tuple(idx.shape)}")
    if x.device != idx.device:
        raise ValueError(f"x and idx must share a device, got {x.device} and {idx.device}")
    if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= x.shape[0]):
        raise ValueError(f"idx values must lie in [0, {x.shape[0]}), the rows of x")
    return x.index_select(0, idx).sum(-1)


def careless_gather_rows(x, idx):
    # no checks: a bad index is an IndexError/RuntimeError, not a clear error
    return x.contiguous().view(-1, x.shape[-1])[idx].sum(-1)


def strided_blind_gather_rows(x, idx):
    """Validates, but reads the storage as if contiguous: silent wrong answers on views."""
    careful_gather_rows(x, idx)
    flat = torch.as_strided(x, x.shape, (x.shape[1], 1))
    return flat.index_select(0, idx).sum(-1)


def _inputs(gen):
    return {"x": randn((5, 3), generator=gen), "idx": randint(0, 5, (4,), generator=gen)}


ARGS = [
    TensorArg("x", dtypes=(torch.float16, torch.float32, torch.float64)),
    TensorArg("idx", index_range=(0, 5)),
]


def _spec(op):
    return OpSpec(op.__name__, op, gather_rows_reference, _inputs, ARGS)


def test_every_kind_of_case_is_generated():
    kinds = {c.kind for c in bad_input_cases(_spec(careful_gather_rows))}
    assert kinds == set(CASE_KINDS)
    ids = [c.id for c in bad_input_cases(_spec(careful_gather_rows))]
    assert len(ids) == len(set(ids)) and "careful_gather_rows-idx-index_high-5" in ids


@pytest.mark.parametrize("case", bad_input_params(_spec(careful_gather_rows)))
def test_a_careful_op_passes_every_case(case, seed, device):
    assert check_bad_input(case, seed=seed, device=device) in ("raised", "matched")


def test_outcomes_of_a_careful_op():
    outcome = {c.id: check_bad_input(c) for c in bad_input_cases(_spec(careful_gather_rows))}
    assert outcome["careful_gather_rows-x-noncontiguous-stride2"] == "matched"
    assert outcome["careful_gather_rows-x-nonfinite-nan_inf"] == "matched"
    assert outcome["careful_gather_rows-idx-index_high-5"] == "raised"
    assert outcome["careful_gather_rows-x-device-meta"] == "raised"


def test_a_careless_op_is_caught():
    failures = {}
    for case in bad_input_cases(_spec(careless_gather_rows)):
        try:
            check_bad_input(case)
        except AssertionError as exc:
            failures[case.id.removeprefix("careless_gather_rows-")] = str(exc)
    assert "expected a TypeError/ValueError naming 'idx'" in failures["idx-index_high-5"]
    assert "reference refuses" in failures["x-rank-3"]  # it flattened a rank-3 x and answered
    assert "got IndexError" in failures["idx-dtype-int16"]


def test_a_silent_wrong_answer_is_caught():
    cases = {
        c.kind: c for c in bad_input_cases(_spec(strided_blind_gather_rows)) if c.arg.name == "x"
    }
    cases["index_high"] = next(
        c for c in bad_input_cases(_spec(strided_blind_gather_rows)) if c.kind == "index_high"
    )
    with pytest.raises(AssertionError, match="differs from the reference"):
        check_bad_input(cases["noncontiguous"])
    assert check_bad_input(cases["index_high"]) == "raised"


def test_an_error_that_does_not_name_the_argument_fails():
    def vague(x, idx):
        raise ValueError("bad input")

    case = bad_input_cases(_spec(vague))[0]
    with pytest.raises(AssertionError, match="does not name the argument 'x'"):
        check_bad_input(case)


def test_accepting_what_the_reference_refuses_fails():
    def lenient(x, idx):
        return x.new_zeros(idx.shape)

    case = next(c for c in bad_input_cases(_spec(lenient)) if c.kind == "index_high")
    with pytest.raises(AssertionError, match="reference refuses"):
        check_bad_input(case)
    case = next(c for c in bad_input_cases(_spec(lenient)) if c.kind == "device")
    with pytest.raises(AssertionError, match="another device"):
        check_bad_input(case)


def test_xfail_names_must_exist():
    with pytest.raises(ValueError, match="do not exist"):
        bad_input_params(_spec(careful_gather_rows), xfail={"nope": "why"})
    params = bad_input_params(
        _spec(careful_gather_rows), xfail={"careful_gather_rows-x-rank-3": "example"}
    )
    marked = [p for p in params if p.marks]
    assert len(marked) == 1 and marked[0].marks[0].kwargs["strict"] is True


def test_ranks_and_in_place_results():
    def add_(x, y):
        if x.dim() not in (1, 2) or y.shape != x.shape[-1:]:
            raise ValueError(
                f"x must be (N, D) or (D,) and y (D,), got x {tuple(x.shape)} y {tuple(y.shape)}"
            )
        if x.device != y.device:
            raise ValueError(f"x and y must share a device, got {x.device} and {y.device}")
        if x.stride(-1) == 0 or x.stride(0) == 0:
            raise ValueError("x is updated in place: it must not be an expanded view")
        x.add_(y)

    spec = OpSpec(
        "add_",
        add_,
        lambda x, y: x.add_(y),
        lambda g: {"x": randn((3, 2), generator=g), "y": randn((2,), generator=g)},
        [
            TensorArg("x", ranks=(1, 2), dtypes=(torch.float32, torch.float64, torch.float16)),
            TensorArg("y", dtypes=(torch.float32, torch.float64, torch.float16)),
        ],
        result=lambda inputs, _: inputs["x"],
    )
    cases = bad_input_cases(spec)
    assert [c.detail for c in cases if c.kind == "rank" and c.arg.name == "x"] == ["3"]
    for case in cases:
        if case.kind != "dtype":
            check_bad_input(case)


def test_an_error_may_name_a_related_argument():
    def strict_pair(x, idx):
        if idx.numel() and x.shape[0] == 0:
            raise ValueError(f"idx must index rows of a non-empty table, got {x.shape[0]} rows")
        return careful_gather_rows(x, idx)

    unrelated = [TensorArg("x", dtypes=ARGS[0].dtypes), ARGS[1]]
    related = [TensorArg("x", dtypes=ARGS[0].dtypes, related=("idx",)), ARGS[1]]
    for args, ok in ((unrelated, False), (related, True)):
        spec = OpSpec("pair", strict_pair, gather_rows_reference, _inputs, args)
        case = next(c for c in bad_input_cases(spec) if c.kind == "empty" and c.arg.name == "x")
        if ok:
            assert check_bad_input(case) == "raised"
        else:
            with pytest.raises(AssertionError, match="does not name the argument 'x'"):
                check_bad_input(case)


def test_nonfinite_outputs_may_differ_in_kind_not_in_place():
    def spread(x, idx):  # 0 * inf: NaN where the reference keeps inf
        out = careful_gather_rows(x, idx)
        return torch.where(torch.isinf(out), torch.full_like(out, float("nan")), out)

    def shifted(x, idx):  # non-finite moved to another row
        return careful_gather_rows(x, idx).roll(1)

    for op, ok in ((spread, True), (shifted, False)):
        spec = OpSpec(op.__name__, op, gather_rows_reference, _inputs, ARGS)
        case = next(c for c in bad_input_cases(spec) if c.kind == "nonfinite")
        gen_seed = next(
            s
            for s in range(100)
            if not torch.isfinite(gather_rows_reference(**case.inputs(generator(s)))).all()
        )
        if ok:
            assert check_bad_input(case, seed=gen_seed) == "matched"
        else:
            with pytest.raises(AssertionError, match="differs"):
                check_bad_input(case, seed=gen_seed)
