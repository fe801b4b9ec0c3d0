"""The fast call path: launch plans cached per metadata key, and kernels launched without the
autotuner's and the JIT's per-call Python work.

A public op call does two kinds of work: work that depends only on *metadata* (argument checks,
backend choice, output shapes, tuned config, grid, constexprs) and work that needs the tensors
themselves (binding pointers, allocating outputs, launching). At the shapes a training step calls
an op with, the first kind costs more host time than the kernel takes on the GPU. An op therefore

1. computes a cheap key from its arguments' metadata (:func:`tensor_key` per tensor, plus its
   flags), and looks up a *plan* in its :class:`PlanCache`; on a miss it validates everything and
   builds the plan (a closure over the resolved metadata), which later calls reuse;
2. launches its kernels through :class:`KernelLaunch`: the first launch of a plan goes through
   Triton (autotuning, compiling), and records the compiled kernel, the tuned config and the grid;
   later launches call the compiled kernel's launcher directly, one C call.

The direct launch relies on Triton internals: the compiled kernel's ``run``/``function``/
``packed_metadata`` and the argument order of its launcher and of the C launch function behind
it (:data:`LAUNCH_ARGUMENT_ORDER`). They are not public API and change between releases, so it is
used only on the releases in :data:`FAST_LAUNCH_TRITON_VERSIONS` and only when the launcher's
Python signatures are the expected ones (:func:`fast_launch_supported`); elsewhere every launch
goes through Triton's public launcher, ``kernel[grid](*args, **meta)``, with the same results.

Correctness rules the pieces keep:

* the key holds everything a plan depends on: device (index included), dtypes, shapes, the
  contiguity of every tensor the plan views without copying, flags, the backend request, and
  whether autograd needs a graph; a tensor that is not a tensor makes the key function raise
  ``AttributeError``, which the op answers by taking its validating path;
* a :class:`KernelLaunch` keys the compiled kernel by what Triton specialises on that the plan
  cannot fix: the 16-byte alignment of each pointer, the dtype, and the ``== 1`` / ``% 16`` class of
  each per-call integer; anything new goes through Triton again;
* under ``TRITON_INTERPRET=1`` every launch goes through Triton (there is no compiled kernel), so
  the interpreter tests exercise the same plans;
* nothing here synchronises with the GPU, so plans run inside CUDA-graph capture once they are
  built; ``torch.compile`` traces the ops' registered custom ops, never these caches;
* before its first launch on a GPU a :class:`KernelLaunch` compiles its kernel without launching
  it and keeps its options within the device's shared memory per block, pipelining less deeply
  where the given ``num_stages`` do not fit (:mod:`triton_dispatch.shared_memory`); a tuned
  kernel does the same over its configs.
* a launch given a *stand-in* (another launch of the same arguments and results whose kernel
  compiles in a fraction of the time: smaller tiles, no pipelining) starts both compiles on
  background threads at its first call and runs the stand-in until its own kernel is built, so a
  first call with an empty cache waits for the quick compile only; under CUDA-graph capture it
  waits for its own kernel (a captured graph keeps what it recorded).

``TRITON_DISPATCH_PLAN_CACHE=0`` turns plan caching off (every call builds its plan), for
debugging and for tests that compare cached against uncached results.
"""

from __future__ import annotations

import concurrent.futures
import functools
import os
import weakref
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, Generic, TypeVar

import torch

from . import autotune_mode, compile_ahead, prime, triton_version
from .backend import BACKEND_ENV_VAR, interpreter_enabled
from .device import device_facts
from .shared_memory import fitting_options

#: Set to ``0`` to build every call's plan afresh (no reuse).
PLAN_CACHE_ENV_VAR = "TRITON_DISPATCH_PLAN_CACHE"

#: Triton releases (``"major.minor"``) whose launcher internals :class:`KernelLaunch` calls
#: directly: ``CompiledKernel.run(gridX, gridY, gridZ, stream, function, packed_metadata,
#: launch_metadata, enter_hook, exit_hook, *args)``, the ``CudaLauncher`` behind it and its C
#: ``launch`` (:data:`LAUNCH_ARGUMENT_ORDER`). On any other release launches go through Triton's
#: public launcher. Add a release only after ``tests/test_launch.py`` passes against it (its
#: launcher-order tests compile a kernel for ``sm_90`` on CPU and read the generated launcher).
FAST_LAUNCH_TRITON_VERSIONS: tuple[str, ...] = ("3.6",)

#: The leading parameters of the C ``launch`` function of Triton 3.6's generated CUDA launcher, as
#: its source names them, in the order :func:`_direct_launcher` passes them; the kernel's own
#: arguments follow. ``kernel_metadata`` is ``CompiledKernel.packed_metadata`` (``(num_warps,
#: num_ctas, shared)``).
LAUNCH_ARGUMENT_ORDER: tuple[str, ...] = (
    "gridX", "gridY", "gridZ", "_stream", "_function", "launch_cooperative_grid", "launch_pdl",
    "global_scratch_obj", "profile_scratch_obj", "kernel_metadata", "launch_metadata",
    "launch_enter_hook", "launch_exit_hook",
)  # fmt: skip

P = TypeVar("P")

_CACHES: weakref.WeakSet[PlanCache] = weakref.WeakSet()


def plan_cache_enabled() -> bool:
    """Whether plans are kept (``TRITON_DISPATCH_PLAN_CACHE`` is not ``0``)."""
    return os.environ.get(PLAN_CACHE_ENV_VAR, "1").strip().lower() not in (
        "0",
        "false",
        "no",
        "off",
    )


def tensor_key(t: torch.Tensor | None) -> Hashable:
    """The metadata of one tensor argument that a plan may depend on: dtype, device, shape,
    contiguity and ``requires_grad``. ``None`` stays ``None``; a non-tensor raises
    ``AttributeError`` (the op then validates and raises its own clear error)."""
    if t is None:
        return None
    return (t.dtype, t.device, t.shape, t.is_contiguous(), t.requires_grad)


def _environ_reader(name: str) -> Callable[[], Any]:
    """``read()``: the current value of the environment variable ``name`` in a form fit for a key
    (equal values read equal), for a lookup on every call. ``os.environ.get`` encodes the name and
    decodes the value each time (most of a microsecond); CPython's ``os.environ`` keeps its encoded
    contents in a dict that every assignment through ``os.environ`` updates, so the reader looks the
    encoded name up there. Elsewhere it falls back to ``os.environ.get``."""
    environ = os.environ
    data, encode = getattr(environ, "_data", None), getattr(environ, "encodekey", None)
    if isinstance(data, dict) and callable(encode):
        encoded = encode(name)
        return functools.partial(data.get, encoded)
    return functools.partial(environ.get, name)


#: The ``TRITON_DISPATCH_BACKEND`` part of a plan key (see :func:`_environ_reader`).
forced_backend_key: Callable[[], Any] = _environ_reader(BACKEND_ENV_VAR)


def call_key(tensors: Sequence[Any], *settings: Any) -> tuple | None:
    """The plan key of one call: :func:`tensor_key` of each tensor argument, the call's other
    settings (flags, backend request, ...), and the backend forced by ``TRITON_DISPATCH_BACKEND``.

    ``None`` when an argument is not what a plan can describe (a non-tensor where a tensor goes, an
    unhashable setting): the op then takes its validating path, which raises its clear error.
    """
    try:
        key = (*map(tensor_key, tensors), *settings, forced_backend_key())
        hash(key)
    except (AttributeError, TypeError):
        return None
    return key


class PlanCache(Generic[P]):
    """An op's plans by key, built on the first call with each key.

    ``get(key, build)`` is the hot path: a dict lookup. ``hits``/``misses`` count lookups (tests
    read them). Past ``maxsize`` plans the oldest is dropped, so a stream of never-repeating shapes
    cannot grow memory without bound. ``entries`` is the dict itself (cleared in place, never
    replaced), for a caller whose hot path looks a key up without a call; it counts its hits.
    """

    def __init__(self, name: str, *, maxsize: int = 256) -> None:
        self.name = name
        self.maxsize = maxsize
        self.hits = 0
        self.misses = 0
        self._plans: dict[Hashable, P] = {}
        self.entries = self._plans
        _CACHES.add(self)

    def get(self, key: Hashable, build: Callable[[], P]) -> P:
        plan = self._plans.get(key)
        if plan is not None:
            self.hits += 1
            return plan
        return self.add(key, build())

    def find(self, key: Hashable) -> P | None:
        """The plan kept for ``key`` (a hit), or ``None``; an unhashable key raises ``TypeError``.
        With :meth:`add`, the two halves of :meth:`get` for a caller that builds its plan only
        after a miss (no ``build`` closure made per call)."""
        plan = self._plans.get(key)
        if plan is not None:
            self.hits += 1
        return plan

    def add(self, key: Hashable, plan: P) -> P:
        """Keep ``plan``, just built after a miss, for ``key``; returns it."""
        self.misses += 1
        if plan_cache_enabled():
            if len(self._plans) >= self.maxsize:
                self._plans.pop(next(iter(self._plans)))
            self._plans[key] = plan
        return plan

    def clear(self) -> None:
        """Drop every plan and reset the counters."""
        self._plans.clear()
        self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._plans)

    def __repr__(self) -> str:
        return (
            f"PlanCache({self.name!r}, plans={len(self)}, hits={self.hits}, misses={self.misses})"
        )


def plan_caches() -> list[PlanCache]:
    """Every live plan cache (for tests and for clearing after a device or settings change)."""
    return sorted(_CACHES, key=lambda c: c.name)


def clear_plan_caches() -> None:
    """Clear every plan cache."""
    for cache in plan_caches():
        cache.clear()


@functools.cache
def _launcher_api_matches() -> bool:
    """Whether the Python side of Triton's launch path has the signatures the direct launch was
    written against (Triton 3.6): ``CudaLauncher.__call__(gridX, gridY, gridZ, stream, function,
    *args)``, ``JITFunction.run(*args, grid, warmup, **kwargs)`` and a ``CompiledKernel`` with
    ``run``, ``_init_handles`` and ``launch_metadata``."""
    import inspect

    try:
        from triton.backends.nvidia.driver import CudaLauncher
        from triton.compiler.compiler import CompiledKernel
        from triton.runtime.jit import JITFunction

        launcher = list(inspect.signature(CudaLauncher.__call__).parameters)
        run = inspect.signature(JITFunction.run).parameters
    except (ImportError, AttributeError, TypeError, ValueError):
        return False
    keyword_only = [n for n, p in run.items() if p.kind is inspect.Parameter.KEYWORD_ONLY]
    return (
        launcher == ["self", "gridX", "gridY", "gridZ", "stream", "function", "args"]
        and keyword_only == ["grid", "warmup"]
        and all(hasattr(CompiledKernel, n) for n in ("run", "_init_handles", "launch_metadata"))
    )


def fast_launch_supported() -> bool:
    """Whether :class:`KernelLaunch` may call compiled kernels' launchers directly: the installed
    Triton is one of :data:`FAST_LAUNCH_TRITON_VERSIONS` and its launch path has the expected
    signatures. Otherwise every launch goes through Triton's public launcher."""
    return triton_version.triton_release_in(FAST_LAUNCH_TRITON_VERSIONS) and _launcher_api_matches()


@functools.cache
def _runtime_knobs():
    # looked up once: the import and lookup cost more than the hook check itself
    from triton import knobs

    return knobs.runtime


def _launch_hooks_set() -> bool:
    """Whether a profiler hooked Triton's launches (then launches go through Triton, which feeds
    the hooks their metadata). Triton 3.6 keeps hooks in chains that are never ``None``."""
    runtime = _runtime_knobs()
    enter, leave = runtime.launch_enter_hook, runtime.launch_exit_hook
    return bool(getattr(enter, "calls", enter)) or bool(getattr(leave, "calls", leave))


def _direct_launcher(compiled) -> Callable[..., None] | None:
    """The C launch function behind a compiled kernel's launcher, when calling it directly is
    what the launcher would do anyway: no global or profile scratch to allocate per launch (Triton
    3.6's ``CudaLauncher``). ``None`` otherwise; the caller then goes through ``compiled.run``."""
    run = getattr(compiled, "run", None)
    needed = ("launch", "global_scratch_size", "profile_scratch_size", "launch_cooperative_grid",
              "launch_pdl")  # fmt: skip
    if (
        run is None
        or type(run).__name__ != "CudaLauncher"
        or not all(hasattr(run, n) for n in needed)
    ):
        return None
    if run.global_scratch_size or run.profile_scratch_size:
        return None
    launch, coop, pdl = run.launch, run.launch_cooperative_grid, run.launch_pdl
    function, metadata = compiled.function, compiled.packed_metadata

    def direct(g0, g1, g2, stream, *args):
        launch(g0, g1, g2, stream, function, coop, pdl, None, None, metadata, None, None, None,
               *args)  # fmt: skip

    return direct


def _jit_function(kernel):
    """The ``JITFunction`` under an autotuner/heuristics wrapper (or the kernel itself)."""
    from triton.runtime.autotuner import Autotuner, Heuristics

    fn = kernel
    while isinstance(fn, (Autotuner, Heuristics)):
        fn = fn.fn
    return fn


def _arg_spec(args: Sequence[Any]) -> tuple:
    """What Triton specialises a per-call argument on: a tensor's dtype and 16-byte alignment, an
    integer's ``== 1`` / ``% 16 == 0`` / 32-bit class; other values by type."""
    spec = []
    for a in args:
        if isinstance(a, torch.Tensor):
            spec.append((a.dtype, a.data_ptr() % 16 == 0))
        elif type(a) is int:
            spec.append((a == 1, a % 16 == 0, -(2**31) <= a < 2**31))
        elif a is None or type(a) is bool:
            spec.append(a)
        else:
            spec.append(type(a))
    return tuple(spec)


class KernelLaunch:
    """One Triton kernel bound to everything its plan fixes, launched with the per-call arguments.

    Args:
        kernel: a ``@triton.jit`` function, or one wrapped by ``triton.autotune``/:func:`autotune`.
        grid: a tuple, or ``grid(meta) -> tuple`` evaluated once with every bound argument and the
            tuned config (``meta["BLOCK_Q"]``, …).
        bound: values of the kernel's parameters that the plan fixes (constexprs, sizes,
            placeholder tensors never read); the remaining parameters, in declaration order, are
            the per-call arguments of :meth:`__call__`. Leave the autotuned parameters out.
        device: the plan's device; launches run on it whatever the current device is.
        options: launch options such as ``num_warps`` or ``launch_cooperative_grid``. Where the
            kernel would not fit the device's shared memory per block with the ``num_stages``
            given, the first launch lowers them until it does (``SharedMemoryError`` when even
            one stage does not fit); :attr:`options` then holds what launches.
        stand_in: a launch of the same per-call arguments that computes the same results with a
            kernel quicker to compile, run by the first calls while this one compiles on a
            background thread (only where kernels are compiled ahead; see the module notes).

    The first call with a new argument specialisation runs through Triton (autotuning and
    compiling as usual); later calls with the same specialisation call the compiled kernel's
    launcher directly. Under the interpreter, on a device other than CUDA, or with a Triton
    outside :data:`FAST_LAUNCH_TRITON_VERSIONS` (see :func:`fast_launch_supported`) every call goes
    through Triton's public launcher.
    """

    def __init__(
        self,
        kernel,
        grid: tuple[int, ...] | Callable[[Mapping[str, Any]], tuple[int, ...]],
        bound: Mapping[str, Any],
        *,
        device: torch.device,
        options: Mapping[str, Any] | None = None,
        stand_in: KernelLaunch | None = None,
    ) -> None:
        self.kernel = kernel
        jit = _jit_function(kernel)
        self.arg_names: list[str] = list(jit.arg_names)
        unknown = set(bound) - set(self.arg_names)
        if unknown:
            raise TypeError(f"{jit.__name__} has no parameters {sorted(unknown)}")
        self.bound = dict(bound)
        tuned = set().union(*(c.kwargs for c in getattr(kernel, "configs", ())))
        self.free = [n for n in self.arg_names if n not in self.bound and n not in tuned]
        self.grid = grid
        self.options = dict(options or {})
        self.device = torch.device(device)
        self.index = self.device.index if self.device.index is not None else 0
        # compiled for a GPU: launched on the plan's device, directly where this Triton allows
        self.on_gpu = self.device.type == "cuda" and not interpreter_enabled()
        self.direct = self.on_gpu and fast_launch_supported()
        self._compiled: dict[tuple, tuple] = {}
        self.direct_launches = 0
        # a tuned kernel keeps its own configs within the device's shared memory
        self._fit_checked = not self.on_gpu or hasattr(kernel, "configs")
        # runs the first calls while this launch's kernel compiles (compiled ahead only)
        self.stand_in = stand_in if self.direct else None
        self._own_compile: concurrent.futures.Future | None = None
        self.stand_in_calls = 0

    def __call__(self, *args: Any) -> None:
        if self.direct:
            entry = self._compiled.get(_arg_spec(args))
            if entry is not None and not _launch_hooks_set():
                self._launch(entry, args)
                return
            if self.stand_in is not None and self._stand_in_ran(args):
                return
        self._through_triton(args)

    def _stand_in_ran(self, args: tuple) -> bool:
        """Whether the stand-in took this call because this launch's kernel is still compiling.
        The first call starts both compiles and waits for the first of them to finish."""
        own = self._own_compile
        if own is None:
            own = self._own_compile = self.compile_ahead(*args)
            if own is None:  # compiled already, or compiling ahead is off: no stand-in
                self.stand_in = None
                return False
            quick = self.stand_in.compile_ahead(*args)
            if quick is not None:
                concurrent.futures.wait(
                    (own, quick), return_when=concurrent.futures.FIRST_COMPLETED
                )
        if own.done() or torch.cuda.is_current_stream_capturing():
            self.stand_in = None  # from here on this launch's own kernel (its compile awaited)
            return False
        stand_in = self.stand_in
        entry = stand_in._compiled.get(_arg_spec(args))
        if entry is not None and not _launch_hooks_set():
            stand_in._launch(entry, args)
        else:  # its first call: its compile is done; this launch's own one is not waited for
            stand_in._through_triton(args, wait_ahead=False)
        self.stand_in_calls += 1
        return True

    def _launch(self, entry: tuple, args: tuple) -> None:
        run, before, after, slots, (g0, g1, g2) = entry
        if slots is None:  # the per-call arguments are one run of parameters
            full = (*before, *args, *after)
        else:
            values = list(before)
            for i, a in zip(slots, args):
                values[i] = a
            full = values
        index = self.index
        if torch._C._cuda_getDevice() != index:
            with torch.cuda.device(index):
                run(g0, g1, g2, torch._C._cuda_getCurrentRawStream(index), *full)
        else:
            run(g0, g1, g2, torch._C._cuda_getCurrentRawStream(index), *full)
        self.direct_launches += 1

    @staticmethod
    def _runner(compiled) -> Callable[..., None]:
        """``run(g0, g1, g2, stream, *args)`` of a compiled kernel."""
        direct = _direct_launcher(compiled)
        if direct is not None:
            return direct
        function, metadata = compiled.function, compiled.packed_metadata

        def through_launcher(g0, g1, g2, stream, *args):
            compiled.run(g0, g1, g2, stream, function, metadata, None, None, None, *args)

        return through_launcher

    def compile_ahead(self, *args: Any) -> concurrent.futures.Future | None:
        """Start compiling this launch on a background thread, for the per-call ``args`` a later
        call will pass (tensors, or a ``torch.dtype`` in place of a tensor not made yet), so
        that the first real call finds its kernel built (:mod:`triton_dispatch.compile_ahead`);
        returns the compile's future. Does nothing (``None``) where calls are not compiled (the
        interpreter, other devices), once a call compiled, while autotuning is on, with
        ``TRITON_DISPATCH_COMPILE_AHEAD=0``, or when the same kernel is already compiling ahead."""
        self._check_count(args)
        if not self.direct or self._compiled or not compile_ahead.compile_ahead_enabled():
            return None
        package = getattr(self.kernel, "package", None)
        if package is not None and autotune_mode.autotune_enabled(package):
            return None  # its trials run on the real arguments
        # launches that differ only in arguments Triton does not specialise on share one kernel:
        # the first of them compiles it, the others would compile it again beside it
        key = self._specialization(args)
        if key is not None and not compile_ahead.claim(key):
            return None
        return compile_ahead.submit(_jit_function(self.kernel), lambda: self._compile_only(args))

    def _standins(self, args: tuple) -> tuple:
        return tuple(
            torch.empty(0, dtype=a, device=self.device) if isinstance(a, torch.dtype) else a
            for a in args
        )  # fmt: skip

    def _specialization(self, args: tuple) -> Hashable | None:
        """The key Triton's cache gives the kernel these arguments compile (a plain kernel under
        the releases the direct launch supports), or ``None`` where it cannot be read."""
        jit = self.kernel
        if _jit_function(jit) is not jit:
            return None  # a wrapper adds arguments of its own
        try:
            from triton import knobs
            from triton.runtime.driver import driver

            with torch.cuda.device(self.device):
                positional, values = self._arguments(self._standins(args))
                kwargs = {**values, **self.options}
                kwargs["debug"] = kwargs.get("debug", jit.debug) or knobs.runtime.debug
                kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
                device = driver.active.get_current_device()
                binder = jit.device_caches[device][-1]
                _, specialization, options = binder(*positional, **kwargs)
            return (id(jit), device, repr(specialization), repr(options))
        except Exception:  # internals moved: compile without the check
            return None

    def _compile_only(self, args: tuple) -> None:
        prime.wait()
        with torch.cuda.device(self.device):
            standins = self._standins(args)
            positional, values = self._arguments(standins)
            compiled = self.kernel.run(
                *positional, grid=self.grid, warmup=True, **values, **self.options
            )  # fmt: skip
            init = getattr(compiled, "_init_handles", None)
            if init is not None:  # the C launcher and the module load, off the launching thread
                init()

    def _check_count(self, args: tuple) -> None:
        if len(args) != len(self.free):
            raise TypeError(
                f"expected {len(self.free)} per-call arguments ({', '.join(self.free)}), "
                f"got {len(args)}"
            )

    def _arguments(self, args: tuple) -> tuple[list, dict]:
        values = {**dict(zip(self.free, args)), **self.bound}
        positional = []
        for name in self.arg_names:  # the leading run of known parameters, in order
            if name not in values:
                break
            positional.append(values.pop(name))
        return positional, values

    def _fit_shared_memory(self, positional: list, values: dict) -> None:
        """Before the first launch: compile without launching and keep :attr:`options` within
        the device's shared memory per block (:func:`~triton_dispatch.shared_memory.
        fitting_options`); the launch then reuses that compile."""

        def compile_only(options: Mapping[str, Any]):
            with torch.cuda.device(self.device):
                return self.kernel.run(
                    *positional, grid=self.grid, warmup=True, **values, **options
                )  # fmt: skip

        name = getattr(_jit_function(self.kernel), "__name__", "kernel")
        self.options = fitting_options(compile_only, self.options, device_facts(self.device), name)
        self._fit_checked = True

    def _through_triton(self, args: tuple, wait_ahead: bool = True) -> None:
        self._check_count(args)
        positional, values = self._arguments(args)
        grid = self.grid
        prime.wait()
        if self.direct and wait_ahead:
            compile_ahead.wait_for(_jit_function(self.kernel))
        if not self._fit_checked:
            self._fit_shared_memory(positional, values)
        if self.direct:
            with torch.cuda.device(self.device):
                compiled = self.kernel[grid](*positional, **values, **self.options)
            self._remember(compiled, args)
        elif self.on_gpu:  # Triton's public launcher, every call
            with torch.cuda.device(self.device):
                self.kernel[grid](*positional, **values, **self.options)
        else:
            self.kernel[grid](*positional, **values, **self.options)

    def _remember(self, compiled, args: tuple) -> None:
        if compiled is None or not hasattr(compiled, "packed_metadata"):
            return
        tuned = (
            getattr(self.kernel, "best_config", None) if hasattr(self.kernel, "configs") else None
        )
        meta = {**self.bound, **dict(zip(self.free, args))}
        if tuned is not None:
            meta.update({k: v for k, v in tuned.all_kwargs().items() if k in self.arg_names})
        missing = [n for n in self.arg_names if n not in meta]
        if missing:  # a parameter came from somewhere we cannot see (a heuristic): stay on Triton
            return
        grid = self.grid(meta) if callable(self.grid) else self.grid
        grid = tuple(int(g) for g in grid) + (1,) * (3 - len(grid))
        full = [meta[n] for n in self.arg_names]
        positions = [self.arg_names.index(n) for n in self.free]
        run = self._runner(compiled)
        if positions and positions == list(range(positions[0], positions[0] + len(positions))):
            lo, hi = positions[0], positions[-1] + 1
            entry = (run, tuple(full[:lo]), tuple(full[hi:]), None, grid)
        elif not positions:
            entry = (run, tuple(full), (), None, grid)
        else:
            entry = (run, full, (), positions, grid)
        self._compiled[_arg_spec(args)] = entry


__all__ = [
    "FAST_LAUNCH_TRITON_VERSIONS",
    "LAUNCH_ARGUMENT_ORDER",
    "PLAN_CACHE_ENV_VAR",
    "KernelLaunch",
    "PlanCache",
    "clear_plan_caches",
    "fast_launch_supported",
    "plan_cache_enabled",
    "plan_caches",
    "tensor_key",
]
