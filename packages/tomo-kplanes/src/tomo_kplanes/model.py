"""Rotated K-Planes fields: ``KPlanesTilted`` (T learned rotations) and ``KPlanes`` (T = 1, none)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from triton_dispatch import select_backend, uses_triton

from .ops import plane_tv, tilted_plane_features, tilted_plane_features_with_tv
from .rotations import project_to_so3


def softplus_shifted(x: torch.Tensor) -> torch.Tensor:
    """The default density activation ``softplus(x − 1)``: positive, near zero for small inputs."""
    return F.softplus(x - 1.0)


_ACTIVATIONS = {"softplus": softplus_shifted, "relu": F.relu, "identity": lambda x: x}


class KPlanesTilted(nn.Module):
    """A density field ``f(x, y, z)`` on ``[-1, 1]³`` from rotated triplets of feature planes.

    Per point and scale: rotate by each of the ``T`` learned rotations, sample the XY, ZX and YZ
    planes bilinearly (``align_corners=True``, border clamping), multiply the three samples; the
    features of all rotations and scales are concatenated and decoded to one density.

    Args:
        resolution: plane side at scale 1 (planes at scale ``s`` have ``round(resolution · s)``).
        channels: feature channels ``C`` per plane.
        rotations: number ``T`` of learned rotations (3×3 parameters projected onto SO(3)).
        scales: plane-resolution multipliers, one set of planes each.
        decoder: ``"linear"`` (default) or ``"mlp"`` (one hidden layer of ``hidden`` units).
        activation: ``"softplus"`` (``softplus(x − 1)``, default), ``"relu"`` or ``"identity"``.
        rotation_init_std: spread of the initial rotation parameters around the identity.
        learn_rotations: ``False`` keeps identity rotations as a buffer (the plain K-Planes case).
        channels_last: store planes channels-last (contiguous channel reads in the fused kernel).
        backend: forwarded to :func:`tilted_plane_features`.
        generator: seeds the initialisation.
    """

    #: ``forward(points, with_plane_tv=True)`` returns ``(densities, self.plane_tv())``
    plane_tv_from_forward = True

    def __init__(
        self,
        resolution: int,
        channels: int = 16,
        rotations: int = 4,
        scales: Sequence[float] = (1.0,),
        decoder: str = "linear",
        activation: str = "softplus",
        *,
        hidden: int = 64,
        rotation_init_std: float = 0.02,
        learn_rotations: bool = True,
        channels_last: bool = True,
        plane_init: tuple[float, float] = (0.1, 0.5),
        backend: str | None = None,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        if int(resolution) < 2:
            raise ValueError(f"resolution must be >= 2, got {resolution}")
        if channels < 1 or rotations < 1:
            raise ValueError(f"channels and rotations must be >= 1, got {channels}, {rotations}")
        if not scales:
            raise ValueError("scales must hold at least one multiplier")
        if decoder not in ("linear", "mlp"):
            raise ValueError(f"decoder must be 'linear' or 'mlp', got {decoder!r}")
        if activation not in _ACTIVATIONS:
            raise ValueError(
                f"activation must be one of {sorted(_ACTIVATIONS)}, got {activation!r}"
            )
        self.resolution = int(resolution)
        self.channels = int(channels)
        self.num_rotations = int(rotations)
        self.scales = tuple(float(s) for s in scales)
        self.activation_name = activation
        self.backend = backend
        lo, hi = plane_init
        planes = []
        for s in self.scales:
            side = max(2, round(self.resolution * s))
            p = torch.empty(3 * rotations, channels, side, side).uniform_(
                lo, hi, generator=generator
            )
            if channels_last:
                p = p.contiguous(memory_format=torch.channels_last)
            planes.append(nn.Parameter(p))
        self.planes = nn.ParameterList(planes)
        eye = torch.eye(3).repeat(rotations, 1, 1)
        if learn_rotations:
            noise = torch.randn(rotations, 3, 3, generator=generator) * rotation_init_std
            self.rotation_params = nn.Parameter(eye + noise)
        else:
            self.register_buffer("rotation_params", eye)
        self.learn_rotations = learn_rotations
        features = len(self.scales) * rotations * channels
        if decoder == "linear":
            self.decoder = nn.Linear(features, 1)
        else:
            self.decoder = nn.Sequential(
                nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, 1)
            )
        with torch.no_grad():  # start near the activation's threshold rather than far into it
            last = self.decoder if decoder == "linear" else self.decoder[-1]
            last.weight.normal_(0.0, 0.1 / features**0.5, generator=generator)
            last.bias.zero_()

    def rotations(self) -> torch.Tensor:
        """``(T, 3, 3)`` rotation matrices (identity when rotations are not learned)."""
        if not self.learn_rotations:
            return self.rotation_params
        return project_to_so3(self.rotation_params, backend=self.backend)

    def features(self, points: torch.Tensor) -> torch.Tensor:
        """``(N, S·T·C)`` concatenated plane features."""
        rot = self.rotations().to(points.dtype)
        feats = [
            tilted_plane_features(points, rot, p.to(points.dtype), backend=self.backend)
            for p in self.planes
        ]
        return feats[0] if len(feats) == 1 else torch.cat(feats, dim=1)

    def forward(
        self, points: torch.Tensor, *, with_plane_tv: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """``(N,)`` densities at ``points`` ``(N, 3)``; with ``with_plane_tv``, ``(densities,
        self.plane_tv())``. Where the features run as Triton kernels the plane TV is then taken in
        the same op as the features (:func:`~tomo_kplanes.ops.tilted_plane_features_with_tv`), so
        that the backward writes each plane's gradient once instead of adding two. Going through
        ``forward`` keeps a (Distributed)DataParallel wrapper in the loop."""
        if not with_plane_tv:
            return self._decode(self.features(points))
        if not self._folds_plane_tv(points):
            return self._decode(self.features(points)), self.plane_tv()
        rot = self.rotations().to(points.dtype)
        feats, tv = [], None
        for p in self.planes:
            f, t = tilted_plane_features_with_tv(points, rot, p, backend=self.backend)
            feats.append(f)
            tv = t if tv is None else tv + t
        return self._decode(feats[0] if len(feats) == 1 else torch.cat(feats, dim=1)), tv

    def _decode(self, features: torch.Tensor) -> torch.Tensor:
        return _ACTIVATIONS[self.activation_name](self.decoder(features).squeeze(-1))

    def _folds_plane_tv(self, points: torch.Tensor) -> bool:
        # folding saves work only on the kernels' backward; on the PyTorch path plane_tv() stays
        # (and so does a plane_tv replaced on the instance, e.g. a torch.compile'd one)
        if any(p.dtype != points.dtype for p in self.planes):
            return False
        return uses_triton(select_backend(device=points.device, backend=self.backend))

    def plane_tv(self) -> torch.Tensor:
        """Mean squared finite difference along H and W over all planes (smoothness prior), summed
        over the scales: :func:`~tomo_kplanes.ops.plane_tv` (fused kernels where the field's
        backend runs Triton)."""
        total = None
        for p in self.planes:
            tv = plane_tv(p, backend=self.backend)
            total = tv if total is None else total + tv
        return total

    def parameter_groups(self) -> dict[str, list[nn.Parameter]]:
        """Parameters by role, for optimizers with per-group learning rates."""
        groups = {"planes": list(self.planes), "decoder": list(self.decoder.parameters())}
        groups["rotations"] = [self.rotation_params] if self.learn_rotations else []
        return groups


class KPlanes(KPlanesTilted):
    """Plain K-Planes: one set of axis-aligned XY, ZX, YZ planes (``T = 1``, no rotation)."""

    def __init__(self, resolution: int, channels: int = 16, **kwargs) -> None:
        kwargs.pop("rotations", None)
        kwargs["learn_rotations"] = False
        super().__init__(resolution, channels, rotations=1, **kwargs)
