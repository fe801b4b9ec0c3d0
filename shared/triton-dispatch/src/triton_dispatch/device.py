"""Facts about a device that kernel launchers need, read once per device and cached."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache, lru_cache

import torch

# What the interpreter and CPU paths pretend to have: enough shared memory that pruning keeps the
# configs a Hopper GPU would keep, so CPU tests exercise the same code paths.
_HOST_SHARED_MEMORY = 232_448


@dataclass(frozen=True)
class DeviceFacts:
    """Static properties of one device.

    Attributes:
        name: the device's marketing name (``"cpu"`` for the host).
        capability: CUDA compute capability ``(major, minor)``; ``(0, 0)`` for the host.
        sm_count: streaming multiprocessors (CPU cores for the host).
        shared_memory_per_block: the most shared memory one program may use, in bytes, opt-in
            limit included (what Triton compares its kernels against).
        total_memory: device memory in bytes (0 when unknown).
        memory_bandwidth_gbs: peak device-memory bandwidth in GB/s, from the memory clock and
            bus width the driver reports (0 when unknown): what
            :mod:`triton_dispatch.cards` ranks a card without a table of its own by.
    """

    name: str
    capability: tuple[int, int]
    sm_count: int
    shared_memory_per_block: int
    total_memory: int
    memory_bandwidth_gbs: float = 0.0

    @property
    def is_hopper_or_newer(self) -> bool:
        return self.capability >= (9, 0)


@cache
def _cuda_facts(index: int) -> DeviceFacts:
    props = torch.cuda.get_device_properties(index)
    smem = getattr(props, "shared_memory_per_block_optin", 0) or 0
    if not smem:
        try:  # Triton's driver reports the opt-in limit on every torch version
            from triton.runtime import driver

            smem = int(driver.active.utils.get_device_properties(index)["max_shared_mem"])
        except Exception:
            smem = 49_152
    return DeviceFacts(
        name=props.name,
        capability=(props.major, props.minor),
        sm_count=props.multi_processor_count,
        shared_memory_per_block=int(smem),
        total_memory=int(props.total_memory),
        memory_bandwidth_gbs=_memory_bandwidth_gbs(props),
    )


def _memory_bandwidth_gbs(props) -> float:
    """Peak bandwidth from the memory clock (kHz) and bus width (bits) of ``props``; double
    data rate, so two transfers per clock (an H100 SXM: 2619 MHz, 5120 bits, 3352 GB/s)."""
    clock_khz = getattr(props, "memory_clock_rate", 0) or 0
    bus_bits = getattr(props, "memory_bus_width", 0) or 0
    return round(2 * clock_khz * 1e3 * bus_bits / 8 / 1e9, 1)


@lru_cache(maxsize=1)
def _host_facts() -> DeviceFacts:
    return DeviceFacts(
        name="cpu",
        capability=(0, 0),
        sm_count=os.cpu_count() or 1,
        shared_memory_per_block=_HOST_SHARED_MEMORY,
        total_memory=0,
    )


_simulated: DeviceFacts | None = None


@contextlib.contextmanager
def simulated_device(facts: DeviceFacts) -> Iterator[DeviceFacts]:
    """Inside the block, :func:`device_facts` answers ``facts`` for every device: the card a test
    (or the CPU check of what each supported GPU launches, :mod:`triton_dispatch.target_check`)
    stands in for, e.g. ``TARGETS[-1].facts()``, an RTX 5090's 99 KB of shared memory per block.
    One block at a time (it is process-wide)."""
    global _simulated
    before, _simulated = _simulated, facts
    try:
        yield facts
    finally:
        _simulated = before


def device_facts(device: torch.device | str | int | None = None) -> DeviceFacts:
    """Cached :class:`DeviceFacts` of ``device`` (a CUDA device, or the host for anything else).

    ``None`` means the current CUDA device when CUDA is available, else the host. Inside
    :func:`simulated_device`, the simulated card's facts whatever the device.
    """
    if _simulated is not None:
        return _simulated
    if device is None:
        device = (
            torch.device("cuda", torch.cuda.current_device())
            if torch.cuda.is_available()
            else "cpu"
        )
    if isinstance(device, int):
        device = torch.device("cuda", device)
    device = torch.device(device)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return _cuda_facts(index)
    return _host_facts()
