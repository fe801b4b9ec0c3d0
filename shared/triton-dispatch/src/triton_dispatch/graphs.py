"""A whole training step (forward, backward, clipping, optimizer) replayed as one CUDA graph.

At the sizes of many training steps the GPU work is a few milliseconds or less spread over tens to
hundreds of kernels, and launching them from Python (autograd, the optimizer, the loss terms) takes
longer than running them. Capturing the step once and replaying it removes that host time. The
step keeps its semantics: every call is one real optimizer step, the first ``warmup`` calls run
eagerly (on a side stream, as capture requires, and so that autotuners, plan caches and
``torch.compile`` settle before capture), the next call captures and replays, later calls only
replay.

The step function must read its per-step inputs from tensors whose storage never changes (copy
new batches into them before each call), draw random numbers only from the default CUDA generator
or from generators passed as ``generators``, and avoid host synchronisation. Optimizers must be
capture-safe and its learning rates tensors, so that a schedule reaches the replayed step (see
:func:`prepare_optimizer_for_capture`). Tensors the step creates (its loss, outputs it stores for
the caller) live in the graph's memory: each replay overwrites them in place.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

__all__ = ["CapturedStep", "prepare_optimizer_for_capture"]


class CapturedStep:
    """Call ``step()`` as a CUDA graph after ``warmup`` eager calls; returns its loss tensor.

    Args:
        step: runs one training step and returns the loss (a tensor on the CUDA device).
        warmup: eager calls before the capture (at least 1).
        generators: CUDA ``torch.Generator`` objects the step draws from besides the default one.
    """

    def __init__(
        self,
        step: Callable[[], torch.Tensor],
        *,
        warmup: int = 3,
        generators: Sequence[torch.Generator] = (),
    ) -> None:
        if warmup < 1:
            raise ValueError(f"warmup must be >= 1, got {warmup}")
        self._step = step
        self._warmup = warmup
        self._generators = tuple(generators)
        self._calls = 0
        self._graph: torch.cuda.CUDAGraph | None = None
        self._loss: torch.Tensor | None = None

    @property
    def captured(self) -> bool:
        """Whether the step has been captured (later calls replay it)."""
        return self._graph is not None

    def __call__(self) -> torch.Tensor:
        self._calls += 1
        if self._graph is not None:
            self._graph.replay()
            return self._loss
        if self._calls <= self._warmup:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                loss = self._step()
            torch.cuda.current_stream().wait_stream(side)
            return loss
        graph = torch.cuda.CUDAGraph()
        for gen in self._generators:
            graph.register_generator_state(gen)
        with torch.cuda.graph(graph):
            self._loss = self._step()
        self._graph = graph
        # capture records the kernels without running them: this call's step is the first replay
        graph.replay()
        return self._loss


def prepare_optimizer_for_capture(optimizer: torch.optim.Optimizer) -> None:
    """Make a fused or capturable optimizer replayable: mark its groups ``capturable`` and turn
    every ``lr`` into a 0-d tensor on the parameters' device, so that schedulers update it in place
    and the replayed step reads the new value.

    Raises:
        ValueError: the optimizer already holds state on the host (a non-fused optimizer that has
            stepped), which a captured step cannot update.
    """
    for group in optimizer.param_groups:
        device = group["params"][0].device if group["params"] else torch.device("cpu")
        for p in group["params"]:
            step = optimizer.state.get(p, {}).get("step")
            if isinstance(step, torch.Tensor) and step.device != p.device:
                raise ValueError(
                    "optimizer state lives on the host: build it with fused=True or "
                    "capturable=True before its first step"
                )
        if "capturable" in group:
            group["capturable"] = True
        if not isinstance(group["lr"], torch.Tensor):
            group["lr"] = torch.tensor(float(group["lr"]), dtype=torch.float32, device=device)
