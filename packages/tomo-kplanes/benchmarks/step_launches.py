"""What one eager training step of ``training_step.py`` launches, by part of the step.

The folded fused step (``make_step(..., fused=True, fold=True)`` with fused Adam) is bound by the
host launching its kernels, not by the GPU. This script runs it and counts, per part (tap
sampling, field forward, volume TV, plane TV, loss assembly, backward, optimizer):

* ``aten``: aten ops dispatched that launch work on a GPU (forward and backward; views,
  allocations and the custom ops' wrappers are not counted, the ops inside a custom op are);
* ``triton``: launches of the package's Triton kernels;
* ``sync``: ops that wait for the device (``.item()`` and the like; the step should have none).

It runs on the host with the Triton kernels in the interpreter (``TRITON_INTERPRET=1`` is set when
no CUDA device is present), at a small size: the counts do not depend on the size. On CUDA it also
counts the launches the device sees (``torch.profiler``: the runtime's launch calls per part, which
includes the kernels of ``torch.compile``d pieces that the dispatch count cannot see) and the wall
time per step of back-to-back steps (one synchronize at the end).

    python3 packages/tomo-kplanes/benchmarks/step_launches.py [--device cpu] [--quick] [--ops]
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from contextlib import ExitStack, contextmanager
from pathlib import Path

import torch

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before anything imports triton

sys.path.insert(0, str(Path(__file__).resolve().parent))

from torch.utils._python_dispatch import TorchDispatchMode
from training_step import make_step

from tomo_kplanes import objective
from tomo_kplanes.model import KPlanesTilted
from tomo_kplanes.objective import TomographyObject
from tomo_kplanes.ops.plane_tv.kernels import PlaneTVPlan
from triton_dispatch.bench import (
    BenchRecord,
    benchmark_arguments,
    environment,
    report,
    wall_ms_per_call,
)

PARTS = (
    "tap sampling", "field forward", "volume TV", "plane TV", "loss assembly", "backward",
    "optimizer",
)  # fmt: skip
#: where each part starts: (owner, attribute) whose calls belong to the part; everything else
#: inside the step is loss assembly (the data term and the sum of the terms; since the loss was
#: fused, ``ray_loss``, which also holds the constraints and the volume TV)
PART_ENTRIES = {
    "tap sampling": [(TomographyObject, "sample_tv_tap_coords")],
    "field forward": [
        (TomographyObject, "raw_densities_with_taps"),
        (TomographyObject, "forward_with_tv_taps"),
        (TomographyObject, "densities"),
        (TomographyObject, "raw_densities"),
    ],
    "volume TV": [(objective, "volume_tv_loss")],
    # the plane TV's own launches, also where the field call takes it with the features
    "plane TV": [(KPlanesTilted, "plane_tv"), (PlaneTVPlan, "forward")],
    "backward": [(torch.Tensor, "backward")],
    "optimizer": [(torch.optim.Optimizer, "zero_grad"), (torch.optim.Adam, "step")],
}
#: ops that launch nothing: allocations and aliasing
_NO_KERNEL = {
    "aten::empty", "aten::empty_strided", "aten::empty_like", "aten::new_empty",
    "aten::new_empty_strided", "aten::detach", "aten::alias", "aten::lift_fresh",
    "aten::_unsafe_view", "aten::_reshape_alias", "aten::resize_", "aten::set_",
}  # fmt: skip
#: ops that wait for the device
_SYNC = {"aten::_local_scalar_dense", "aten::is_nonzero", "aten::equal", "aten::nonzero"}
#: (part) -> launches seen by the runtime on CUDA, filled by the profiler pass
_RUNTIME_LAUNCHES = (
    "cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
    "cudaMemsetAsync", "cudaMemcpyAsync", "cudaGraphLaunch",
)  # fmt: skip


class Tally:
    """Counts by part: ``kinds[part][kind]`` and ``ops[part][name]``."""

    def __init__(self) -> None:
        self.part = "loss assembly"
        self.kinds: dict[str, Counter] = {p: Counter() for p in PARTS}
        self.ops: dict[str, Counter] = {p: Counter() for p in PARTS}
        self.active = False

    def add(self, kind: str, name: str) -> None:
        if self.active:
            self.kinds[self.part][kind] += 1
            self.ops[self.part][f"{kind}: {name}"] += 1


def _op_kind(func) -> str:
    name = func._schema.name
    if name.startswith("profiler::"):
        return "free"
    if not name.startswith("aten::"):
        return "custom"
    if name in _SYNC:
        return "sync"
    if name in _NO_KERNEL or func.is_view:
        return "free"
    return "aten"


def _python_impl(func):
    """The Python body of a ``torch.library.custom_op`` (so the ops inside it are seen)."""
    from torch._library.custom_ops import OPDEFS

    opdef = OPDEFS.get(func._schema.name)
    return None if opdef is None else opdef._init_fn


class OpCounter(TorchDispatchMode):
    """Counts every op dispatched below autograd into a :class:`Tally`."""

    def __init__(self, tally: Tally) -> None:
        super().__init__()
        self.tally = tally

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        kind = _op_kind(func)
        self.tally.add(kind, func._schema.name)
        if kind == "custom":
            impl = _python_impl(func)
            if impl is not None:
                with OpCounter(self.tally):
                    return impl(*args, **kwargs)
        return func(*args, **kwargs)


@contextmanager
def _patched(owner, attr: str, wrapper_of):
    original = (
        owner.__dict__[attr] if attr in getattr(owner, "__dict__", {}) else getattr(owner, attr)
    )
    setattr(owner, attr, wrapper_of(original))
    try:
        yield
    finally:
        setattr(owner, attr, original)


@contextmanager
def parts(tally: Tally, *, ranges: bool = False):
    """Attribute what runs inside each part's entry points to that part (innermost wins); with
    ``ranges`` also open a ``torch.profiler.record_function`` range ``part::NAME`` around each."""

    def wrapper_of(label):
        def wrap(fn):
            def inner(*args, **kwargs):
                outer, tally.part = tally.part, label
                try:
                    if ranges:
                        with torch.profiler.record_function(f"part::{label}"):
                            return fn(*args, **kwargs)
                    return fn(*args, **kwargs)
                finally:
                    tally.part = outer

            return inner

        return wrap

    with ExitStack() as stack:
        for label, entries in PART_ENTRIES.items():
            for owner, attr in entries:
                stack.enter_context(_patched(owner, attr, wrapper_of(label)))
        yield


@contextmanager
def triton_launches(tally: Tally):
    """Count launches of Triton kernels (compiled, interpreted, or through a cached plan)."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    def counting(run):
        def inner(self, *args, **kwargs):
            tally.add("triton", getattr(self, "__name__", None) or self.fn.__name__)
            # the interpreter's own copies of the arguments are not the step's work
            active, tally.active = tally.active, False
            try:
                return run(self, *args, **kwargs)
            finally:
                tally.active = active

        return inner

    with ExitStack() as stack:
        stack.enter_context(_patched(JITFunction, "run", counting))
        stack.enter_context(_patched(InterpretedFunction, "run", counting))
        try:
            from triton_dispatch.launch import KernelLaunch
        except ImportError:
            pass
        else:

            def counting_direct(launch):
                def inner(self, entry, args):
                    tally.add("triton", _kernel_name(self.kernel))
                    return launch(self, entry, args)

                return inner

            stack.enter_context(_patched(KernelLaunch, "_launch", counting_direct))
        yield


def _kernel_name(kernel) -> str:
    fn = kernel
    while hasattr(fn, "fn"):
        fn = fn.fn
    return getattr(fn, "__name__", repr(fn))


def count_step(step, steps: int) -> Tally:
    """Per-step counts of ``steps`` calls of ``step`` (already warmed up)."""
    tally = Tally()
    with parts(tally), triton_launches(tally), OpCounter(tally):
        tally.active = True
        for _ in range(steps):
            tally.part = "loss assembly"
            step()
        tally.active = False
    for part in PARTS:
        for counter in (tally.kinds[part], tally.ops[part]):
            for key in counter:
                counter[key] = counter[key] / steps
    return tally


def profile_cuda_launches(step, steps: int) -> dict[str, float]:
    """Per-step launch calls the CUDA runtime sees, by part (``torch.profiler``)."""
    from torch.profiler import ProfilerActivity, profile

    tally = Tally()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        with parts(tally, ranges=True):
            for _ in range(steps):
                with torch.profiler.record_function("part::loss assembly"):
                    step()
        torch.cuda.synchronize()
    events = list(prof.events())
    ranges = [
        (e.time_range.start, e.time_range.end, e.name.removeprefix("part::"))
        for e in events
        if e.name.startswith("part::")
    ]
    counts = Counter()
    for e in events:
        if not e.name.startswith(_RUNTIME_LAUNCHES):
            continue
        start = e.time_range.start
        inside = [r for r in ranges if r[0] <= start <= r[1]]
        # innermost range: the one that started last
        part = max(inside, key=lambda r: r[0])[2] if inside else "outside the step"
        counts[part] += 1
    counts["device kernels"] = sum(
        1 for e in events if e.device_type == torch.autograd.DeviceType.CUDA
    )
    return {k: v / steps for k, v in counts.items()}


def format_counts(tally: Tally, device_launches: dict[str, float] | None) -> str:
    head = ["part", "aten", "triton", "sync", "total"]
    if device_launches is not None:
        head.append("CUDA launches")
    rows = [head]
    totals = Counter()
    for part in PARTS:
        k = tally.kinds[part]
        row = [
            part,
            *(f"{k[x]:g}" for x in ("aten", "triton", "sync")),
            f"{k['aten'] + k['triton']:g}",
        ]
        if device_launches is not None:
            row.append(f"{device_launches.get(part, 0):g}")
        rows.append(row)
        totals.update(k)
    row = ["step", *(f"{totals[x]:g}" for x in ("aten", "triton", "sync"))]
    row.append(f"{totals['aten'] + totals['triton']:g}")
    if device_launches is not None:
        row.append(f"{sum(v for p, v in device_launches.items() if p in PARTS):g}")
    rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = [
        "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
        for r in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main() -> None:
    parser = benchmark_arguments(__doc__)
    parser.add_argument(
        "--steps", type=int, default=3, help="counted steps (after 2 warm-up steps)"
    )
    parser.add_argument("--ops", action="store_true", help="list the counted ops of each part")
    args = parser.parse_args()
    device = torch.device(args.device)
    on_cuda = device.type == "cuda"
    # the interpreter runs a program instance at a time: a small step on the host; the counts do
    # not depend on the size
    small = args.quick or not on_cuda
    cfg = (16, 4, 2, 16, 8, 64) if small else (200, 32, 4, 1024, 200, 10_000)
    res, c, t, rays, samples, tv = cfg
    shape = {"res": res, "C": c, "T": t, "rays": rays, "samples": samples, "tv_points": tv}
    step = make_step(*cfg, fused=True, fold=True, device=device, fused_adam=True)
    for _ in range(2):  # autotuning, compiling, optimizer state
        step()
    tally = count_step(step, args.steps)
    launches = profile_cuda_launches(step, args.steps) if on_cuda else None
    wall = (
        wall_ms_per_call(step, device=device, calls=50 if on_cuda else 3, warmup=3)
        if on_cuda
        else None
    )
    print(f"eager step, folded taps, fused op, fused Adam; {shape}; on {device}"
          + ("" if on_cuda else " (Triton interpreter)"))  # fmt: skip
    print(format_counts(tally, launches))
    if launches is not None:
        print(f"device kernels per step (profiler): {launches.get('device kernels', 0):g}")
    if args.ops:
        for part in PARTS:
            print(f"\n{part}:")
            for name, n in sorted(tally.ops[part].items()):
                print(f"  {n:g} × {name}")
    per_part = {p: {k: tally.kinds[p][k] for k in ("aten", "triton", "sync")} for p in PARTS}
    total = sum(tally.kinds[p]["aten"] + tally.kinds[p]["triton"] for p in PARTS)
    record = BenchRecord(
        name="eager step launches", shape=shape, baseline="-", baseline_ms=None,
        ours_ms=None, ours_wall_ms=wall, env=environment(device),
        extra={"launches": total, "by_part": per_part, "cuda_launches": launches},
    )  # fmt: skip
    if wall is not None:
        print(f"wall time per step: {wall:.3f} ms")
    report([record], args.out, meta={"script": "step_launches.py", "quick": args.quick})


if __name__ == "__main__":
    main()
