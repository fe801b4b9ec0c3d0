"""What a quantizer's ``load_state_dict`` accepts: each buffer's shape and dtype kind.

``nn.Module.load_state_dict`` casts dtypes silently (an integer codebook becomes floats, a float
counter is truncated) and reports a shape mismatch as a ``RuntimeError`` among others. These checks
run first and name the entry, the expected shape and what a mismatch usually means.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

#: entry -> (shape in terms of L, K, D, dtype kind)
_LAYOUT = {
    "codebook": (("L", "K", "D"), "floating"),
    "cluster_size": (("L", "K"), "floating"),
    "embed_sum": (("L", "K", "D"), "floating"),
    "steps_since_active": (("L", "K"), "integer"),
    "initialized": ((), "bool"),
}


def _kind(dtype: torch.dtype) -> str:
    if dtype == torch.bool:
        return "bool"
    if dtype.is_floating_point:
        return "floating"
    if dtype.is_complex:
        return "complex"
    return "integer"


def check_quantizer_state(
    state_dict: Mapping, prefix: str, *, levels: int, codes: int, dim: int, owner: str
) -> None:
    """Check the entries of ``state_dict`` under ``prefix`` that a quantizer owns.

    Missing and unexpected keys are left to ``load_state_dict``'s ``strict`` handling.

    Raises:
        TypeError: an entry that is not a tensor, or of the wrong dtype kind.
        ValueError: an entry of the wrong shape, or a non-finite float entry.
    """
    sizes = {"L": levels, "K": codes, "D": dim}
    for name, (dims, kind) in _LAYOUT.items():
        key = prefix + name
        if key not in state_dict:
            continue
        value = state_dict[key]
        if not isinstance(value, torch.Tensor):
            raise TypeError(
                f"{owner}: state_dict['{key}'] must be a tensor, got {type(value).__name__}"
            )
        expected = tuple(sizes[d] for d in dims)
        if tuple(value.shape) != expected:
            layout = f"({', '.join(dims)}) = {expected}" if dims else "a scalar ()"
            raise ValueError(
                f"{owner}: state_dict['{key}'] must have shape {layout} for num_levels={levels}, "
                f"codebook_size={codes}, dim={dim}; got {tuple(value.shape)} (a checkpoint of a "
                "quantizer built with other sizes?)"
            )
        if _kind(value.dtype) != kind:
            raise TypeError(
                f"{owner}: state_dict['{key}'] must have a {kind} dtype, got {value.dtype}"
            )
        if kind == "floating" and value.device.type != "meta" and not torch.isfinite(value).all():
            raise ValueError(f"{owner}: state_dict['{key}'] holds non-finite values")
