"""The descriptor helpers: which devices and tensors take TMA descriptors."""

import torch

from triton_dispatch.tma import aligned, tma_supported


def test_no_descriptors_off_hopper():
    assert not tma_supported(torch.device("cpu"))


def test_aligned_needs_a_16_byte_start_and_elements():
    t = torch.zeros(64, dtype=torch.float16)
    assert aligned(t)
    assert not aligned(t[1:])  # 2 bytes in
    assert aligned(t[8:])  # 16 bytes in
    assert not aligned(t[:0])
