"""Comparison with a float64 reference: per-dtype tolerances, the relative error, and the value
and gradient parity of an op with its reference."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from .inputs import randn

#: Relative-error thresholds by the dtype the op computed in (inputs' or outputs' dtype).
#: fp32 assumes IEEE fp32 products with fp32 accumulation; ops that use TF32 pass ``tol=``.
DEFAULT_TOLERANCES: dict[torch.dtype, float] = {
    torch.float64: 1e-10,
    torch.float32: 1e-5,
    torch.float16: 2e-3,
    torch.bfloat16: 1.6e-2,
}


def tolerance(dtype: torch.dtype) -> float:
    """The default relative-error threshold for results computed from ``dtype`` inputs."""
    try:
        return DEFAULT_TOLERANCES[dtype]
    except KeyError:
        raise TypeError(f"no default tolerance for dtype {dtype}; pass tol=") from None


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """``‖out − ref‖₂ / ‖ref‖₂`` computed in float64.

    NaN and ±inf must sit at the same positions in both (else the error is ``inf``); the norm is taken
    over the finite rest. When ``ref`` is all zeros the absolute error ``‖out‖₂`` is returned, so an
    exact-zero reference still demands an exact-zero output.
    """
    if out.shape != ref.shape:
        raise AssertionError(
            f"shape mismatch: output {tuple(out.shape)} vs reference {tuple(ref.shape)}"
        )
    o = out.detach().to(device="cpu", dtype=torch.float64)
    r = ref.detach().to(device="cpu", dtype=torch.float64)
    if o.numel() == 0:
        return 0.0
    if not torch.equal(torch.isnan(o), torch.isnan(r)):
        return float("inf")
    o_inf, r_inf = torch.isinf(o), torch.isinf(r)
    if not torch.equal(o_inf, r_inf) or not torch.equal(o[o_inf], r[r_inf]):
        return float("inf")
    finite = torch.isfinite(r)
    diff = torch.linalg.vector_norm(o[finite] - r[finite]).item()
    scale = torch.linalg.vector_norm(r[finite]).item()
    return diff / scale if scale > 0 else diff


def assert_close(
    out: torch.Tensor,
    ref: torch.Tensor,
    *,
    dtype: torch.dtype | None = None,
    tol: float | None = None,
    name: str = "output",
) -> float:
    """Assert ``relative_error(out, ref) <= tol`` and return the error.

    ``tol`` defaults to :func:`tolerance` of ``dtype`` (default: ``out``'s dtype).
    """
    limit = tol if tol is not None else tolerance(dtype or out.dtype)
    err = relative_error(out, ref)
    if not err <= limit:  # also catches NaN
        raise AssertionError(
            f"{name}: relative error {err:.3e} exceeds {limit:.1e} "
            f"(shape {tuple(out.shape)}, {out.dtype} vs float64 reference)"
        )
    return err


def to_reference(*tensors: torch.Tensor | None) -> list[torch.Tensor | None]:
    """Detached float64 copies of float tensors (others cloned as-is), keeping ``requires_grad``."""
    out: list[torch.Tensor | None] = []
    for t in tensors:
        if t is None:
            out.append(None)
        elif t.is_floating_point():
            out.append(t.detach().to(torch.float64).requires_grad_(t.requires_grad))
        else:
            out.append(t.detach().clone())
    return out


def _as_tuple(x: Any) -> tuple[torch.Tensor, ...]:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def assert_gradients_match(
    fn: Callable[..., Any],
    reference_fn: Callable[..., Any],
    inputs: Sequence[torch.Tensor | None],
    *,
    tol: float | None = None,
    grad_tol: float | None = None,
    generator: torch.Generator | None = None,
    names: Sequence[str] | None = None,
) -> dict[str, float]:
    """Values and gradients of ``fn`` vs ``reference_fn`` evaluated in float64.

    ``fn(*inputs)`` runs on the given inputs; ``reference_fn`` on float64 copies. Both backpropagate
    the same random upstream gradient. Every input with ``requires_grad`` has its gradient compared
    by relative error. Returns the errors by name.
    """
    names = list(names) if names is not None else [f"input{i}" for i in range(len(inputs))]
    ref_inputs = to_reference(*inputs)
    outs = _as_tuple(fn(*inputs))
    refs = _as_tuple(reference_fn(*ref_inputs))
    if len(outs) != len(refs):
        raise AssertionError(f"fn returned {len(outs)} outputs, reference {len(refs)}")
    errors: dict[str, float] = {}
    value_dtype = next(
        (t.dtype for t in inputs if t is not None and t.is_floating_point()), outs[0].dtype
    )
    for i, (o, r) in enumerate(zip(outs, refs)):
        errors[f"out{i}"] = assert_close(o, r, dtype=value_dtype, tol=tol, name=f"output {i}")

    diff = [(o, r) for o, r in zip(outs, refs) if o.requires_grad]
    if not diff:
        return errors
    upstream = [randn(o.shape, generator=generator, dtype=torch.float64) for o, _ in diff]
    torch.autograd.backward(
        [o for o, _ in diff], [g.to(o.device, o.dtype) for g, (o, _) in zip(upstream, diff)]
    )
    torch.autograd.backward(
        [r for _, r in diff], [g.to(r.device) for g, (_, r) in zip(upstream, diff)]
    )
    for name, x, xr in zip(names, inputs, ref_inputs):
        if x is None or not x.requires_grad:
            continue
        if x.grad is None:
            raise AssertionError(f"gradient of {name}: the op returned no gradient")
        errors[f"grad_{name}"] = assert_close(
            x.grad,
            xr.grad if xr.grad is not None else torch.zeros_like(xr),
            dtype=x.dtype,
            tol=grad_tol if grad_tol is not None else tol,
            name=f"gradient of {name}",
        )
    return errors


def errors_table(errors: Mapping[str, float]) -> str:
    return ", ".join(f"{k}={v:.2e}" for k, v in errors.items())
