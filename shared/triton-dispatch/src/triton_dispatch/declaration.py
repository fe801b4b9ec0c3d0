"""One op, one declaration: the routes to an op's kernels derived from a single description.

An op is declared once with :class:`OpDeclaration`: its tensor arguments (:class:`TensorSpec`:
name, dtypes, expected shape, optional or not), its settings (:class:`SettingSpec`: flags,
numbers, names of methods), its outputs and which of them the caller gets, what its backward
saves, its reference, its plan, and the fake implementations of its forward and backward. From
that the declaration builds

* the validation of a call (``TypeError``/``ValueError`` naming the argument and the expected
  shape, dtype or value; one device for every tensor) and the backend choice;
* the plan cache of eager calls: a repeat call with the same metadata and settings binds its
  tensors and launches, through one ``torch.autograd.Function`` when a gradient will be asked for;
  its key holds everything the checks read, so a repeat call skips them (a call that would fail
  them never matches a kept key);
* the custom ops ``ns::name`` and ``ns::name_backward`` with their fakes and the autograd formula
  joining them, which ``torch.compile`` traces into (and CUDA graphs capture) without a break;
* the reference route (``backend="torch"``, CPU and MPS tensors);
* the bad-input kit's description of the arguments (:meth:`OpDeclaration.tensor_args`).

A plan is any object with ``forward(*inputs) -> outputs`` (a tensor, or a tuple of every declared
output) and, for a differentiable op, ``backward(*grads, *saved) -> input grads`` (``grads``: one
per returned output, ``None`` for those that got none; ``saved``: the declared tensors,
contiguous unless declared ``keep_strides``; the result: one gradient per differentiable input,
in order, ``None`` for one nobody needs (the backward op, whose schema returns tensors, puts zeros
of ``backward_fake``'s shape there); with ``backward_needs``, a last argument ``needs`` says which
of those gradients autograd asks for). ``plan(call)`` builds it once per kind of call from a
validated :class:`Call` (tensors and settings by name): the config choice, the grid and the bound
launches belong there. Settings reach the plan through the call, never as positions in a tuple.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

import torch

from .backend import common_device, select_backend, uses_triton
from .launch import PlanCache, forced_backend_key

__all__ = ["Call", "OpDeclaration", "PassedSpec", "SettingSpec", "TensorSpec"]

_SCHEMA_TYPES = {bool: "bool", int: "int", float: "float", str: "str"}


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
        optional: whether ``None`` may stand in for it.
        differentiable: whether the backward returns a gradient for it.
        binds_strides: whether a plan may bind its strides, so that calls with other strides
            get plans of their own. ``False`` for a tensor the plan reads with each call's
            strides (or copies): calls that differ only in its strides then share one plan,
            keyed by its contiguity.
        dtypes_expected: the dtypes in words, for the error (e.g. ``"a float32 or float64
            (floating-point) tensor"``; default: the dtypes listed).
        dtype_message: the whole dtype error, with ``{name}`` and ``{dtype}`` (the given one) to
            fill in, for an op whose API has always worded it so (default: from
            ``dtypes_expected``).
        type_error: what a non-tensor or a tensor of another dtype raises: ``TypeError``, or
            ``ValueError`` for an op whose API has always refused every unusable tensor with
            ``ValueError`` (as :attr:`SettingSpec.type_error` for settings).
        default: for an optional tensor the op makes when the caller leaves it out (e.g. random
            restart candidates): ``default(call) -> make | None``, asked once per kind of call;
            ``make(**passed) -> tensor`` (see :class:`PassedSpec`) then runs on every call that
            leaves it out, before the plan, the reference or the custom op sees it, so that each
            route takes the same tensor. ``None`` from ``default``: this kind of call needs no
            tensor there and gets ``None``.
    """

    name: str
    dtypes: tuple[torch.dtype, ...]
    shape: str
    fits: Callable[[torch.Size], bool] | None = None
    contiguous: bool = False
    optional: bool = False
    differentiable: bool = True
    binds_strides: bool = True
    dtypes_expected: str = ""
    dtype_message: str = ""
    type_error: type[Exception] = TypeError
    default: Callable[[Call], Callable[..., torch.Tensor] | None] | None = None

    def check(self, value: Any) -> None:
        if value is None and self.optional:
            return
        if not isinstance(value, torch.Tensor):
            raise self.type_error(f"{self.name} must be a torch.Tensor, got {type(value).__name__}")
        if value.dtype not in self.dtypes:
            if self.dtype_message:
                raise self.type_error(self.dtype_message.format(name=self.name, dtype=value.dtype))
            allowed = self.dtypes_expected or " or ".join(
                str(d).removeprefix("torch.") for d in self.dtypes
            )
            raise self.type_error(f"{self.name} must be {allowed}, got {value.dtype}")
        if self.fits is not None and not self.fits(value.shape):
            raise ValueError(f"{self.name} must have shape {self.shape}, got {tuple(value.shape)}")
        if self.contiguous and not value.is_contiguous():
            raise ValueError(
                f"{self.name} must be contiguous, got strides {value.stride()} for shape "
                f"{tuple(value.shape)} (call .contiguous() first)"
            )

    @property
    def schema(self) -> str:
        return f"Tensor{'?' if self.optional else ''} {self.name}"


@dataclass(frozen=True)
class SettingSpec:
    """One setting: a keyword argument that is not a tensor, fixed per plan.

    Attributes:
        name: the keyword.
        kind: ``bool``, ``int``, ``float`` or ``str``.
        default: its value when the caller leaves it out.
        choices: the values it may take (default: any of ``kind``).
        valid: ``valid(value) -> bool`` for numbers with a range; ``expected`` says it in words.
        expected: what a valid value is, for the error (e.g. ``"a number in [0, 1]"``).
        type_error: what a value of another kind raises: ``TypeError``, or ``ValueError`` for
            an op whose API has always refused every unusable value with ``ValueError``.
        nullable: whether ``None`` is a value too (e.g. "no threshold", "the device decides");
            the custom op's schema then takes ``<kind>?``.
    """

    name: str
    kind: type
    default: Any
    choices: tuple | None = None
    valid: Callable[[Any], bool] | None = None
    expected: str = ""
    type_error: type[Exception] = TypeError
    nullable: bool = False

    def check(self, value: Any) -> Any:
        """The value as the op uses it (ints and float subclasses such as numpy's float64
        accepted for floats), or a clear error."""
        if value is None and self.nullable:
            return None
        kind = self.kind
        if kind is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            value = float(value)
        if type(value) is not kind:
            raise self.type_error(
                f"{self.name} must be {_article(kind.__name__)}, got {type(value).__name__}"
            )
        if self.choices is not None and value not in self.choices:
            raise ValueError(f"{self.name} must be one of {self.choices}, got {value!r}")
        if self.valid is not None and not self.valid(value):
            raise ValueError(f"{self.name} must be {self.expected or 'valid'}, got {value!r}")
        return value

    @property
    def schema(self) -> str:
        return f"{_SCHEMA_TYPES[self.kind]}{'?' if self.nullable else ''} {self.name}"


@dataclass(frozen=True)
class PassedSpec:
    """A per-call keyword argument that is neither a tensor nor a setting (a
    ``torch.Generator``, a process group): not part of the plan's key beyond ``key(value)``,
    handed on every call to the plan's forward and the reference (``forward(*inputs,
    **passed)``) and to the makers of default tensors (:attr:`TensorSpec.default`).

    Attributes:
        name: the keyword (default ``None``).
        key: what of the value the plan's key holds (default: whether it was given); the plan
            may rely on that much of it and no more.
        schema: its type in the custom op's schema (e.g. ``"str?"``), or ``""``: the custom op
            does not take it, and under ``torch.compile`` it reaches only the default makers
            (the plan inside the op gets ``None``).
        to_op, from_op: its value as the custom op takes it and back (e.g. a process group's
            name and the group of a name); default: the value itself. ``None`` stays ``None``.
    """

    name: str
    key: Callable[[Any], Any] = lambda value: value is not None
    schema: str = ""
    to_op: Callable[[Any], Any] | None = None
    from_op: Callable[[Any], Any] | None = None


@dataclass(frozen=True)
class Call:
    """A validated call: its tensors and settings by name, their device and the backend."""

    tensors: Mapping[str, torch.Tensor | None]
    settings: Mapping[str, Any]
    device: torch.device
    backend: str
    #: the per-call arguments (:class:`PassedSpec`) of the call the plan is built for: the plan
    #: may rely on what their key holds (e.g. whether a process group is given), no more
    passed: Mapping[str, Any] = field(default_factory=dict)

    def __getitem__(self, name: str) -> Any:
        if name in self.tensors:
            return self.tensors[name]
        return self.settings[name]


class OpDeclaration:
    """An op declared once; calling it validates, plans and launches (see the module docstring).

    Args:
        qualname: the custom op's name, ``"namespace::name"``; the backward registers as
            ``"namespace::name_backward"``.
        inputs: the tensor arguments, in call order.
        outputs: the names of everything the plan's forward returns, in order.
        returns: the outputs the caller gets (the others are internal, e.g. saved for the
            backward); one name returns a tensor, several a tuple.
        reference: ``reference(*inputs, **settings)`` in plain PyTorch, returning what the caller
            gets.
        plan: ``plan(call) -> plan object`` for the Triton backends, or ``None`` for a call the
            kernels do not cover (the reference then runs it).
        fake: ``fake(*inputs, **settings)``: empty outputs of the right shapes and dtypes.
        settings: the keyword settings, each part of the plan's key.
        check: ``check(call)`` raising ``ValueError``/``TypeError`` for what the specs of single
            arguments cannot say (sizes that must agree between arguments, a setting bounded by
            a size); runs after them, before the backend is used.
        saved: the inputs and outputs the backward needs, by name (no backward if empty).
        backward_fake: ``backward_fake(*grads, *saved, **settings)``: empty input gradients.
        backward_plan: ``backward_plan(named) -> plan`` from the saved tensors and the settings
            by name, for the backward op traced on its own (default: ``plan`` of the saved
            inputs, which must then include every input).
        keep_strides: saved inputs the backward gets with their own strides instead of
            contiguous: a plan built for a channels-last or strided input binds those strides,
            and a copy would be read with the wrong ones.
        backward_needs: the plan's backward takes ``needs`` after the saved tensors, one bool
            per differentiable input (does autograd ask for its gradient?), so that it can skip
            work nobody reads; the backward op and ``backward_fake`` take it as ``bool[] needs``.
        differentiable_outputs: the returned outputs that carry a gradient, the ones the
            backward takes gradients of (default: every returned output); the others reach the
            caller marked non-differentiable, like a detached by-product.
        saved_meta: inputs whose shape and dtype, not values, the backward needs (the size of a
            gradient it scatters into). Nothing holds the tensor, so it may change in place
            between forward and backward (an EMA codebook). The eager route's plan knows them
            already; the backward op takes ``SymInt[] <name>_shape, ScalarType <name>_dtype``
            after the settings, which ``backward_fake`` and ``backward_plan`` get by name too.
        grad_setting: a bool setting the declaration fills in with whether the call will be
            differentiated (grad mode on and a differentiable input requiring grad), for an op
            whose forward keeps more for its backward (the custom op gets it as a keyword, so
            that a traced call keeps it too); a value given by name stays.
        node_name: the name of the eager autograd node's class (its ``grad_fn`` is
            ``<node_name>Backward``); default: from ``qualname``.
        passed: per-call keyword arguments that are not settings (:class:`PassedSpec`), for an
            op without a backward.
        mutates: inputs the op updates in place (an EMA state): the plan's forward and the
            reference write them and return only the declared outputs. The custom op stays
            functional, so that ``torch.compile`` orders the writes like any buffer update: it
            updates copies and returns them after the outputs (an empty tensor for an input left
            out), and the traced call copies them into the caller's tensors. They are updated as
            data, outside autograd (a tensor that requires grad is written through ``detach()``).
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
        fake: Callable[..., Any],
        settings: Sequence[SettingSpec] = (),
        check: Callable[[Call], None] | None = None,
        saved: Sequence[str] = (),
        backward_fake: Callable[..., Any] | None = None,
        backward_plan: Callable[[Mapping[str, Any]], Any] | None = None,
        keep_strides: Sequence[str] = (),
        backward_needs: bool = False,
        differentiable_outputs: Sequence[str] | None = None,
        saved_meta: Sequence[str] = (),
        grad_setting: str | None = None,
        node_name: str | None = None,
        passed: Sequence[PassedSpec] = (),
        mutates: Sequence[str] = (),
    ) -> None:
        self.qualname = qualname
        self.inputs = tuple(inputs)
        self.settings = tuple(settings)
        self.outputs = tuple(outputs)
        self.returns = tuple(returns)
        self.saved = tuple(saved)
        self.reference = reference
        self.plan = plan
        self.check = check
        self.backward_plan = backward_plan
        self.backward_needs = backward_needs
        self._names = tuple(s.name for s in self.inputs)
        unknown = (set(self.returns) | set(self.saved)) - set(self._names) - set(self.outputs)
        if unknown or not set(self.returns) <= set(self.outputs):
            raise ValueError(f"{qualname}: returns/saved name unknown tensors {sorted(unknown)}")
        if self.saved and backward_fake is None:
            raise ValueError(f"{qualname}: an op with a backward needs backward_fake")
        if not set(keep_strides) <= set(self.saved) & set(self._names):
            raise ValueError(f"{qualname}: keep_strides must name saved inputs")
        self._copied = tuple(n not in keep_strides for n in self.saved)
        self._returned = tuple(self.outputs.index(n) for n in self.returns)
        graded = self.returns if differentiable_outputs is None else tuple(differentiable_outputs)
        if not set(graded) <= set(self.returns):
            raise ValueError(f"{qualname}: differentiable_outputs must name returned outputs")
        self._graded_names = graded
        self._graded = tuple(self.outputs.index(n) for n in graded)
        self.saved_meta = tuple(saved_meta)
        self._meta_inputs = tuple(
            (n, self._names.index(n)) for n in self.saved_meta if n in self._names
        )
        if len(self._meta_inputs) != len(self.saved_meta) or (saved_meta and backward_plan is None):
            raise ValueError(f"{qualname}: saved_meta must name inputs, and needs backward_plan")
        self._differentiable = tuple(i for i, s in enumerate(self.inputs) if s.differentiable)
        self._binds = tuple(s.binds_strides for s in self.inputs)
        self._strided = tuple(i for i, s in enumerate(self.inputs) if s.binds_strides)
        self._defaults = {s.name: s.default for s in self.settings}
        # where each saved tensor is in (*inputs, *outputs), and the outputs without a gradient
        both = (*self._names, *self.outputs)
        self._saved_at = tuple(
            self._names.index(n) if n in self._names else both.index(n, len(self._names))
            for n in self.saved
        )
        # the saved tensors of (*inputs, *outputs), always as a tuple
        self._saved_from = (
            itemgetter(*self._saved_at)
            if len(self._saved_at) > 1
            else lambda both, at=self._saved_at: tuple(both[i] for i in at)
        )
        self._hidden = tuple(i for i in range(len(self.outputs)) if i not in self._graded)
        # zeros for the gradients of outputs nobody differentiates would be wasted launches
        self._keep_none_grads = bool(self._hidden) or len(self.outputs) > 1
        if grad_setting is not None and self._defaults.get(grad_setting) is not False:
            raise ValueError(f"{qualname}: grad_setting must name a bool setting (default False)")
        self.grad_setting = grad_setting
        self.passed = tuple(passed)
        self._passed_names = tuple(s.name for s in self.passed)
        self._split_passed = _split_passed_function(self.passed) if self.passed else None
        if self.passed and (self.saved or grad_setting is not None):
            raise ValueError(f"{qualname}: passed arguments are for ops without a backward")
        self.mutates = tuple(mutates)
        if not set(self.mutates) <= set(self._names):
            raise ValueError(f"{qualname}: mutates must name inputs")
        self._mutated = tuple(self._names.index(n) for n in self.mutates)
        self._defaulted = tuple((i, s.default) for i, s in enumerate(self.inputs) if s.default)
        if any(not self.inputs[i].optional for i, _ in self._defaulted):
            raise ValueError(f"{qualname}: only an optional tensor may have a default")
        # the eager node of this op: the declaration rides on the class, not as an argument that
        # autograd would inspect on every call
        node_name = node_name or f"{qualname.replace('::', '_')}_node"
        self._node = type(node_name, (_EagerNode,), {"decl": self})
        self._plans: PlanCache = PlanCache(qualname)
        self._entries = self._plans.entries  # looked up in place: a hit stays in this module
        self._kernel_plans: PlanCache = PlanCache(f"{qualname} kernels")
        # the eager call's key, built straight from the tensors (see __call__)
        # whether the call will be differentiated is part of the key of an op with a backward,
        # or whose grad_setting the checks fill in with it
        tracked = self._differentiable if self.saved or grad_setting is not None else ()
        self._eager_key = _eager_key_function(self.inputs, tracked, self._defaults)
        # one index: the tensor itself; several: a tuple
        self._picker = itemgetter(*self._returned) if self._returned else (lambda outputs: ())
        self.op = self._register(fake, backward_fake)

    @property
    def plans(self) -> PlanCache:
        """The eager calls' plan cache (``hits``, ``misses``, ``clear()``), for tests and tools."""
        return self._plans

    # the call
    def __call__(self, *tensors: Any, backend: str | None = None, **settings: Any) -> Any:
        # per-call arguments (a generator, a process group) go to the entry; their keys join
        # the plan's key
        passed = keyed = None
        if self._split_passed is not None:
            passed, keyed = self._split_passed(settings)
        if torch.compiler.is_compiling():
            return self._traced(tensors, backend, settings, passed)
        # The key of an eager call holds everything its checks and its route read (each tensor's
        # dtype, device, shape and strides or contiguity, whether autograd will want a graph, the
        # settings with their types, the backend asked for and forced), so a key kept in the plan
        # cache is one whose checks passed: a hit runs its entry without checking again.
        try:
            key = self._eager_key(tensors, backend, settings, forced_backend_key(), keyed)
            entry = self._entries.get(key)
            if entry is not None:
                self._plans.hits += 1
        except (AttributeError, TypeError, ValueError):
            # not a tensor where one goes, a wrong count, an unknown or unhashable setting: the
            # checks name it
            key = entry = None
        if entry is None:
            entry = self._miss(key, tensors, backend, settings, passed)
        return entry(*tensors) if passed is None else entry(*tensors, **passed)

    def _traced(self, tensors, backend, settings, passed=None) -> Any:
        """A call under ``torch.compile``: checked every time, through the registered op."""
        self._check_count(tensors)
        call = self.validate(tensors, backend, settings, passed)
        passed = call.passed
        if self._defaulted:
            tensors = self._with_defaults(call, tensors)
        if self.mutates or passed:
            return self._traced_mutating(call, tensors)
        # an empty input is a call plans decline; tracing the reference keeps its autograd
        if not uses_triton(call.backend) or _any_empty(tensors):
            return self.reference(*tensors, **call.settings)
        return self._pick(_as_tuple(self.op(*tensors, **call.settings)))

    def _check_count(self, tensors) -> None:
        if len(tensors) != len(self.inputs):
            raise TypeError(
                f"{self.qualname} takes {len(self.inputs)} tensors "
                f"({', '.join(self._names)}), got {len(tensors)}"
            )

    def _traced_mutating(self, call: Call, tensors) -> Any:
        """A traced call of an op that updates inputs in place or takes per-call arguments: the
        functional custom op, then its updated copies written into the caller's tensors. An
        empty input goes to the op too: its plan decides (a rank of a process group with no
        rows still joins the group's collective)."""
        if not uses_triton(call.backend):
            return self.reference(*tensors, **call.settings, **call.passed)
        carried = {s.name: call.passed[s.name] for s in self.passed if s.schema}
        for s in self.passed:
            if s.to_op is not None and carried.get(s.name) is not None:
                carried[s.name] = s.to_op(carried[s.name])
        results = _as_tuple(self.op(*tensors, **call.settings, **carried))
        count = len(self.outputs)
        for i, new in zip(self._mutated, results[count:]):
            target = tensors[i]
            if target is not None:
                (target.detach() if target.requires_grad else target).copy_(new)
        return self._pick(results[:count])

    def _with_defaults(self, call: Call, tensors) -> list:
        """``tensors`` with the declared defaults made where the caller left them out."""
        tensors = list(tensors)
        for i, default in self._defaulted:
            if tensors[i] is None:
                make = default(call)
                tensors[i] = None if make is None else make(**call.passed)
        return tensors

    def _miss(self, key, tensors, backend, settings, passed=None) -> Callable[..., Any]:
        """The entry of a call no plan is kept for: checked (a bad argument raises here), built,
        and kept under ``key`` unless the key could not be made."""
        self._check_count(tensors)
        call = self.validate(tensors, backend, settings, passed)
        entry = self._entry(call, tensors)
        return entry if key is None else self._plans.add(key, entry)

    def validate(
        self,
        tensors: Sequence[Any],
        backend: str | None = None,
        settings: Mapping[str, Any] | None = None,
        passed: Mapping[str, Any] | None = None,
    ) -> Call:
        """Check every argument against its spec and choose the backend."""
        settings = dict(settings or {})
        unknown = set(settings) - set(self._defaults)
        if unknown:
            raise TypeError(f"{self.qualname} got unexpected settings {sorted(unknown)}")
        for spec, value in zip(self.inputs, tensors, strict=True):
            spec.check(value)
        values = {s.name: s.check(settings.get(s.name, s.default)) for s in self.settings}
        if self.grad_setting is not None and self.grad_setting not in settings:
            values[self.grad_setting] = torch.is_grad_enabled() and any(
                _requires_grad(tensors[i]) for i in self._differentiable
            )
        device = common_device(tensors, names=self._names)
        chosen = select_backend(device=device, backend=backend)
        call = Call(dict(zip(self._names, tensors, strict=True)), values, device, chosen)
        if self.passed:
            given = passed or {}
            call = Call(
                call.tensors, values, device, chosen, {n: given.get(n) for n in self._passed_names}
            )
        if self.check is not None:
            self.check(call)
        return call

    def plan_for(self, *tensors: Any, backend: str | None = None, **settings: Any) -> Any:
        """The kernel plan an eager call with these arguments runs, built now and kept where
        that call will find it, or ``None`` where the reference runs the call. A caller that
        knows its next calls can build their plans first and start their compiles (a plan's
        ``compile_ahead()``, where the op's plans offer one) before the first of them runs.

        Raises:
            ValueError / TypeError: what the call itself would raise for these arguments.
        """
        self._check_count(tensors)
        passed = None if self._split_passed is None else self._split_passed(settings)[0]
        call = self.validate(tensors, backend, settings, passed)
        if not uses_triton(call.backend):
            return None
        key = (_meta_key(tensors, self._binds), tuple(call.settings.values()))
        if self.passed:
            key += (self._passed_key(call.passed),)
        plan = self._kernel_plans.get(key, lambda: self.plan(call) or _REFERENCE)
        return None if plan is _REFERENCE else plan

    def tensor_args(self) -> list:
        """The bad-input kit's description of the arguments (:mod:`triton_dispatch.bad_inputs`)."""
        from .bad_inputs import TensorArg

        return [TensorArg(s.name, dtypes=s.dtypes) for s in self.inputs]

    def _entry(self, call: Call, tensors) -> Callable[..., Any]:
        """What every eager call with this call's key runs: ``entry(*tensors)`` returns what the
        caller gets."""
        plan = _REFERENCE
        if uses_triton(call.backend):
            key = (_meta_key(tensors, self._binds), tuple(call.settings.values()))
            if self.passed:
                key += (self._passed_key(call.passed),)
            plan = self._kernel_plans.get(key, lambda: self.plan(call) or _REFERENCE)
        if plan is _REFERENCE:
            entry = functools.partial(self.reference, **call.settings)
            return self._filled(call, entry) if self._defaulted else entry
        pick = self._picker
        if self.passed:
            return self._passing_entry(call, plan)
        wants_grad = bool(self.saved) and torch.is_grad_enabled()
        if wants_grad and any(_requires_grad(tensors[i]) for i in self._differentiable):
            # a node class per plan: the plan rides on the class, so apply gets only the inputs
            node = type(self._node.__name__, (self._node,), {"plan": plan})
            if len(self.outputs) == 1:  # the node returns the tensor itself
                return node.apply
            return lambda *ts: pick(node.apply(*ts))
        forward = plan.forward
        if len(self.outputs) == 1:
            return lambda *ts: _single(forward(*ts))
        return lambda *ts: pick(forward(*ts))

    def _passing_entry(self, call: Call, plan) -> Callable[..., Any]:
        """The entry of an op with per-call arguments (no backward): ``entry(*tensors,
        **passed)``."""
        finish = _single if len(self.outputs) == 1 else self._picker
        return self._filled(call, plan.forward, finish)

    def _filled(
        self, call: Call, run: Callable[..., Any], finish: Callable[[Any], Any] | None = None
    ) -> Callable[..., Any]:
        """``run`` behind the makers of the defaults this kind of call needs, its result through
        ``finish``, in one frame (a warm update is a few microseconds of host time: each layer of
        calls would show)."""
        makers = [
            (i, default(call))
            for i, default in self._defaulted
            if call.tensors[self._names[i]] is None
        ]
        makers = [(i, make) for i, make in makers if make is not None]
        if not makers:
            if finish is None:
                return run
            return lambda *tensors, **passed: finish(run(*tensors, **passed))

        def filled(*tensors, **passed):
            tensors = list(tensors)
            for i, make in makers:
                tensors[i] = make(**passed)
            out = run(*tensors, **passed)
            return out if finish is None else finish(out)

        return filled

    def _passed_key(self, passed: Mapping[str, Any]) -> tuple:
        return tuple(s.key(passed.get(s.name)) for s in self.passed)

    def _passed_from_op(self, settings: dict) -> dict:
        """The per-call arguments among a custom op call's keywords (taken out of ``settings``),
        as the plan takes them; those the op does not carry are ``None``."""
        passed = {}
        for s in self.passed:
            value = settings.pop(s.name, None) if s.schema else None
            passed[s.name] = value if s.from_op is None or value is None else s.from_op(value)
        return passed

    def _updated(self, tensors) -> tuple:
        """The mutated inputs as the custom op returns them (an empty tensor for one left out)."""
        return tuple(
            tensors[0].new_empty(0) if tensors[i] is None else tensors[i] for i in self._mutated
        )

    def _pick(self, outputs: tuple) -> Any:
        if len(self._returned) == 1:
            return outputs[self._returned[0]]
        return tuple(outputs[i] for i in self._returned)

    def _saved_of(self, inputs, outputs) -> list[torch.Tensor | None]:
        both = (*inputs, *outputs)
        return [both[i] for i in self._saved_at]

    def _input_grads(self, computed, needed: Sequence[bool]) -> tuple:
        """The plan's gradients (one per differentiable input) as one per input, ``None`` where
        autograd needs none (an input that is ``None`` or does not require grad)."""
        out: list[Any] = [None] * len(self.inputs)
        for i, g in zip(self._differentiable, _as_tuple(computed), strict=True):
            out[i] = g if needed[i] else None
        return tuple(out)

    # the custom ops
    def _register(self, fake, backward_fake):
        decl = self
        names = self._names
        keywords = [s.schema for s in self.settings]
        keywords += [f"{s.schema} {s.name}" for s in self.passed if s.schema]
        kwargs = f", *, {', '.join(keywords)}" if keywords else ""
        schema_in = ", ".join(s.schema for s in self.inputs) + kwargs
        mutated = set(self._mutated)

        def forward_impl(*tensors, **settings):
            passed = decl._passed_from_op(settings) if decl.passed else {}
            if mutated:  # the op is functional: it updates copies and returns them
                tensors = tuple(
                    t.clone() if i in mutated and t is not None else t
                    for i, t in enumerate(tensors)
                )
            plan = decl._kernel_plan(tensors, settings, passed)
            if plan is _REFERENCE:  # a call the kernels do not cover (the plan said so)
                result = _as_tuple(decl.reference(*tensors, **settings, **passed))
                if len(result) != len(decl.outputs):
                    raise RuntimeError(
                        f"{decl.qualname}: the reference returns the caller's outputs only, so "
                        "a plan of an op with internal outputs may not decline a call"
                    )
                return _as_returned((*result, *decl._updated(tensors)))
            result = plan.forward(*tensors, **passed)
            if mutated:
                return _as_returned((*_as_tuple(result), *decl._updated(tensors)))
            return _as_returned(result)

        op = torch.library.custom_op(
            self.qualname,
            forward_impl,
            mutates_args=(),
            schema=f"({schema_in}) -> {_returns_schema(len(self.outputs) + len(mutated))}",
        )
        if self.passed or mutated:
            carried = [s.name for s in self.passed if s.schema]

            def fake_impl(*tensors, **settings):
                for name in carried:
                    settings.pop(name)
                made = _as_tuple(fake(*tensors, **settings))
                updated = [torch.empty_like(t) for t in self._updated(tensors)]
                return _as_returned((*made, *updated))

            op.register_fake(fake_impl)
        else:
            op.register_fake(lambda *tensors, **settings: _as_returned(fake(*tensors, **settings)))
        if not self.saved:
            return op

        optional = {s.name for s in self.inputs if s.optional}
        grads_in = [f"Tensor? grad_{n}" for n in self._graded_names]
        saved_in = [f"Tensor{'?' if n in optional else ''} {n}" for n in self.saved]
        needs_in = ["bool[] needs"] if self.backward_needs else []
        meta_in = [f"SymInt[] {n}_shape, ScalarType {n}_dtype" for n in self.saved_meta]
        backward_kw = [s.schema for s in self.settings] + meta_in
        backward_kwargs = f", *, {', '.join(backward_kw)}" if backward_kw else ""
        backward_schema = (
            f"({', '.join(grads_in + saved_in + needs_in)}{backward_kwargs}) -> "
            f"{_returns_schema(len(self._differentiable))}"
        )
        n_grads, n_saved = len(self._graded_names), len(self.saved)

        def backward_impl(*args, **settings):
            grads, saved = args[:n_grads], args[n_grads : n_grads + n_saved]
            plan = decl._kernel_plan_for_saved(saved, settings)
            if plan is _REFERENCE:
                raise RuntimeError(
                    f"{decl.qualname}: the plan declined this call, so under torch.compile its "
                    "backward has no kernels; call the op eagerly or with backend='torch'"
                )
            computed = _as_tuple(plan.backward(*grads, *saved, *args[n_grads + n_saved :]))
            # a gradient passed through unchanged (straight-through) is one of the op's inputs,
            # which a custom op may not return
            given = [a for a in args if isinstance(a, torch.Tensor)]
            computed = tuple(g.clone() if _aliases(g, given) else g for g in computed)
            if any(g is None for g in computed):  # the schema has a tensor for each: zeros
                shapes = _as_tuple(backward_fake(*args, **settings))
                computed = tuple(
                    torch.zeros_like(f) if g is None else g for g, f in zip(computed, shapes)
                )
            return _as_returned(computed)

        backward_op = torch.library.custom_op(
            f"{self.qualname}_backward", backward_impl, mutates_args=(), schema=backward_schema
        )
        backward_op.register_fake(
            lambda *args, **settings: _as_returned(backward_fake(*args, **settings))
        )

        def setup_context(ctx, inputs, output, keyword_only_inputs=None) -> None:
            outputs = _as_tuple(output)
            hidden = [outputs[i] for i in range(len(outputs)) if i not in decl._graded]
            ctx.mark_non_differentiable(*hidden)
            ctx.set_materialize_grads(False)
            ctx.save_for_backward(*decl._saved_of(inputs[: len(names)], outputs))
            ctx.settings = dict(keyword_only_inputs or {})
            for n, i in decl._meta_inputs:
                ctx.settings[f"{n}_shape"] = tuple(inputs[i].shape)
                ctx.settings[f"{n}_dtype"] = inputs[i].dtype

        def backward(ctx, *grads):
            wanted = [grads[i] for i in decl._graded]
            if all(g is None for g in wanted):
                return (None,) * len(names)
            saved = decl._for_backward(ctx.saved_tensors)
            wanted = [None if g is None else g.contiguous() for g in wanted]
            needs = decl._needs(ctx.needs_input_grad)
            computed = backward_op(*wanted, *saved, *needs, **ctx.settings)
            return decl._input_grads(computed, ctx.needs_input_grad)

        op.register_autograd(backward, setup_context=setup_context)
        return op

    def _for_backward(self, saved) -> list[torch.Tensor | None]:
        return [t if t is None or not c else t.contiguous() for t, c in zip(saved, self._copied)]

    def _needs(self, needs_input_grad) -> tuple:
        """The plan's ``needs`` argument (with ``backward_needs``), else nothing."""
        if not self.backward_needs:
            return ()
        return ([bool(needs_input_grad[i]) for i in self._differentiable],)

    def _kernel_plan(self, tensors, settings, passed=None) -> Any:
        def build():
            return self.plan(self.validate(tensors, None, settings, passed)) or _REFERENCE

        key = (_meta_key(tensors, self._binds), tuple(settings.values()))
        if self.passed:
            key += (self._passed_key(passed or {}),)
        return self._kernel_plans.get(key, build)

    def _kernel_plan_for_saved(self, saved, settings) -> Any:
        """The plan of a backward op call, by the saved tensors' metadata and the settings."""

        def build():
            named = {**settings, **dict(zip(self.saved, saved, strict=True))}
            if self.backward_plan is not None:
                return self.backward_plan(named) or _REFERENCE
            inputs = [named.get(s.name) for s in self.inputs]
            if any(t is None for s, t in zip(self.inputs, inputs) if not s.optional):
                raise RuntimeError(
                    f"{self.qualname}: declare backward_plan, or save every input, so that the "
                    "backward op can build its plan"
                )
            return self.plan(self.validate(inputs, None, settings)) or _REFERENCE

        values = tuple(tuple(v) if isinstance(v, list) else v for v in settings.values())
        key = ("backward", _meta_key(saved), values)
        return self._kernel_plans.get(key, build)


#: What a plan cache holds for a call whose ``plan(call)`` returned ``None``: the kernels do not
#: cover it (an empty input, a size past the kernels' index range), so the reference runs it.
_REFERENCE = object()


def _article(word: str) -> str:
    return f"{'an' if word[0] in 'aeiou' else 'a'} {word}"


def _returns_schema(n: int) -> str:
    return "Tensor" if n == 1 else f"({', '.join(['Tensor'] * n)})"


def _as_tuple(values) -> tuple:
    return (values,) if values is None or isinstance(values, torch.Tensor) else tuple(values)


def _as_returned(values) -> Any:
    """A custom op's result as its schema states it: one tensor, or a tuple of several."""
    values = _as_tuple(values)
    return values[0] if len(values) == 1 else values


def _aliases(t, others) -> bool:
    """Whether tensor ``t`` shares memory with one of ``others``."""
    if t is None:
        return False
    ptr = t.untyped_storage().data_ptr()
    return any(o.untyped_storage().data_ptr() == ptr for o in others)


def _any_empty(tensors) -> bool:
    return any(t is not None and t.numel() == 0 for t in tensors)


def _requires_grad(t) -> bool:
    return isinstance(t, torch.Tensor) and t.requires_grad


def _single(value) -> Any:
    """The one output of a plan's forward that returned it alone or in a tuple."""
    return value[0] if isinstance(value, (tuple, list)) else value


def _eager_key_function(
    inputs: Sequence[TensorSpec], tracked: Sequence[int], defaults: Mapping[str, Any]
) -> Callable[..., tuple]:
    """``key(tensors, backend, settings, forced, passed_keys) -> tuple``, the eager plan key of a
    call, written out for these inputs and settings (a loop over specs would cost more than the
    lookup it serves): each tensor's dtype, device, shape and strides (its contiguity where the
    plan binds no strides; one ``None`` for an optional tensor left out), then, for an op with a
    backward, whether grad mode is on and an input at ``tracked`` requires grad, then each
    setting's value (its default where not given) and type (``True`` equals ``1`` and ``1.0``
    but is no number), then the other parts as given.

    Raises ``AttributeError`` for a non-tensor where a tensor goes, ``ValueError`` for a wrong
    number of tensors and ``TypeError`` for a keyword that is not a setting."""
    names = [f"t{i}" for i in range(len(inputs))]
    fields = []
    for t, spec in zip(names, inputs):
        layout = f"{t}.stride()" if spec.binds_strides else f"{t}.is_contiguous()"
        meta = f"{t}.dtype, {t}.device, {t}.shape, {layout}"
        fields.append(f"None if {t} is None else ({meta})" if spec.optional else meta)
    if tracked:
        wants = " or ".join(
            f"({names[i]} is not None and {names[i]}.requires_grad)"
            if inputs[i].optional
            else f"{names[i]}.requires_grad"
            for i in tracked
        )
        fields.append(f"grad_enabled() and ({wants})")
    values = [f"v{i}" for i in range(len(defaults))]
    fields = [f"({f})" for f in fields] + [f"{v}, type({v})" for v in values]
    fields += ["backend", "forced", "passed_keys"]
    source = (
        "def key(tensors, backend, settings, forced, passed_keys):\n"
        f"    [{', '.join(names)}] = tensors\n"
        "    if settings and not settings.keys() <= setting_names:\n"
        "        raise TypeError('unknown setting')\n"
        + "".join(
            f"    {v} = settings.get({n!r}, default{i})\n"
            for i, (v, n) in enumerate(zip(values, defaults))
        )
        + f"    return ({', '.join(fields)})\n"
    )
    namespace: dict[str, Any] = {
        "grad_enabled": torch.is_grad_enabled,
        "setting_names": frozenset(defaults),
        **{f"default{i}": d for i, d in enumerate(defaults.values())},
    }
    exec(compile(source, "<eager plan key>", "exec"), namespace)
    return namespace["key"]


def _split_passed_function(passed: Sequence[PassedSpec]) -> Callable[[dict], tuple]:
    """``split(settings) -> (passed, keys)``: the per-call arguments taken out of a call's
    keywords (``None`` where not given) and what of each the plan's key holds, written out for
    these arguments (a loop over the specs would cost more than it saves)."""
    names = [s.name for s in passed]
    values = [f"v{i}" for i in range(len(names))]
    source = (
        "def split(settings):\n"
        + "".join(f"    {v} = settings.pop({n!r}, None)\n" for v, n in zip(values, names))
        + f"    return {{{', '.join(f'{n!r}: {v}' for n, v in zip(names, values))}}}, "
        + f"({''.join(f'key{i}({v}), ' for i, v in enumerate(values))})\n"
    )
    namespace: dict[str, Any] = {f"key{i}": s.key for i, s in enumerate(passed)}
    exec(compile(source, "<passed arguments>", "exec"), namespace)
    return namespace["split"]


def _meta_key(tensors, binds: Sequence[bool] | None = None) -> tuple:
    """Dtype, device, shape and strides of each tensor (its contiguity where ``binds`` says the
    plan does not bind its strides)."""
    return tuple(
        None
        if t is None
        else (
            t.dtype,
            t.device,
            t.shape,
            t.stride() if binds is None or binds[i] else t.is_contiguous(),
        )
        for i, t in enumerate(tensors)
    )


class _EagerNode(torch.autograd.Function):
    """The declared forward and backward for eager calls, without the custom-op dispatcher (tens
    of microseconds per call); each declaration subclasses it with ``decl`` set."""

    decl: OpDeclaration
    plan: Any

    @classmethod
    def forward(cls, ctx, *inputs):
        decl = cls.decl
        outputs = cls.plan.forward(*inputs)
        if isinstance(outputs, torch.Tensor):
            outputs = (outputs,)
        if decl._hidden:
            ctx.mark_non_differentiable(*[outputs[i] for i in decl._hidden])
        if decl._keep_none_grads:
            ctx.set_materialize_grads(False)
        ctx.save_for_backward(*decl._saved_from(inputs + tuple(outputs)))
        return outputs if len(outputs) > 1 else outputs[0]

    @classmethod
    def backward(cls, ctx, *grads):
        decl = cls.decl
        wanted = [grads[i] for i in decl._graded]
        if all(g is None for g in wanted):
            return (None,) * len(decl.inputs)
        saved = decl._for_backward(ctx.saved_tensors)
        wanted = [None if g is None else g.contiguous() for g in wanted]
        needs = decl._needs(ctx.needs_input_grad)
        computed = cls.plan.backward(*wanted, *saved, *needs)
        return decl._input_grads(computed, ctx.needs_input_grad)
