"""The streaming runtime: many requests, one batched denoising step per tick."""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from .cond_cache import PaddedStatesCache
from .curves import Curve, is_one, is_zero
from .engines.base import Engine, derive_depth
from .guidance import apg, cfg_combine, cfg_rescale, dcw_correct, residual_negative, residual_noise
from .handle import Handle, QueueFullError, Status
from .ops.guided_euler import guided_euler_
from .request import MAX_STATE_MAGNITUDE, Request
from .schedule import flow_schedule

if TYPE_CHECKING:
    from .decode.stage import AudioDecoder


#: Every latent value is held within ±this after each step. Real latents are of order 1, so this
#: never touches a sensible request; at the far ends of the accepted ranges (residual CFG at a
#: guidance of 1000 grows the latent by ~1000x a step) the latent saturates here instead of
#: overflowing to inf and NaN, so every accepted request ends finite.
LATENT_LIMIT = MAX_STATE_MAGNITUDE


@dataclass
class _Slot:
    handle: Handle
    row: int
    frames: int
    schedule: tuple[float, ...]
    cond: torch.Tensor
    cond_mask: torch.Tensor
    negative: torch.Tensor
    negative_mask: torch.Tensor
    noise: torch.Tensor
    init: torch.Tensor
    context: torch.Tensor | None
    step: int = 0
    stock: torch.Tensor | None = None
    apg_running: torch.Tensor | None = None
    generator: torch.Generator | None = None
    extra: dict = field(default_factory=dict)

    @property
    def request(self) -> Request:
        return self.handle.request

    @property
    def steps(self) -> int:
        return len(self.schedule) - 1


@dataclass(frozen=True)
class SharedCurves:
    """Session-wide curves, multiplied into (velocity scale, guidance) or added to (noise) every
    slot's own, from the tick after they are set."""

    velocity_scale: Curve | None = None
    noise: Curve | None = None
    guidance: Curve | None = None
    # decided once, when set
    scales_velocity: bool = False
    adds_noise: bool = False
    scales_guidance: bool = False


@dataclass
class TickStats:
    rows: int = 0
    passes: int = 0
    finished: int = 0
    plain_rows: int = 0
    fused_rows: int = 0
    per_slot_rows: int = 0


class StreamSession:
    """Serve many requests with one batched denoiser forward per tick.

    Args:
        adapter: the denoiser (used for its channel counts; the engine runs it).
        engine: an :class:`~stream_dit.engines.Engine`; ``None`` wraps ``adapter`` in an eager
            :class:`~stream_dit.engines.TorchEngine`.
        depth: the most requests denoised at once; ``None`` derives it from the engine's batch
            ceiling (half of it, so guided rows fit in one execute).
        max_queue: queue capacity; :meth:`submit` raises :class:`QueueFullError` beyond it.
        fused_cfg: run plain CFG rows through the fused guidance + Euler kernel (else per slot).
        backend: backend of the fused kernel (see ``triton_dispatch.select_backend``).
        decoder: a :class:`~stream_dit.decode.AudioDecoder`: finished latents of requests with
            ``audio=True`` are decoded to ``Handle.audio`` in windows, on the decoder's own CUDA
            stream, while the next ticks run (``None``: latents only).
    """

    def __init__(
        self,
        adapter,
        engine: Engine | None = None,
        depth: int | None = None,
        *,
        max_queue: int = 64,
        fused_cfg: bool = True,
        backend: str | None = None,
        cond_cache_size: int = 8,
        decoder: AudioDecoder | None = None,
    ) -> None:
        if engine is None:
            from .engines import TorchEngine

            engine = TorchEngine(adapter)
        if depth is None:
            depth = derive_depth(engine, cfg=True)
        if not isinstance(depth, int) or depth < 1:
            raise ValueError(f"depth must be an int >= 1, got {depth!r}")
        if depth > engine.max_batch:
            raise ValueError(f"depth={depth} exceeds the engine's batch ceiling {engine.max_batch}")
        if max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {max_queue}")
        if decoder is not None:
            from .decode.stage import AudioDecoder

            if not isinstance(decoder, AudioDecoder):
                raise TypeError(f"decoder must be an AudioDecoder, got {type(decoder).__name__}")
            if decoder.latent_channels != engine.latent_channels:
                raise ValueError(
                    f"decoder takes {decoder.latent_channels} latent channels, the model makes "
                    f"{engine.latent_channels}"
                )
        self.adapter = adapter
        self.engine = engine
        self.decoder = decoder
        self.depth = depth
        self.max_queue = max_queue
        self.fused_cfg = fused_cfg
        self.backend = backend
        self.device = engine.device
        self.channels = engine.latent_channels
        self.cond_dim = engine.cond_dim
        self.context_channels = engine.context_channels
        self.state = torch.zeros(depth, engine.max_frames, self.channels, device=self.device)
        self.context_state = (
            torch.zeros(depth, engine.max_frames, self.context_channels, device=self.device)
            if self.context_channels
            else None
        )
        self._slots: list[_Slot | None] = [None] * depth
        self._queue: deque[tuple[Handle, dict]] = deque()
        self._ids = itertools.count()
        self._shared = SharedCurves()
        self._pending_shared: SharedCurves | None = None
        self._cond_cache = PaddedStatesCache(cond_cache_size)
        self._index_cache: dict = {}
        self._mask_cache: dict = {}
        self._rows_cache: dict = {}
        self._empty_states = torch.zeros(0, self.cond_dim, device=self.device)
        self._empty_mask = torch.zeros(0, dtype=torch.bool, device=self.device)
        self.last_stats = TickStats()
        self.ticks = 0

    # ---------------------------------------------------------------- submission
    @property
    def active(self) -> int:
        return sum(s is not None for s in self._slots)

    @property
    def queued(self) -> int:
        return len(self._queue)

    @property
    def idle(self) -> bool:
        """Nothing queued, denoising or (with a decoder) being decoded."""
        busy_decoder = self.decoder is not None and not self.decoder.idle
        return not self._queue and self.active == 0 and not busy_decoder

    def submit(self, request: Request) -> Handle:
        """Validate ``request``, move its tensors to the device and queue it.

        Raises:
            ValueError / TypeError: for an invalid request (nothing is queued).
            QueueFullError: when ``max_queue`` requests are already waiting.
        """
        if not isinstance(request, Request):
            raise TypeError(f"submit() takes a Request, got {type(request).__name__}")
        if len(self._queue) >= self.max_queue:
            raise QueueFullError(f"the queue holds {self.max_queue} requests; tick and retry")
        request.validate(
            channels=self.channels,
            cond_dim=self.cond_dim,
            max_frames=self.engine.max_frames,
            max_cond_len=self.engine.max_cond_len,
            context_channels=self.context_channels,
        )
        handle = Handle(request, next(self._ids))
        handle.steps = (
            len(flow_schedule(request.steps, float(request.shift), float(request.denoise))) - 1
        )
        self._queue.append((handle, self._prepare(request)))
        return handle

    def _to_device(self, t: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        t = t.detach()
        if dtype is not None:
            t = t.to(dtype)
        if self.device.type == "cuda" and t.device.type == "cpu":
            return t.pin_memory().to(self.device, non_blocking=True)
        return t.to(self.device).clone() if t.device == self.device else t.to(self.device)

    def _prepare(self, r: Request) -> dict:
        """Device copies of everything the request's ticks read (done at submit, off the tick)."""
        gen = torch.Generator().manual_seed(int(r.seed))
        noise = torch.randn(r.frames, self.channels, generator=gen)
        cond_mask = (
            r.cond_mask
            if r.cond_mask is not None
            else torch.ones(r.cond.shape[0], dtype=torch.bool)
        )
        prep = {
            "noise": self._to_device(noise),
            "cond": self._to_device(r.cond, torch.float32),
            "cond_mask": self._to_device(cond_mask),
            "init": self._to_device(r.init_latent, torch.float32)
            if r.init_latent is not None
            else None,
            "context": self._to_device(r.context, torch.float32) if r.context is not None else None,
        }
        if r.negative is not None:
            neg_mask = (
                r.negative_mask
                if r.negative_mask is not None
                else torch.ones(r.negative.shape[0], dtype=torch.bool)
            )
            prep["negative"] = self._to_device(r.negative, torch.float32)
            prep["negative_mask"] = self._to_device(neg_mask)
        else:
            prep["negative"], prep["negative_mask"] = self._empty_states, self._empty_mask
        return prep

    def set_shared_curves(
        self,
        *,
        velocity_scale: Curve | Sequence[float] | None = None,
        noise: Curve | Sequence[float] | None = None,
        guidance: Curve | Sequence[float] | None = None,
    ) -> None:
        """Session-wide curves applied to every slot from the next tick (``None`` clears one)."""
        vs = Curve.of(velocity_scale, name="velocity_scale")
        nz = Curve.of(noise, name="noise")
        gd = Curve.of(guidance, name="guidance")
        if nz is not None and min(nz.values) < 0:
            raise ValueError("noise curve values must be >= 0")
        self._pending_shared = SharedCurves(
            vs,
            nz,
            gd,
            scales_velocity=not is_one(vs),
            adds_noise=not is_zero(nz),
            scales_guidance=not is_one(gd),
        )

    # ---------------------------------------------------------------- tick
    def _admit(self, row: int, handle: Handle, prep: dict) -> _Slot:
        r = handle.request
        schedule = flow_schedule(r.steps, float(r.shift), float(r.denoise))
        t0 = schedule[0]
        self.state[row].zero_()
        x = self.state[row, : r.frames]
        if prep["init"] is not None and t0 < 1.0:
            x.copy_(prep["init"]).mul_(1.0 - t0).add_(prep["noise"] * t0)
        else:
            x.copy_(prep["noise"])
        ctx = None
        if self.context_state is not None:
            self.context_state[row].zero_()
            if prep["context"] is not None:
                self.context_state[row, : r.frames].copy_(prep["context"])
        slot = _Slot(
            handle=handle,
            row=row,
            frames=r.frames,
            schedule=schedule,
            cond=prep["cond"],
            cond_mask=prep["cond_mask"],
            negative=prep["negative"],
            negative_mask=prep["negative_mask"],
            noise=prep["noise"],
            init=prep["init"],
            context=ctx,
        )
        if r.cfg_type == "self":
            slot.stock = prep["noise"]
        if not is_zero(r.noise) or self._shared.adds_noise:
            slot.generator = self._generator(r.seed)
        handle.status = Status.ACTIVE
        return slot

    def _generator(self, seed: int) -> torch.Generator:
        gen = torch.Generator(device=self.device)
        gen.manual_seed(int(seed) + 0x5DEECE66D)
        return gen

    def _fail(self, handle: Handle, exc: BaseException) -> None:
        handle.status = Status.FAILED
        handle.error = exc
        handle._notify()

    def _refill(self) -> None:
        for row in range(self.depth):
            if self._slots[row] is not None:
                continue
            while self._queue:
                handle, prep = self._queue.popleft()
                if handle._cancel_requested:
                    handle.status = Status.CANCELLED
                    handle._notify()
                    continue
                try:
                    self._slots[row] = self._admit(row, handle, prep)
                except Exception as exc:  # one bad request must not stop the others
                    self._fail(handle, exc)
                    continue
                break

    def _reap_cancelled(self) -> None:
        for i, slot in enumerate(self._slots):
            if slot is not None and slot.handle._cancel_requested:
                slot.handle.status = Status.CANCELLED
                slot.handle._notify()
                self._slots[i] = None
        if any(h._cancel_requested for h, _ in self._queue):
            kept = deque()
            for h, p in self._queue:
                if h._cancel_requested:
                    h.status = Status.CANCELLED
                    h._notify()
                else:
                    kept.append((h, p))
            self._queue = kept

    def _guidance_scale(self, slot: _Slot) -> float:
        r = slot.request
        g = float(r.guidance)
        if r.guidance_curve is not None:
            g *= r.guidance_curve.at(slot.step, slot.steps)
        if self._shared.scales_guidance:
            g *= self._shared.guidance.at(slot.step, slot.steps)
        return g

    def _is_guided(self, slot: _Slot) -> bool:
        r = slot.request
        return r.cfg_type != "none" and (r.guided or self._shared.scales_guidance)

    def _needs_model_negative(self, slot: _Slot) -> bool:
        r = slot.request
        if not self._is_guided(slot):
            return False
        return r.cfg_type == "full" or (r.cfg_type == "initialize" and slot.stock is None)

    def _has_curves(self, slot: _Slot) -> bool:
        return slot.request.has_curves or self._shared.scales_velocity or self._shared.adds_noise

    def _index(self, rows: tuple[int, ...]) -> torch.Tensor:
        idx = self._index_cache.get(rows)
        if idx is None:
            idx = self._upload(torch.tensor(rows, dtype=torch.long))
            if len(self._index_cache) > 64:
                self._index_cache.clear()
            self._index_cache[rows] = idx
        return idx

    def _frame_mask(self, lengths: tuple[int, ...], frames: int) -> torch.Tensor | None:
        if all(n == frames for n in lengths):
            return None
        key = (lengths, frames)
        mask = self._mask_cache.get(key)
        if mask is None:
            mask = self._upload(torch.arange(frames)[None, :] < torch.tensor(lengths)[:, None])
            if len(self._mask_cache) > 64:
                self._mask_cache.clear()
            self._mask_cache[key] = mask
        return mask

    def _upload(self, host: torch.Tensor) -> torch.Tensor:
        # pinned + non_blocking: a pageable copy would make the host wait for the stream
        if self.device.type == "cuda":
            return host.pin_memory().to(self.device, non_blocking=True)
        return host.to(self.device)

    def _times(self, values: list[float]) -> torch.Tensor:
        return self._upload(torch.tensor(values, dtype=torch.float32))

    def _forward(self, slots: list[_Slot], negative: list[bool], frames: int) -> torch.Tensor:
        rows = tuple(s.row for s in slots)
        x = self.state[:, :frames].index_select(0, self._index(rows))
        t = self._times([s.schedule[s.step] for s in slots])
        cond_rows = [
            (s.negative, s.negative_mask) if neg else (s.cond, s.cond_mask)
            for s, neg in zip(slots, negative)
        ]
        length = self.engine.cond_bucket(max(c.shape[0] for c, _ in cond_rows))
        states, states_mask = self._cond_cache.get(cond_rows, length)
        frame_mask = self._frame_mask(tuple(s.frames for s in slots), frames)
        context = None
        if self.context_state is not None:
            context = self.context_state[:, :frames].index_select(0, self._index(rows))
        if not getattr(self.engine, "takes_conditioned_rows", False):
            return self.engine.forward(x, t, states, states_mask, frame_mask, context)
        # rows without tokens at the end (CFG's null-conditioned negatives come last): the
        # engine may skip their cross-attention
        conditioned = len(cond_rows)
        while conditioned and cond_rows[conditioned - 1][0].shape[0] == 0:
            conditioned -= 1
        return self.engine.forward(
            x, t, states, states_mask, frame_mask, context, conditioned_rows=conditioned
        )

    @torch.no_grad()
    def tick(self) -> list[Handle]:
        """Advance every active request by one step in one batched forward (two when guided rows
        exceed the engine's ceiling), refill free slots, and return the requests that finished.

        With a decoder, the latents that finished are queued for decoding and the decoder's
        step runs last: it reports the audio the device has finished and launches the pending
        windows (on its own CUDA stream, so they overlap the next ticks)."""
        done = self._tick()
        if self.decoder is not None:
            # with no slot busy there is nothing to overlap: wait for the decoder instead of
            # spinning on it
            self.decoder.step(wait=self.active == 0 and not self._queue)
        return done

    def _tick(self) -> list[Handle]:
        self.ticks += 1
        if self._pending_shared is not None:
            self._shared, self._pending_shared = self._pending_shared, None
        self._reap_cancelled()
        self._refill()
        slots = [s for s in self._slots if s is not None]
        stats = TickStats()
        self.last_stats = stats
        if not slots:
            return []
        neg_slots = [s for s in slots if self._needs_model_negative(s)]
        frames = self.engine.frames_bucket(max(s.frames for s in slots))
        n, m = len(slots), len(neg_slots)
        stats.rows = n + m
        try:
            if n + m <= self.engine.max_batch:
                velocity = self._forward(slots + neg_slots, [False] * n + [True] * m, frames)
                stats.passes = 1
            else:
                first = self._forward(slots, [False] * n, frames)
                # the second execute may reuse the first's output buffer: keep our own copy
                velocity = torch.empty(
                    n + m, *first.shape[1:], device=first.device, dtype=first.dtype
                )
                velocity[:n].copy_(first)
                velocity[n:].copy_(self._forward(neg_slots, [True] * m, frames))
                stats.passes = 2
        except Exception as exc:
            # a failed execute cannot be pinned on one row: fail the rows it carried, keep serving
            for slot in slots:
                self._fail(slot.handle, exc)
                self._slots[slot.row] = None
            return []
        neg_row = {id(s): n + j for j, s in enumerate(neg_slots)}
        self._update(slots, velocity, neg_row, stats)
        return self._finish(slots, stats)

    def _update(
        self, slots: list[_Slot], velocity: torch.Tensor, neg_row: dict, stats: TickStats
    ) -> None:
        plain_x, plain_v, plain_dt = [], [], []
        fused: list[tuple[_Slot, int, int, float, float]] = []
        for i, slot in enumerate(slots):
            t, t_next = slot.schedule[slot.step], slot.schedule[slot.step + 1]
            dt = t_next - t
            guided = self._is_guided(slot)
            r = slot.request
            if not guided and not self._has_curves(slot):
                plain_x.append(self.state[slot.row, : slot.frames])
                plain_v.append(velocity[i, : slot.frames])
                plain_dt.append(dt)
            elif (
                guided
                and self.fused_cfg
                and r.cfg_type == "full"
                and r.guidance_mode == "cfg"
                and r.cfg_rescale == 0.0
                and not self._has_curves(slot)
            ):
                fused.append((slot, i, neg_row[id(slot)], self._guidance_scale(slot), dt))
            else:
                try:
                    self._update_slot(slot, velocity, i, neg_row.get(id(slot)), t, t_next, guided)
                except Exception as exc:
                    self._fail(slot.handle, exc)
                    self._slots[slot.row] = None
                stats.per_slot_rows += 1
        if plain_x:
            # rows without guidance or curves: a couple of multi-tensor launches, bit-identical to
            # the per-slot ``x.add_(v.mul(dt))``
            torch._foreach_add_(plain_x, torch._foreach_mul(plain_v, plain_dt))
            stats.plain_rows = len(plain_x)
        if fused:
            guided_euler_(
                self.state,
                velocity,
                [s.row for s, *_ in fused],
                [p for _, p, _, _, _ in fused],
                [q for _, _, q, _, _ in fused],
                [s.frames for s, *_ in fused],
                [g for *_, g, _ in fused],
                [h for *_, h in fused],
                backend=self.backend,
                rows_cache=self._rows_cache,
            )
            stats.fused_rows = len(fused)
        self.state.clamp_(-LATENT_LIMIT, LATENT_LIMIT)

    def _update_slot(
        self,
        slot: _Slot,
        velocity: torch.Tensor,
        pos: int,
        neg: int | None,
        t: float,
        t_next: float,
        guided: bool,
    ) -> None:
        """The per-slot path: guidance variants, curves and DCW for one row."""
        r = slot.request
        x = self.state[slot.row, : slot.frames]
        v = velocity[pos, : slot.frames]
        if guided:
            if neg is not None:
                v_neg = velocity[neg, : slot.frames]
                if r.cfg_type == "initialize":
                    slot.stock = residual_noise(x, v_neg, t)
            else:
                v_neg = residual_negative(x, v, t, slot.stock)
            g = self._guidance_scale(slot)
            if r.guidance_mode == "apg":
                guided_v, slot.apg_running = apg(
                    v,
                    v_neg,
                    g,
                    slot.apg_running,
                    momentum=r.apg_momentum,
                    norm_threshold=r.apg_norm_threshold,
                    eta=r.apg_eta,
                )
            else:
                guided_v = cfg_combine(v, v_neg, g)
            v = cfg_rescale(guided_v, v, r.cfg_rescale)
        k, steps = slot.step, slot.steps
        scale = r.velocity_scale.at(k, steps) if r.velocity_scale is not None else 1.0
        if self._shared.scales_velocity:
            scale *= self._shared.velocity_scale.at(k, steps)
        if scale != 1.0:
            v = v * scale
        x0 = x - t * v if r.dcw is not None else None
        dt = t_next - t
        x.add_(v.mul(dt))
        sigma = r.noise.at(k, steps) if r.noise is not None else 0.0
        if self._shared.adds_noise:
            sigma += self._shared.noise.at(k, steps)
        if sigma > 0.0:
            if slot.generator is None:
                slot.generator = self._generator(r.seed)
            eps = torch.randn(x.shape, generator=slot.generator, device=x.device, dtype=x.dtype)
            x.add_(eps.mul_(sigma * math.sqrt(abs(dt))))
        if x0 is not None:
            x.copy_(dcw_correct(x, x0, t_next, r.dcw[0], r.dcw[1]))

    def _finish(self, slots: list[_Slot], stats: TickStats) -> list[Handle]:
        done = []
        for slot in slots:
            handle = slot.handle
            if handle.finished:  # failed during the update
                continue
            slot.step += 1
            handle.step = slot.step
            x = self.state[slot.row, : slot.frames]
            if handle.request.stream:
                handle.intermediates.append(x.clone())
            if slot.step >= slot.steps:
                handle.result = x.clone()
                handle.status = Status.DONE
                self._slots[slot.row] = None
                done.append(handle)
                if self.decoder is not None and handle.request.audio:
                    self.decoder.submit(handle, handle.result)
            handle._notify()
        stats.finished = len(done)
        return done

    def fail_active(self, exc: BaseException) -> None:
        """Fail every active request with ``exc`` and free its slot (queued ones stay queued)."""
        for i, slot in enumerate(self._slots):
            if slot is not None:
                self._fail(slot.handle, exc)
                self._slots[i] = None

    def run_until_idle(self, max_ticks: int = 100_000) -> list[Handle]:
        """Tick until nothing is active or queued; returns every handle finished along the way."""
        out: list[Handle] = []
        for _ in range(max_ticks):
            if self.idle:
                break
            out.extend(self.tick())
        return out
