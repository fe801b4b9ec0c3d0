"""The one-nearest search as the custom op ``vq_kernels::nearest_code`` (fake included), so it
traces under ``torch.compile``; eager calls run its body directly."""

from __future__ import annotations

import torch

from triton_dispatch import uses_triton

from .reference import quantize_reference


def nearest_code_impl(
    x: torch.Tensor, codebook: torch.Tensor, metric: str, backend: str
) -> torch.Tensor:
    if x.shape[0] == 0:
        return torch.empty(0, dtype=torch.int64, device=x.device)
    if uses_triton(backend) and x.dtype != torch.float64:
        from .kernels import nearest_code

        cb = codebook.to(x.dtype)
        if x.stride(-1) != 1:
            x = x.contiguous()
        if cb.stride(-1) != 1:
            cb = cb.contiguous()
        # One launch for the per-code term; the kernel turns ‖c‖ into ‖c‖² or 1/‖c‖.
        norms = torch.linalg.vector_norm(cb, dim=-1, dtype=torch.float32)
        return nearest_code(x, cb, norms, metric)
    return quantize_reference(x, codebook.to(x.dtype), metric, 1)


nearest_code_op = torch.library.custom_op("vq_kernels::nearest_code", mutates_args=())(
    nearest_code_impl
)


@nearest_code_op.register_fake
def _(x, codebook, metric, backend):
    return x.new_empty(x.shape[0], dtype=torch.int64)
