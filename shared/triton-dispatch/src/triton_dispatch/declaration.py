"""One op, one declaration: the routes to an op's kernels derived from a single description.

An op is declared once with :class:`OpDeclaration`: its tensor arguments (:class:`TensorSpec`:
name, dtypes, expected shape), its outputs and which of them the caller gets, what its backward
saves, its reference, its plan, and the fake implementations of its forward and backward. From that
the declaration builds

* the validation of a call (``TypeError``/``ValueError`` naming the argument and the expected
  shape or dtype, one device for every tensor) and the backend choice;
* the plan cache of eager calls: a repeat call with the same metadata binds its tensors and
  launches, through one ``torch.autograd.Function`` when a gradient will be asked for;
* the custom ops ``ns::name`` and ``ns::name_backward`` with their fakes and the autograd formula
  joining them, which ``torch.compile`` traces into (and CUDA graphs capture) without a break;
* the reference route (``backend="torch"``, CPU and MPS tensors);
* the bad-input kit's description of the arguments (:meth:`OpDeclaration.tensor_args`).

A plan is any object with ``forward(*inputs) -> tuple`` of every declared output and, for a
differentiable op, ``backward(*grads, *saved) -> tuple`` of the gradients of the differentiable
inputs (``grads``: one per returned output, ``None`` for those that got none; ``saved``: the
declared tensors, contiguous). ``plan(call)`` builds it once per kind of call from a validated
:class:`Call`: the config choice, the grid and the bound launches belong there. Arguments travel
by name in the call and in declaration order to the plan; nothing reads a tuple by position.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .backend import common_device, select_backend, uses_triton
from .launch import PlanCache, call_key

__all__ = ["Call", "OpDeclaration", "TensorSpec"]


@dataclass(frozen=True)
class TensorSpec:
    """One tensor argument.

    Attributes:
        name: the argument's name (in the custom op's schema and in every error).
        dtypes: the dtypes it may have.
        shape: the expected shape as the errors print it, e.g. ``"(T, 3, 3)"``.
        fits: ``fits(shape) -> bool``: whether a shape is one the op takes (default: any).
        contiguous: whether the kernels need it contiguous (a strided view is refused, not
            copied behind the caller's back).
        differentiable: whether the backward returns a gradient for it.
    """

    name: str
    dtypes: tuple[torch.dtype, ...]
    shape: str
    fits: Callable[[torch.Size], bool] | None = None
    contiguous: bool = False
    differentiable: bool = True

    def check(self, value: Any) -> None:
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{self.name} must be a torch.Tensor, got {type(value).__name__}")
        if value.dtype not in self.dtypes:
            allowed = " or ".join(str(d).removeprefix("torch.") for d in self.dtypes)
            raise TypeError(f"{self.name} must be {allowed}, got {value.dtype}")
        if self.fits is not None and not self.fits(value.shape):
            raise ValueError(f"{self.name} must have shape {self.shape}, got {tuple(value.shape)}")
        if self.contiguous and not value.is_contiguous():
            raise ValueError(
                f"{self.name} must be contiguous, got strides {value.stride()} for shape "
                f"{tuple(value.shape)} (call .contiguous() first)"
            )


@dataclass(frozen=True)
class Call:
    """A validated call: its tensors by name, their device and the backend that runs it."""

    tensors: Mapping[str, torch.Tensor]
    device: torch.device
    backend: str

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.tensors[name]


class OpDeclaration:
    """An op declared once; calling it validates, plans and launches (see the module docstring).

    Args:
        qualname: the custom op's name, ``"namespace::name"``; the backward registers as
            ``"namespace::name_backward"``.
        inputs: the tensor arguments, in call order.
        outputs: the names of everything the plan's forward returns, in order.
        returns: the outputs the caller gets (the others are internal, e.g. saved for the
            backward); one name returns a tensor, several a tuple.
        reference: ``reference(*inputs)`` in plain PyTorch, returning what the caller gets.
        plan: ``plan(call) -> plan object`` for the Triton backends.
        fake: ``fake(*inputs) -> tuple`` of empty outputs of the right shapes and dtypes.
        saved: the inputs and outputs the backward needs, by name (no backward if empty).
        backward_fake: ``backward_fake(*grads, *saved) -> tuple`` of empty input gradients.
        backward_plan: ``backward_plan(saved) -> plan`` from the saved tensors by name, for the
            backward op traced on its own (default: ``plan`` of the saved inputs, which must then
            include every input).
    """

    def __init__(
        self,
        qualname: str,
        *,
        inputs: Sequence[TensorSpec],
        outputs: Sequence[str],
        returns: Sequence[str],
        reference: Callable[..., Any],
        plan: Callable[[Call], Any],
        fake: Callable[..., tuple[torch.Tensor, ...]],
        saved: Sequence[str] = (),
        backward_fake: Callable[..., tuple[torch.Tensor, ...]] | None = None,
        backward_plan: Callable[[Mapping[str, torch.Tensor]], Any] | None = None,
    ) -> None:
        self.qualname = qualname
        self.inputs = tuple(inputs)
        self.outputs = tuple(outputs)
        self.returns = tuple(returns)
        self.saved = tuple(saved)
        self.reference = reference
        self.plan = plan
        self.backward_plan = backward_plan
        names = [s.name for s in self.inputs]
        unknown = (set(self.returns) | set(self.saved)) - set(names) - set(self.outputs)
        if unknown or not set(self.returns) <= set(self.outputs):
            raise ValueError(f"{qualname}: returns/saved name unknown tensors {sorted(unknown)}")
        self._returned = tuple(self.outputs.index(n) for n in self.returns)
        self._differentiable = tuple(i for i, s in enumerate(self.inputs) if s.differentiable)
        self._plans: PlanCache = PlanCache(qualname)
        self._kernel_plans: PlanCache = PlanCache(f"{qualname} kernels")
        self.op = self._register(fake, backward_fake)

    # the call
    def __call__(self, *tensors: torch.Tensor, backend: str | None = None) -> Any:
        if len(tensors) != len(self.inputs):
            raise TypeError(
                f"{self.qualname} takes {len(self.inputs)} tensors "
                f"({', '.join(s.name for s in self.inputs)}), got {len(tensors)}"
            )
        if torch.compiler.is_compiling():
            call = self.validate(tensors, backend)
            if not uses_triton(call.backend):
                return self.reference(*tensors)
            outputs = self.op(*tensors)
            return self._pick(outputs if isinstance(outputs, tuple) else (outputs,))
        key = call_key(tensors, backend, torch.is_grad_enabled(), _strides(tensors))
        if key is None:  # not a tensor where one goes: the validating path names it
            self.validate(tensors, backend)
        return self._plans.get(key, lambda: self._route(tensors, backend))(*tensors)

    def validate(self, tensors: Sequence[Any], backend: str | None = None) -> Call:
        """Check every argument against its spec and choose the backend."""
        for spec, value in zip(self.inputs, tensors, strict=True):
            spec.check(value)
        names = [s.name for s in self.inputs]
        device = common_device(tensors, names=names)
        chosen = select_backend(device=device, backend=backend)
        return Call(dict(zip(names, tensors, strict=True)), device, chosen)

    def tensor_args(self) -> list:
        """The bad-input kit's description of the arguments (:mod:`triton_dispatch.bad_inputs`)."""
        from .bad_inputs import TensorArg

        return [TensorArg(s.name, dtypes=s.dtypes) for s in self.inputs]

    def _route(self, tensors, backend) -> Callable[..., Any]:
        call = self.validate(tensors, backend)
        if not uses_triton(call.backend):
            return self.reference
        plan = self._kernel_plans.get(_meta_key(tensors), lambda: self.plan(call))
        grads = self.saved and torch.is_grad_enabled()
        if grads and any(tensors[i].requires_grad for i in self._differentiable):
            return lambda *ts: self._pick(_EagerNode.apply(self, plan, *ts))
        return lambda *ts: self._pick(_as_tuple(plan.forward(*ts)))

    def _pick(self, outputs: tuple) -> Any:
        if len(self._returned) == 1:
            return outputs[self._returned[0]]
        return tuple(outputs[i] for i in self._returned)

    def _kernel_plan(self, tensors) -> Any:
        return self._kernel_plans.get(_meta_key(tensors), lambda: self.plan(self.validate(tensors)))

    def _saved_of(self, inputs, outputs) -> list[torch.Tensor]:
        named = dict(zip([s.name for s in self.inputs], inputs))
        named.update(zip(self.outputs, outputs))
        return [named[n] for n in self.saved]

    def _backward(self, plan, grads, saved) -> tuple:
        """Gradients of every input (``None`` for the non-differentiable ones)."""
        returned = [None if g is None else g.contiguous() for g in grads]
        computed = _as_tuple(plan.backward(*returned, *(t.contiguous() for t in saved)))
        out: list[Any] = [None] * len(self.inputs)
        for i, g in zip(self._differentiable, computed, strict=True):
            out[i] = g
        return tuple(out)

    # the custom ops
    def _register(self, fake, backward_fake):
        schema_in = ", ".join(f"Tensor {s.name}" for s in self.inputs)
        decl = self

        def forward_impl(*tensors):
            return _as_returned(decl._kernel_plan(tensors).forward(*tensors))

        op = torch.library.custom_op(
            self.qualname,
            forward_impl,
            mutates_args=(),
            schema=f"({schema_in}) -> {_returns_schema(len(self.outputs))}",
        )
        op.register_fake(lambda *tensors: _as_returned(fake(*tensors)))
        if not self.saved:
            return op
        grads_in = [f"Tensor? grad_{n}" for n in self.returns]
        saved_in = [f"Tensor {n}" for n in self.saved]
        backward_schema = (
            f"({', '.join(grads_in + saved_in)}) -> {_returns_schema(len(self._differentiable))}"
        )
        n_grads = len(self.returns)

        def backward_impl(*args):
            grads, saved = args[:n_grads], args[n_grads:]
            return _as_returned(decl._kernel_plan_for_saved(saved).backward(*grads, *saved))

        backward_op = torch.library.custom_op(
            f"{self.qualname}_backward", backward_impl, mutates_args=(), schema=backward_schema
        )
        backward_op.register_fake(lambda *args: _as_returned(backward_fake(*args)))

        def setup_context(ctx, inputs, output) -> None:
            output = output if isinstance(output, tuple) else (output,)
            hidden = [output[i] for i in range(len(self.outputs)) if i not in self._returned]
            ctx.mark_non_differentiable(*hidden)
            ctx.set_materialize_grads(False)
            ctx.save_for_backward(*self._saved_of(inputs, output))

        def backward(ctx, *grads):
            wanted = [grads[i] for i in self._returned]
            if all(g is None for g in wanted):
                return (None,) * len(self.inputs)
            saved = [t.contiguous() for t in ctx.saved_tensors]
            wanted = [None if g is None else g.contiguous() for g in wanted]
            computed = backward_op(*wanted, *saved)
            computed = computed if isinstance(computed, tuple) else (computed,)
            out: list[Any] = [None] * len(self.inputs)
            for i, g in zip(self._differentiable, computed, strict=True):
                out[i] = g
            return tuple(out)

        op.register_autograd(backward, setup_context=setup_context)
        return op

    def _kernel_plan_for_saved(self, saved) -> Any:
        """The plan of a backward op call, by the saved tensors' metadata."""

        def build():
            named = dict(zip(self.saved, saved, strict=True))
            if self.backward_plan is not None:
                return self.backward_plan(named)
            inputs = [named.get(s.name) for s in self.inputs]
            if any(t is None for t in inputs):
                raise RuntimeError(
                    f"{self.qualname}: declare backward_plan, or save every input, so that the "
                    "backward op can build its plan"
                )
            return self.plan(self.validate(inputs))

        return self._kernel_plans.get(("backward", _meta_key(saved)), build)


def _returns_schema(n: int) -> str:
    return "Tensor" if n == 1 else f"({', '.join(['Tensor'] * n)})"


def _as_returned(values) -> Any:
    """A custom op's result as its schema states it: one tensor, or a tuple of several."""
    values = _as_tuple(values)
    return values[0] if len(values) == 1 else values


def _as_tuple(values) -> tuple:
    return (values,) if isinstance(values, torch.Tensor) else tuple(values)


def _strides(tensors) -> tuple | None:
    """The strides a plan binds (``None`` when an argument is not a tensor)."""
    try:
        return tuple(t.stride() for t in tensors)
    except AttributeError:
        return None


def _meta_key(tensors) -> tuple:
    return tuple((t.dtype, t.device, t.shape, t.stride()) for t in tensors)


class _EagerNode(torch.autograd.Function):
    """The declared forward and backward for eager calls, without the custom-op dispatcher (tens
    of microseconds per call)."""

    @staticmethod
    def forward(ctx, decl: OpDeclaration, plan, *inputs):
        outputs = _as_tuple(plan.forward(*inputs))
        hidden = [outputs[i] for i in range(len(outputs)) if i not in decl._returned]
        ctx.mark_non_differentiable(*hidden)
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(*decl._saved_of(inputs, outputs))
        ctx.decl, ctx.plan = decl, plan
        return outputs

    @staticmethod
    def backward(ctx, *grads):
        decl = ctx.decl
        wanted = [grads[i] for i in decl._returned]
        if all(g is None for g in wanted):
            return (None, None, *(None,) * len(decl.inputs))
        return (None, None, *decl._backward(ctx.plan, wanted, ctx.saved_tensors))
