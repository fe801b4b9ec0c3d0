"""Electron-tomography reconstruction with a rotated K-Planes (TILTED) field and fused Triton plane interpolation."""

from importlib.metadata import PackageNotFoundError, version

from .geometry import TiltGeometry, project_volume, tilt_range
from .graphed import CapturedStep, prepare_optimizer_for_capture
from .metrics import psnr, ssim
from .model import KPlanes, KPlanesTilted
from .objective import (
    DensityConstraints,
    LossWeights,
    ReconstructionContext,
    TomographyObject,
    reconstruction_loss,
)
from .ops import tilted_plane_features
from .phantoms import nanoparticle_phantom, shepp_logan_3d, simulate_tilt_series
from .rotations import project_to_so3
from .sirt import sirt
from .train import (
    CollapsedReconstructionWarning,
    ReconstructionConfig,
    ReconstructionResult,
    reconstruct,
    render_volume,
)
from .warmup import warmup

try:
    __version__ = version("tomo-kplanes")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0"

__all__ = [
    "CapturedStep",
    "CollapsedReconstructionWarning",
    "DensityConstraints",
    "KPlanes",
    "KPlanesTilted",
    "LossWeights",
    "ReconstructionConfig",
    "ReconstructionContext",
    "ReconstructionResult",
    "TiltGeometry",
    "TomographyObject",
    "__version__",
    "nanoparticle_phantom",
    "prepare_optimizer_for_capture",
    "project_to_so3",
    "project_volume",
    "psnr",
    "reconstruct",
    "reconstruction_loss",
    "render_volume",
    "shepp_logan_3d",
    "simulate_tilt_series",
    "sirt",
    "ssim",
    "tilt_range",
    "tilted_plane_features",
    "warmup",
]
