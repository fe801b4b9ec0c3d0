"""The reconstruction loop: device-resident shuffled ray batches, Adam with parameter groups,
gradient clipping, a cosine schedule, periodic checkpoints with resume, early stopping on held-out
pixels, and data-parallel training under ``torch.distributed`` (each rank a slice of every batch)."""

from __future__ import annotations

import math
import numbers
import warnings
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from .checkpoint import load_checkpoint, save_checkpoint
from .geometry import TiltGeometry, grid_points
from .graphed import CapturedStep, prepare_optimizer_for_capture
from .model import KPlanes, KPlanesTilted
from .objective import (
    DensityConstraints,
    LossWeights,
    ReconstructionContext,
    TomographyObject,
    reconstruction_loss,
)
from .pose import TiltPose


@dataclass
class ReconstructionConfig:
    """Everything a reconstruction run needs besides the data.

    The defaults are the ones ``tomo-kplanes reconstruct`` runs with (its flags take their
    defaults from here): a small field (C = 8 channels, T = 2 rotations) and 512 rays a step,
    which beat SIRT on the built-in 32³ phantom in about half a minute on one CPU core and scale
    to a GPU. Three settings follow the data when left at ``None`` (see :meth:`resolved`):

    * ``resolution`` (plane side in pixels): the detector's larger side, ``max(n_v, n_u)``, so
      the planes have one pixel per voxel of the volume the tilt series covers;
    * ``samples_per_ray``: the same, one sample per voxel crossed along a ray;
    * ``eval_every`` (steps between held-out evaluations): ``max(50, steps // 8)``, about eight
      evaluations a run, so early stopping (``patience`` evaluations without improvement) keeps
      the same meaning for short and long runs.

    A value given explicitly is used as given. The defaults of earlier versions were fixed and
    heavier (resolution 64, C = 16, T = 4, 1,000 steps of 1,024 rays × 128 samples, 2,048 TV
    points, evaluation every 100 steps): pass those explicitly to reproduce such a run.
    """

    #: plane side in pixels; ``None``: the detector's larger side
    resolution: int | None = None
    channels: int = 8
    rotations: int = 2
    scales: tuple[float, ...] = (1.0,)
    decoder: str = "linear"
    steps: int = 1200
    rays_per_batch: int = 512
    #: samples along each ray; ``None``: the detector's larger side
    samples_per_ray: int | None = None
    lr_planes: float = 1e-1
    lr_decoder: float = 2e-2
    lr_rotations: float = 1e-3
    warmup_steps: int = 20
    grad_clip: float = 1.0
    weights: LossWeights = field(default_factory=lambda: LossWeights(volume_tv=1e-4, plane_tv=1e-4))
    tv_points: int = 1024
    fold_taps: bool = True
    constraints: DensityConstraints = field(default_factory=DensityConstraints)
    holdout_fraction: float = 0.02
    #: steps between held-out evaluations (0: none); ``None``: ``max(50, steps // 8)``
    eval_every: int | None = None
    patience: int = 5
    checkpoint_every: int = 0
    checkpoint_path: str | None = None
    seed: int = 0
    progress: bool = True
    backend: str | None = None
    #: learn each tilt's shift (pixels) with the volume; the reference tilt's stays fixed
    learn_shift: bool = False
    #: learn the tilt axis's angle in the images with the volume
    learn_tilt_axis: bool = False
    #: one tilt-axis angle per tilt instead of one for the series
    per_tilt_axis: bool = False
    #: Adam's rate for the shifts (pixels a step at most, about)
    lr_pose: float = 5e-2
    #: Adam's rate for the tilt axis (degrees a step at most, about): its gradient is the weaker
    #: and noisier one (a small turn moves only the pixels far from the centre), so it needs a
    #: larger rate than the shifts to settle in a run's length
    lr_tilt_axis: float = 0.2
    #: weight of the pose's total variation across tilts (0: off)
    pose_tv: float = 0.0
    #: the tilt whose shift holds the frame; ``None``: the one closest to 0 degrees
    reference_tilt: int | None = None
    #: replay each step as one CUDA graph: the same steps without the Python launch cost that
    #: dominates a step at these sizes. ``None``: on CUDA (under ``torch.distributed``, with
    #: NCCL); ``True``: asked for (a warning and eager steps where it cannot run); ``False``: eager.
    cuda_graph: bool | None = None

    def __post_init__(self) -> None:
        for name, low in (("resolution", 2), ("samples_per_ray", 1), ("eval_every", 0)):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise TypeError(
                    f"ReconstructionConfig.{name} must be an int or None (automatic), "
                    f"got {type(value).__name__}"
                )
            if value < low:
                raise ValueError(
                    f"ReconstructionConfig.{name} must be at least {low} or None (automatic), "
                    f"got {value}"
                )
            setattr(self, name, int(value))
        for name in ("learn_shift", "learn_tilt_axis", "per_tilt_axis"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(
                    f"ReconstructionConfig.{name} must be a bool, got {type(getattr(self, name)).__name__}"
                )
        for name in ("lr_pose", "lr_tilt_axis", "pose_tv"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise TypeError(
                    f"ReconstructionConfig.{name} must be a number, got {type(value).__name__}"
                )
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(
                    f"ReconstructionConfig.{name} must be finite and >= 0, got {value}"
                )

    @property
    def learns_pose(self) -> bool:
        """Whether the run learns any part of the tilt series' alignment."""
        return self.learn_shift or self.learn_tilt_axis

    def resolved(self, geometry: TiltGeometry) -> ReconstructionConfig:
        """A copy whose automatic (``None``) settings are filled in for ``geometry``: what
        :func:`reconstruct` runs with, and what ``tomo-kplanes reconstruct`` passes it.

        ``resolution`` and ``samples_per_ray`` become ``max(n_v, n_u)`` of
        ``geometry.detector_shape``, ``eval_every`` becomes ``max(50, steps // 8)``; values
        given explicitly are kept.
        """
        if not isinstance(geometry, TiltGeometry):
            raise TypeError(f"geometry must be a TiltGeometry, got {type(geometry).__name__}")
        side = max(geometry.detector_shape)
        auto = {
            "resolution": side,
            "samples_per_ray": side,
            "eval_every": max(50, self.steps // 8),
        }
        return replace(self, **{k: v for k, v in auto.items() if getattr(self, k) is None})


#: A field whose projections carry less than this share of the data's signal energy has collapsed
#: to an (almost) empty volume: every density pushed into the activation's flat zero.
COLLAPSE_ENERGY = 0.01


class CollapsedReconstructionWarning(UserWarning):
    """The trained field is an (almost) empty volume though the tilt series is not."""


@dataclass
class ReconstructionResult:
    object_model: TomographyObject
    losses: list[float]
    holdout_losses: list[float]
    steps_run: int
    stopped_early: bool
    #: the settings the run used, automatic ones filled in (:meth:`ReconstructionConfig.resolved`)
    config: ReconstructionConfig | None = None
    #: share of the held-out pixels' signal energy the field explains, ``1 - |Ax - b|² / |b|²``
    #: (training pixels when nothing is held out; 1.0 for an all-zero series; negative when the
    #: field fits worse than an empty volume, as after too few steps)
    explained: float = 1.0
    #: the field's projections carry under ``COLLAPSE_ENERGY`` of the data's energy: an empty
    #: volume, not a reconstruction
    collapsed: bool = False
    #: the learned alignment (``learn_shift`` / ``learn_tilt_axis``), else ``None``
    pose: TiltPose | None = None


def build_object(config: ReconstructionConfig, device: torch.device | str) -> TomographyObject:
    """The field and its constraints that ``config`` describes, on ``device``; ``config`` must
    hold a resolution (``config.resolved(geometry)`` fills in an automatic one)."""
    if config.resolution is None:
        raise ValueError(
            "config.resolution is None (automatic): fill it in for the data with "
            "config.resolved(geometry) first"
        )
    g = torch.Generator().manual_seed(config.seed)
    common = dict(scales=config.scales, decoder=config.decoder, backend=config.backend, generator=g)
    if config.rotations == 0:
        field_model: nn.Module = KPlanes(config.resolution, config.channels, **common)
    else:
        field_model = KPlanesTilted(
            config.resolution, config.channels, rotations=config.rotations, **common
        )
    return TomographyObject(field_model, config.constraints).to(device)


def make_optimizer(
    field_model: nn.Module, config: ReconstructionConfig, pose: TiltPose | None = None
) -> torch.optim.Adam:
    """Adam with one parameter group per role (planes, decoder, rotations, and the pose's shifts
    and tilt axis when it learns them), each its own rate; the fused (one kernel per step) implementation when
    every parameter is on CUDA."""
    groups = dict(field_model.parameter_groups())
    learned = pose.learned_parameters() if pose is not None else []
    groups["shifts"] = [p for p in learned if p is pose.shift_offsets]
    groups["tilt_axis"] = [p for p in learned if p is pose.tilt_axis_offset]
    lrs = {
        "planes": config.lr_planes,
        "decoder": config.lr_decoder,
        "rotations": config.lr_rotations,
        "shifts": config.lr_pose,
        "tilt_axis": config.lr_tilt_axis,
    }
    params = [p for k in groups for p in groups[k]]
    fused = bool(params) and all(p.is_cuda for p in params)
    return torch.optim.Adam(
        [
            {"params": groups[k], "lr": lrs[k], "name": k}
            for k in ("planes", "decoder", "rotations", "shifts", "tilt_axis")
            if groups[k]
        ],
        fused=fused,
    )


def cosine_schedule(optimizer, total: int, warmup: int) -> torch.optim.lr_scheduler.LambdaLR:
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def _split_rays(
    n_rays: int, config: ReconstructionConfig, device
) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(config.seed + 1)
    perm = torch.randperm(n_rays, generator=g)
    n_hold = round(n_rays * config.holdout_fraction) if config.holdout_fraction > 0 else 0
    return perm[n_hold:].to(device), perm[:n_hold].to(device)


def reconstruct(
    tilt_series: torch.Tensor,
    geometry: TiltGeometry,
    config: ReconstructionConfig | None = None,
    *,
    resume: bool = False,
    stop_at: int | None = None,
) -> ReconstructionResult:
    """Fit a rotated K-Planes field to a tilt series ``(n_tilts, n_v, n_u)``.

    Under an initialised ``torch.distributed`` process group each step's batch of
    ``rays_per_batch`` rays and ``tv_points`` volume-TV points (each rounded up to a multiple of
    the world size) is split evenly over the ranks, and the gradients and the loss are averaged
    by one all-reduce per step: W ranks take the steps of one process, each on 1/W of the batch.
    Replicas stay identical; on CUDA with NCCL the step, collective included, is replayed as one
    CUDA graph as on one GPU.

    Args:
        tilt_series: ``(n_tilts, n_v, n_u)`` line integrals on the device to train on.
        geometry: the tilt geometry of ``tilt_series``.
        config: the run's settings (default: ``ReconstructionConfig()``); its automatic
            (``None``) settings are filled in for ``geometry`` by
            :meth:`ReconstructionConfig.resolved`, as the result's ``config`` shows.
        resume: continue from ``config.checkpoint_path`` when it exists (same config).
        stop_at: return after this step (an interrupted run; resume continues it exactly).
    """
    from tqdm.auto import tqdm

    if config is None:
        config = ReconstructionConfig()
    elif not isinstance(config, ReconstructionConfig):
        raise TypeError(f"config must be a ReconstructionConfig, got {type(config).__name__}")
    config = config.resolved(geometry)
    if tilt_series.dim() != 3 or tuple(tilt_series.shape) != (
        geometry.num_tilts,
        *geometry.detector_shape,
    ):
        raise ValueError(
            f"tilt_series must have shape (n_tilts, n_v, n_u) = "
            f"({geometry.num_tilts}, {geometry.detector_shape[0]}, {geometry.detector_shape[1]}), "
            f"got {tuple(tilt_series.shape)}"
        )
    if not torch.isfinite(tilt_series).all():
        raise ValueError("tilt_series holds non-finite pixels")
    device = tilt_series.device
    torch.manual_seed(config.seed)
    geometry = geometry.to(device)
    target = tilt_series.reshape(-1).float()
    obj = build_object(config, device)
    distributed = dist.is_available() and dist.is_initialized()
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    inner = obj.field
    pose = None
    if config.learns_pose:
        pose = TiltPose(
            geometry,
            learn_shift=config.learn_shift,
            learn_tilt_axis=config.learn_tilt_axis,
            per_tilt_axis=config.per_tilt_axis,
            reference_tilt=config.reference_tilt,
        )
    cast = pose.rays if pose is not None else geometry.rays
    trained = [p for p in inner.parameters() if p.requires_grad]
    if pose is not None:
        trained += pose.learned_parameters()
    average = _GradientAverage(trained, world) if world > 1 else None
    optimizer = make_optimizer(inner, config, pose)
    scheduler = cosine_schedule(optimizer, config.steps, config.warmup_steps)

    train_rays, held_rays = _split_rays(geometry.num_rays, config, device)
    # every rank draws the same ray order and TV points (one generator seed) and takes its slice
    # of each global batch, so a step of W ranks is the step of one process on the whole batch
    gen = torch.Generator(device=device).manual_seed(config.seed + 2)
    step0, losses, held_losses = 0, [], []
    ckpt = Path(config.checkpoint_path) if config.checkpoint_path else None
    if resume and ckpt is not None and ckpt.exists():
        state = load_checkpoint(ckpt, map_location=device)
        inner.load_state_dict(state["field"])
        if pose is not None:
            pose.load_state_dict(state["pose"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        # generator states are host byte tensors on every device (map_location moved it)
        gen.set_state(state["generator"].cpu())
        step0, losses, held_losses = state["step"], state["losses"], state["holdout_losses"]
        best, bad = state.get("best_holdout", math.inf), state.get("bad_evals", 0)

    n_train = train_rays.numel()
    # equal shards: each rank's mean loss then weighs the same, and the average of the ranks'
    # gradients is the gradient of the mean over the global batch
    local = -(-min(config.rays_per_batch, max(1, n_train)) // world)
    global_batch = local * world
    tv_local = -(-config.tv_points // world)
    per_epoch = max(1, n_train // global_batch)
    if step0:
        order = state["order"].to(device)
    else:
        order = torch.randperm(n_train, generator=gen, device=device)
    # the step reads its rays from one fixed buffer, so that it can be replayed as a CUDA graph
    batch_rays = torch.empty(local, dtype=train_rays.dtype, device=device)
    my_slots = torch.arange(rank * local, (rank + 1) * local, device=device)

    def train_step() -> torch.Tensor:
        points, steps = cast(batch_rays, config.samples_per_ray)
        ctx = ReconstructionContext()
        if config.weights.volume_tv > 0:
            taps = obj.sample_tv_tap_coords(tv_local * world, generator=gen, device=device)
            if world > 1:  # tap-major (4, points, 3): this rank's points in all four taps
                taps = taps.view(4, world, tv_local, 3)[:, rank].reshape(-1, 3)
            ctx.tv_tap_points = taps
        loss, _ = reconstruction_loss(
            obj, points, steps, target[batch_rays], config.weights, ctx, fold_taps=config.fold_taps
        )
        if pose is not None and config.pose_tv > 0:
            loss = loss + config.pose_tv * pose.smoothness()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if average is not None:
            loss = average(loss)
        if config.grad_clip > 0:
            nn.utils.clip_grad_norm_(obj.parameters(), config.grad_clip)
        optimizer.step()
        return loss.detach()

    run_step = train_step
    # NCCL collectives can be captured; gloo's run on the host
    graph_possible = device.type == "cuda" and (
        not distributed or dist.get_backend() == dist.Backend.NCCL
    )
    if config.cuda_graph and not graph_possible:
        warnings.warn(
            "cuda_graph needs a CUDA device (and NCCL under torch.distributed); "
            "running the steps eagerly",
            stacklevel=2,
        )
    elif graph_possible and config.cuda_graph is not False:
        prepare_optimizer_for_capture(optimizer)
        run_step = CapturedStep(train_step, generators=[gen])
    if not step0:
        best, bad = math.inf, 0
    stopped = False
    end = config.steps if stop_at is None else min(stop_at, config.steps)
    bar = tqdm(range(step0, end), disable=not config.progress or rank != 0, desc="reconstruct")
    step = step0 - 1  # the last step run: none yet
    for step in bar:
        slot = step % per_epoch
        # a new epoch's order; a run resumed at an epoch's start draws it too, as the uninterrupted
        # run did (the checkpoint holds the previous epoch's order)
        if slot == 0 and step > 0:
            order = torch.randperm(n_train, generator=gen, device=device)
        # a global batch larger than the training set wraps around it
        batch_rays.copy_(train_rays[order[(my_slots + slot * global_batch) % n_train]])
        loss = run_step()
        scheduler.step()
        if (step + 1) % 10 == 0 or step + 1 == config.steps:
            losses.append(loss.item())
            bar.set_postfix(loss=f"{losses[-1]:.3e}")
        if held_rays.numel() and config.eval_every and (step + 1) % config.eval_every == 0:
            held = _holdout_loss(obj, cast, held_rays, target, config)
            held_losses.append(held)
            if held < best * (1 - 1e-4):
                best, bad = held, 0
            else:
                bad += 1
                if bad >= config.patience:
                    stopped = True
                    break
        if (
            ckpt is not None
            and config.checkpoint_every
            and (step + 1) % config.checkpoint_every == 0
            and rank == 0
        ):
            save_checkpoint(
                {
                    "field": inner.state_dict(),
                    **({"pose": pose.state_dict()} if pose is not None else {}),
                    "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict(),
                    "generator": gen.get_state(),
                    "step": step + 1,
                    "losses": losses,
                    "holdout_losses": held_losses,
                    "order": order,
                    "best_holdout": best,
                    "bad_evals": bad,
                    "config": asdict(config),
                },
                ckpt,
            )
    bar.close()
    fit_rays = held_rays if held_rays.numel() else train_rays[: 8 * config.rays_per_batch]
    explained, carried = _fit(obj, cast, fit_rays, target, config)
    collapsed = carried < COLLAPSE_ENERGY
    if collapsed:
        warnings.warn(
            f"the reconstruction collapsed to an empty volume: its projections carry "
            f"{100 * carried:.2g} % of the held-out pixels' signal. The field's initialisation "
            "suits line integrals of order 1: divide the tilt series by its largest value, or "
            "lower the learning rates.",
            CollapsedReconstructionWarning,
            stacklevel=2,
        )
    return ReconstructionResult(
        obj, losses, held_losses, step + 1, stopped, config, explained, collapsed, pose
    )


class _GradientAverage:
    """Averages the gradients of ``params`` and the loss over the default process group with one
    all-reduce of one flat buffer per step (no host sync, so a CUDA graph can hold it), after
    making the replicas start equal (rank 0's parameters are broadcast once).

    The planes' gradient, most of the bytes, is the last one backward produces, so a bucketed
    all-reduce overlapped with backward would have almost nothing to hide behind; one collective
    after backward costs one launch instead of one per bucket."""

    def __init__(self, params: list[torch.Tensor], world: int) -> None:
        self.params, self.world = params, world
        with torch.no_grad():
            for p in params:
                dist.broadcast(p, src=0)
        self.op = dist.ReduceOp.AVG if dist.get_backend() == dist.Backend.NCCL else None

    @torch.no_grad()
    def __call__(self, loss: torch.Tensor) -> torch.Tensor:
        grads = []
        for p in self.params:
            if p.grad is None:  # a parameter this step did not reach: its gradient is zero
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)
        flat = torch.cat([*(g.reshape(-1) for g in grads), loss.detach().reshape(1).to(grads[0])])
        if self.op is None:  # gloo has no average
            dist.all_reduce(flat)
            flat.mul_(1.0 / self.world)
        else:
            dist.all_reduce(flat, op=self.op)
        views = flat[:-1].split([g.numel() for g in grads])
        torch._foreach_copy_(grads, [v.view_as(g) for v, g in zip(views, grads)])
        return flat[-1].to(loss.dtype)


@torch.no_grad()
def _holdout_loss(obj, cast, rays, target, config) -> float:
    total = 0.0
    for start in range(0, rays.numel(), config.rays_per_batch):
        idx = rays[start : start + config.rays_per_batch]
        points, steps = cast(idx, config.samples_per_ray)
        dens = obj.densities(points.reshape(-1, 3)).reshape(points.shape[:2])
        total += float(((dens.sum(1) * steps - target[idx]) ** 2).sum())
    return total / rays.numel()


@torch.no_grad()
def _fit(obj, cast, rays, target, config) -> tuple[float, float]:
    """On ``rays``: ``(1 - |Ax - b|² / |b|², |Ax|² / |b|²)``, the share of the data's signal
    energy the field explains and the share its projections carry (both 1.0 for empty data).
    ``cast``: the rays' sampler (the geometry's, or the learned pose's)."""
    residual = carried = energy = 0.0
    for start in range(0, rays.numel(), config.rays_per_batch):
        idx = rays[start : start + config.rays_per_batch]
        points, steps = cast(idx, config.samples_per_ray)
        dens = obj.densities(points.reshape(-1, 3)).reshape(points.shape[:2])
        projected, data = (dens.sum(1) * steps).double(), target[idx].double()
        residual += float(((projected - data) ** 2).sum())
        carried += float((projected**2).sum())
        energy += float((data**2).sum())
    if energy == 0.0:
        return 1.0, 1.0  # nothing to explain: an empty volume is the answer
    return 1.0 - residual / energy, carried / energy


@torch.no_grad()
def render_volume(
    obj: TomographyObject, shape: tuple[int, int, int], *, chunk: int = 65536
) -> torch.Tensor:
    """The constrained density field sampled on a ``(Z, Y, X)`` voxel grid."""
    device = next(obj.parameters()).device
    pts = grid_points(shape, device)
    out = torch.cat([obj.densities(pts[i : i + chunk]) for i in range(0, pts.shape[0], chunk)])
    return out.reshape(shape)
