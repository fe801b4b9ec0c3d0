"""Host time of one eager call through an :class:`~triton_dispatch.declaration.OpDeclaration`
against the hand-written pattern it replaced (a plan cache keyed by the call's metadata and a small
``torch.autograd.Function``), with a plan whose forward is one tiny torch op, so that what is
timed is the dispatch, not a kernel.

    python3 tools/gpu/declaration_overhead.py [--device cpu|cuda] [--calls 10000] [--out DIR]

On CPU the Triton backend is the interpreter (``TRITON_INTERPRET=1`` is set before the import);
the plan's forward never launches a kernel, so nothing is interpreted. ``--profile`` also prints a
cProfile listing of the declaration's call with a gradient. Prints microseconds per call (best of
``--repeat`` timings) and writes ``declaration_overhead.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import timeit
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "shared" / "triton-dispatch" / "src"))


def _device_from_argv() -> str:
    for i, a in enumerate(sys.argv):
        if a == "--device" and i + 1 < len(sys.argv):
            return sys.argv[i + 1]
        if a.startswith("--device="):
            return a.split("=", 1)[1]
    return "cpu"


if _device_from_argv() == "cpu":  # the interpreter is the CPU's Triton backend (read at import)
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

from triton_dispatch.declaration import OpDeclaration, SettingSpec, TensorSpec  # noqa: E402
from triton_dispatch.launch import PlanCache, call_key  # noqa: E402


class _MulPlan:
    """``scale * a * b`` with one torch op forward and two backward."""

    def __init__(self, scale: float) -> None:
        self.scale = scale

    def forward(self, a, b):
        return torch.mul(a, b)

    def backward(self, grad, a, b):
        return grad * b, grad * a


def _two_dims(shape) -> bool:
    return len(shape) == 2


MUL = OpDeclaration(
    "declaration_overhead::mul",
    inputs=[
        TensorSpec("a", (torch.float32,), "(N, D)", fits=_two_dims, contiguous=True),
        TensorSpec("b", (torch.float32,), "(N, D)", fits=_two_dims, contiguous=True),
    ],
    settings=[SettingSpec("scale", float, 1.0)],
    outputs=("y",),
    returns=("y",),
    saved=("a", "b"),
    reference=lambda a, b, *, scale: a * b,
    plan=lambda call: _MulPlan(call["scale"]),
    fake=lambda a, b, *, scale: torch.empty_like(a),
    backward_fake=lambda grad, a, b, *, scale: (torch.empty_like(a), torch.empty_like(b)),
)


class _MulFunction(torch.autograd.Function):
    """The hand-written eager node: the plan as an argument, the inputs saved."""

    @staticmethod
    def forward(ctx, plan, a, b):
        ctx.save_for_backward(a, b)
        ctx.plan = plan
        return plan.forward(a, b)

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        return (None, *ctx.plan.backward(grad.contiguous(), a, b))


_PLANS: PlanCache = PlanCache("declaration_overhead.hand_written")


def _hand_written_plan(a, b, scale, backend):
    MUL.validate((a, b), backend, {"scale": scale})  # the old pattern validated on a miss only
    plan = _MulPlan(scale)
    if torch.is_grad_enabled() and (a.requires_grad or b.requires_grad):
        return lambda a, b: _MulFunction.apply(plan, a, b)
    return plan.forward


def hand_written(a, b, *, scale: float = 1.0, backend: str | None = None):
    """The pattern the declaration replaced: a metadata key, one dict lookup, one ``apply``."""
    if not torch.compiler.is_compiling():
        key = call_key((a, b), scale, backend, torch.is_grad_enabled())
        if key is not None:
            return _PLANS.get(key, lambda: _hand_written_plan(a, b, scale, backend))(a, b)
    raise NotImplementedError("traced calls are not timed here")


def cases(device: str) -> dict:
    def pair(grad: bool):
        return [torch.randn(4, 8, device=device, requires_grad=grad) for _ in range(2)]

    (ga, gb), (a, b) = pair(True), pair(False)
    return {
        "declaration, grad": lambda: MUL(ga, gb),
        "declaration, no grad": lambda: MUL(a, b),
        "declaration, grad, setting": lambda: MUL(ga, gb, scale=2.0),
        "hand-written, grad": lambda: hand_written(ga, gb),
        "hand-written, no grad": lambda: hand_written(a, b),
        "torch.mul alone": lambda: torch.mul(a, b),
    }


def time_us(fns: dict, calls: int, repeat: int, device: str) -> dict:
    """The best of ``repeat`` timings of each case, in µs per call; the cases take turns, so that
    a busy spell of a shared machine does not land on one of them only."""
    best = dict.fromkeys(fns, float("inf"))
    for fn in fns.values():
        for _ in range(200):
            fn()
    for _ in range(repeat):
        for name, fn in fns.items():
            best[name] = min(best[name], timeit.timeit(fn, number=calls) / calls * 1e6)
            if device == "cuda":
                torch.cuda.synchronize()
    return best


def profile_text(fn, calls: int, top: int = 25) -> str:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(top)
    return s.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--calls", type=int, default=10000)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--out", default=os.environ.get("OUT", "gpu-results"))
    parser.add_argument("--profile", action="store_true", help="print a cProfile listing too")
    args = parser.parse_args()
    all_cases = cases(args.device)
    timed = time_us(all_cases, args.calls, args.repeat, args.device)
    rows = [{"case": name, "us_per_call": us} for name, us in timed.items()]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record = {"device": args.device, "torch": torch.__version__, "rows": rows}
    (out / "declaration_overhead.json").write_text(json.dumps(record, indent=1))
    print(f"{'case':32s} {'µs/call':>8s}")
    for r in rows:
        print(f"{r['case']:32s} {r['us_per_call']:8.2f}")
    if args.profile:
        print(profile_text(all_cases["declaration, grad"], 5000))


if __name__ == "__main__":
    main()
