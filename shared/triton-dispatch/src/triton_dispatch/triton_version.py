"""Which Triton release is installed, for the code that calls Triton internals.

Two pieces of this package go past Triton's public API, each for host time: :class:`KernelLaunch
<triton_dispatch.launch.KernelLaunch>` calls a compiled kernel's launcher directly (its argument
order), and :mod:`triton_dispatch.host_build` takes over the launcher builds (``_build``'s
command). Each declares the Triton releases it was written and tested against
(:data:`~triton_dispatch.launch.FAST_LAUNCH_TRITON_VERSIONS`,
:data:`~triton_dispatch.host_build.FAST_HOST_BUILD_TRITON_VERSIONS`) and, on any other release,
steps aside for Triton's public path: same results, more host time per call.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable


@functools.cache
def installed_triton_release() -> str | None:
    """``"major.minor"`` of the installed Triton (``"3.6"`` for ``3.6.0`` or ``3.6.0+git…``), or
    ``None`` when Triton is missing or its version cannot be read."""
    try:
        import triton
    except ImportError:
        return None
    match = re.match(r"(\d+)\.(\d+)", getattr(triton, "__version__", "") or "")
    return f"{match.group(1)}.{match.group(2)}" if match else None


def triton_release_in(releases: Iterable[str]) -> bool:
    """Whether the installed Triton is one of ``releases`` (``"major.minor"`` strings)."""
    release = installed_triton_release()
    return release is not None and release in tuple(releases)


__all__ = ["installed_triton_release", "triton_release_in"]
