"""A streaming runtime that serves many diffusion-transformer requests per batched tick, with fused classifier-free guidance."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("stream-dit")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0"

from .curves import Curve
from .engines import Engine, TorchEngine, derive_depth
from .model import DenoiserAdapter, DiT1D, DiTConfig, build_denoiser, build_model
from .request import Request
from .schedule import flow_schedule
from .session import Handle, QueueFullError, Status, StreamSession
from .warmup import StreamWarmupReport, warmup

__all__ = [
    "Curve",
    "DenoiserAdapter",
    "DiT1D",
    "DiTConfig",
    "Engine",
    "Handle",
    "QueueFullError",
    "Request",
    "Status",
    "StreamSession",
    "StreamWarmupReport",
    "TorchEngine",
    "__version__",
    "build_denoiser",
    "build_model",
    "derive_depth",
    "flow_schedule",
    "warmup",
]
