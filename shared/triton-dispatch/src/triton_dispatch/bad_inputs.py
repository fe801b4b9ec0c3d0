"""Bad-input kit: the standard hostile cases of an op, generated from a description of its arguments.

Describe an op once (:class:`OpSpec`: a function making fresh good inputs, one :class:`TensorArg` per
tensor argument, the op and its reference) and :func:`bad_input_cases` derives the cases every op
must survive: wrong rank, wrong dtype, another device (a ``meta`` tensor stands in for it on a CPU
machine), an empty dimension, NaN/inf values, a non-contiguous view, an expanded (stride-0) view and
out-of-range indices. :func:`check_bad_input` runs one case and accepts exactly two outcomes:

* the op raises ``TypeError`` or ``ValueError`` whose message names the argument; or
* the op returns what the reference returns on the same inputs (evaluated in float64); for
  NaN/inf inputs, non-finite outputs must sit where the reference's are, of either kind, and the
  finite ones are held to the tolerance at the scale of the outputs without the NaN/inf.

Anything else fails with the reason: another exception type (a crash, an ``IndexError``, a Triton
compile error), an error that does not name the argument, a result that differs from the
reference, or a result for inputs the reference itself refuses.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .testing.compare import relative_error, to_reference, tolerance
from .testing.inputs import generator as make_generator

#: dtypes tried in place of an argument's accepted ones (one float, one integer, bool)
_FLOAT_CANDIDATES = (torch.float16, torch.float64)
_INDEX_CANDIDATES = (torch.float32, torch.int16)

CASE_KINDS = (
    "rank",
    "dtype",
    "device",
    "empty",
    "nonfinite",
    "noncontiguous",
    "expanded",
    "index_high",
    "index_low",
)


@dataclass(frozen=True)
class TensorArg:
    """One tensor argument of an op.

    Attributes:
        name: the keyword the op takes it by (and the name its errors must use).
        ranks: the ranks the op accepts (default: the example's rank only).
        dtypes: the dtypes the op accepts (default: the example's dtype only).
        index_range: ``(low, high)``: an index tensor whose values must lie in ``[low, high)``.
        skip: case kinds not to generate for this argument (e.g. ``"empty"`` where an empty
            dimension is not a size a caller can choose).
        related: other names an error may use instead: arguments whose expected shape follows
            from this one (a mask, offsets into it), since a mismatch is reported on whichever
            side of the pair is checked second, or the name a wrapped helper gives the argument.
    """

    name: str
    ranks: tuple[int, ...] | None = None
    dtypes: tuple[torch.dtype, ...] | None = None
    index_range: tuple[int, int] | None = None
    skip: tuple[str, ...] = ()
    related: tuple[str, ...] = ()


def _default_compare(out: Any, ref: Any, tol: float, label: str) -> None:
    outs = out if isinstance(out, (tuple, list)) else (out,)
    refs = ref if isinstance(ref, (tuple, list)) else (ref,)
    if len(outs) != len(refs):
        raise AssertionError(
            f"{label}: the op returned {len(outs)} values, the reference {len(refs)}"
        )
    for i, (o, r) in enumerate(zip(outs, refs)):
        if not isinstance(o, torch.Tensor) or not isinstance(r, torch.Tensor):
            if o != r:
                raise AssertionError(f"{label}: output {i} is {o!r}, the reference gives {r!r}")
            continue
        if tuple(o.shape) != tuple(r.shape):
            raise AssertionError(
                f"{label}: output {i} has shape {tuple(o.shape)}, the reference {tuple(r.shape)}"
            )
        if o.device.type == "meta":
            raise AssertionError(f"{label}: output {i} is a meta tensor (no values)")
        if o.is_floating_point() or r.is_floating_point():
            err = relative_error(o, r)
            if not err <= tol:
                raise AssertionError(
                    f"{label}: output {i} differs from the reference (relative error {err:.3e} > "
                    f"{tol:.1e})"
                )
        elif not torch.equal(o.cpu(), r.cpu().to(o.dtype)):
            raise AssertionError(f"{label}: output {i} differs from the reference")


@dataclass
class OpSpec:
    """An op and the description the kit needs to attack it.

    Attributes:
        name: for test ids.
        op: called as ``op(**inputs, **kwargs)``.
        reference: called as ``reference(**float64_inputs, **kwargs)`` (``reference_kwargs`` when
            given); ``None``: every case must raise.
        make_inputs: ``make_inputs(generator) -> dict`` of fresh, valid, small inputs.
        args: the tensor arguments to attack (others are passed through unchanged).
        kwargs: extra keyword arguments of every op call (e.g. value checks switched on).
        reference_kwargs: keyword arguments of the reference (default: ``kwargs``).
        result: ``result(inputs, returned) -> value to compare``; in-place ops return the tensors
            they updated (default: what the op returned).
        compare: ``compare(out, ref, tol, label)`` raising ``AssertionError`` (default: relative
            error for float tensors, equality otherwise).
        tol: relative-error threshold (default: by the attacked tensor's dtype).
    """

    name: str
    op: Callable[..., Any]
    reference: Callable[..., Any] | None
    make_inputs: Callable[[torch.Generator], dict[str, Any]]
    args: Sequence[TensorArg]
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    reference_kwargs: Mapping[str, Any] | None = None
    result: Callable[[dict[str, Any], Any], Any] | None = None
    compare: Callable[[Any, Any, float, str], None] = _default_compare
    tol: float | None = None


@dataclass(frozen=True)
class BadCase:
    """One hostile input: ``arg`` of ``spec`` replaced by ``mutate(tensor)``."""

    spec: OpSpec
    arg: TensorArg
    kind: str
    detail: str
    mutate: Callable[[torch.Tensor], torch.Tensor]

    @property
    def id(self) -> str:
        return f"{self.spec.name}-{self.arg.name}-{self.kind}-{self.detail}"

    def inputs(self, gen: torch.Generator, device: torch.device | str = "cpu") -> dict[str, Any]:
        """Fresh inputs (drawn on the host, then moved to ``device``) with the case applied."""
        inputs = {
            k: v.to(device) if isinstance(v, torch.Tensor) else v
            for k, v in self.spec.make_inputs(gen).items()
        }
        inputs[self.arg.name] = self.mutate(inputs[self.arg.name])
        return inputs


def _with_rank(t: torch.Tensor, rank: int) -> torch.Tensor:
    if rank > t.dim():
        return t.reshape((1,) * (rank - t.dim()) + tuple(t.shape))
    if rank == 0:
        return t.reshape(-1)[0].clone()
    return t.reshape((-1, *tuple(t.shape[t.dim() - rank + 1 :])))


def _empty(t: torch.Tensor) -> torch.Tensor:
    return t.new_empty((0, *tuple(t.shape[1:])))


def _nonfinite(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().clone()
    flat = t.view(-1)
    flat[0] = float("nan")
    flat[-1] = float("inf")
    return t


def _noncontiguous(t: torch.Tensor) -> torch.Tensor:
    # the same values, every other element of a buffer twice as long in the last dimension
    wide = t.detach().unsqueeze(-1).expand(*t.shape, 2).contiguous()
    return wide[..., 0]


def _expanded(t: torch.Tensor) -> torch.Tensor:
    return t.detach()[:1].expand(t.shape)


def _index_value(value: int) -> Callable[[torch.Tensor], torch.Tensor]:
    def mutate(t: torch.Tensor) -> torch.Tensor:
        t = t.detach().clone()
        t.view(-1)[-1] = value
        return t

    return mutate


def bad_input_cases(spec: OpSpec, *, seed: int = 0) -> list[BadCase]:
    """Every standard case for every argument of ``spec`` (shapes taken from one example)."""
    example = spec.make_inputs(make_generator(seed))
    tensor_names = [a.name for a in spec.args if isinstance(example.get(a.name), torch.Tensor)]
    cases: list[BadCase] = []
    for arg in spec.args:
        t = example[arg.name]
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{spec.name}: make_inputs()['{arg.name}'] is not a tensor")

        def add(kind: str, detail: str, mutate, arg=arg) -> None:
            if kind not in arg.skip:
                cases.append(BadCase(spec, arg, kind, detail, mutate))

        ranks = arg.ranks or (t.dim(),)
        bad_ranks = [r for r in (t.dim() + 1, t.dim() - 1) if r >= 0 and r not in ranks]
        if bad_ranks and (bad_ranks[0] <= t.dim() or t.numel() > 0):
            r = bad_ranks[0]
            add("rank", str(r), lambda x, r=r: _with_rank(x, r))
        accepted = arg.dtypes or (t.dtype,)
        candidates = _INDEX_CANDIDATES if arg.index_range else (*_FLOAT_CANDIDATES, torch.int32)
        for dt in candidates:
            if dt not in accepted:
                add("dtype", str(dt).removeprefix("torch."), lambda x, dt=dt: x.detach().to(dt))
        if len(tensor_names) > 1 and t.device.type != "meta":
            add("device", "meta", lambda x: x.detach().to("meta"))
        if t.dim() >= 1 and t.shape[0] > 0:
            add("empty", "dim0", _empty)
        if t.is_floating_point() and t.numel() > 0:
            add("nonfinite", "nan_inf", _nonfinite)
        if t.dim() >= 1 and t.numel() > 1:
            add("noncontiguous", "stride2", _noncontiguous)
        if t.dim() >= 1 and t.shape[0] > 1:
            add("expanded", "stride0", _expanded)
        if arg.index_range is not None and t.numel() > 0:
            low, high = arg.index_range
            add("index_high", str(high), _index_value(high))
            add("index_low", str(low - 1), _index_value(low - 1))
    return cases


def _names(message: str, names: Sequence[str]) -> bool:
    # as a whole word: "x" must not be found inside "idx"
    return any(re.search(rf"(?<!\w){re.escape(name)}(?!\w)", message) for name in names)


def _host_reference(v: Any) -> Any:
    if not isinstance(v, torch.Tensor):
        return v
    ref = to_reference(v)[0]
    return ref if ref.device.type == "meta" else ref.cpu()


def check_bad_input(case: BadCase, *, seed: int = 0, device: torch.device | str = "cpu") -> str:
    """Run ``case`` on ``device`` (the reference runs on the host); return ``"raised"`` or
    ``"matched"``, else raise ``AssertionError`` saying why."""
    spec, name = case.spec, case.arg.name
    inputs = case.inputs(make_generator(seed), device)
    ref_inputs = {k: _host_reference(v) for k, v in inputs.items()}
    label = f"{case.id}"
    try:
        returned = spec.op(**inputs, **spec.kwargs)
    except (TypeError, ValueError) as exc:
        if not _names(str(exc), (name, *case.arg.related)):
            raise AssertionError(
                f"{label}: the error does not name the argument '{name}': "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        return "raised"
    except Exception as exc:
        raise AssertionError(
            f"{label}: expected a TypeError/ValueError naming '{name}', got "
            f"{type(exc).__name__}: {str(exc)[:300]}"
        ) from exc
    if case.kind == "device":
        raise AssertionError(f"{label}: the op accepted '{name}' on another device")
    out = spec.result(inputs, returned) if spec.result else returned
    if spec.reference is None:
        raise AssertionError(f"{label}: the op accepted the input and there is no reference")
    ref_kwargs = spec.kwargs if spec.reference_kwargs is None else spec.reference_kwargs
    try:
        ref_returned = spec.reference(**ref_inputs, **ref_kwargs)
    except Exception as exc:
        raise AssertionError(
            f"{label}: the op returned a result for an input its reference refuses "
            f"({type(exc).__name__}: {str(exc)[:200]})"
        ) from exc
    ref = spec.result(ref_inputs, ref_returned) if spec.result else ref_returned
    example_dtype = spec.make_inputs(make_generator(seed))[name].dtype
    dtype = inputs[name].dtype if inputs[name].is_floating_point() else example_dtype
    if not dtype.is_floating_point:
        dtype = torch.float32
    tol = spec.tol if spec.tol is not None else tolerance(dtype)
    if case.kind == "nonfinite":
        # which non-finite value arithmetic on inf yields (inf, or NaN from 0 * inf) depends on
        # the order of operations: ask for non-finite entries where the reference has them
        out, ref = _nan_for_nonfinite(out), _nan_for_nonfinite(ref)
        clean = {k: _host_reference(v) for k, v in spec.make_inputs(make_generator(seed)).items()}
        clean_ref = spec.reference(**clean, **ref_kwargs)
        clean_ref = spec.result(clean, clean_ref) if spec.result else clean_ref
        tol *= _shrink_factor(ref, clean_ref)
    spec.compare(out, ref, tol, label)
    return "matched"


def _shrink_factor(ref: Any, clean_ref: Any) -> float:
    """How much smaller the finite part of a non-finite case's reference is than the reference on
    the same inputs without the NaN/inf (at least 1; the largest over the outputs).

    The relative error divides by the norm of the outputs that stay finite. NaN/inf take out whole
    outputs and terms of the ones left (MaxSim adds 0 for a query token whose every similarity is
    -inf), so what is left can be a sum of a few O(1) terms that nearly cancel: the op's rounding,
    of the size of those terms, is then a large fraction of it, although the op computed what its
    dtype allows. The tolerance scaled by this factor bounds the error by the size of the outputs
    of ordinary inputs, which the per-dtype tolerances are set for; a leaked NaN/inf or a wrong
    value still fails."""
    factor = 1.0
    refs = ref if isinstance(ref, (tuple, list)) else (ref,)
    cleans = clean_ref if isinstance(clean_ref, (tuple, list)) else (clean_ref,)
    for r, c in zip(refs, cleans):
        if not (
            isinstance(r, torch.Tensor)
            and isinstance(c, torch.Tensor)
            and r.is_floating_point()
            and c.is_floating_point()
        ):
            continue
        r64 = r.detach().to(device="cpu", dtype=torch.float64)
        c64 = c.detach().to(device="cpu", dtype=torch.float64)
        left = torch.linalg.vector_norm(r64[torch.isfinite(r64)]).item()
        full = torch.linalg.vector_norm(c64[torch.isfinite(c64)]).item()
        # relative_error falls back to the absolute error when nothing finite is left
        factor = max(factor, full / left if left > 0 else full)
    return factor


def _nan_for_nonfinite(value: Any) -> Any:
    if isinstance(value, (tuple, list)):
        return type(value)(_nan_for_nonfinite(v) for v in value)
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return torch.where(torch.isfinite(value), value, torch.full_like(value, float("nan")))
    return value


def bad_input_params(spec: OpSpec, *, xfail: Mapping[str, str] | None = None) -> list:
    """``pytest.param`` objects for every case of ``spec``, with ids; ``xfail`` maps case ids to the
    reason of a known failure (strict: a case that starts passing fails the suite)."""
    import pytest

    xfail = dict(xfail or {})
    params = []
    for case in bad_input_cases(spec):
        marks = ()
        if case.id in xfail:
            marks = (pytest.mark.xfail(reason=xfail.pop(case.id), strict=True),)
        params.append(pytest.param(case, id=case.id, marks=marks))
    if xfail:
        raise ValueError(f"{spec.name}: xfail names cases that do not exist: {sorted(xfail)}")
    return params
