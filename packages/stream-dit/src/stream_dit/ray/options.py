"""The settings of a Ray Serve deployment of stream-dit, as plain values.

:class:`RayServeOptions` holds the replicas' session (a :class:`~stream_dit.session_spec.SessionSpec`),
the HTTP limits of the ingress, how many replicas run (a fixed count, or autoscaling on queue
length between a minimum and a maximum) and what each one asks Ray for. ``serve run
stream_dit.ray:app key=value ...`` and the ``args:`` of a Serve config file reach it through
:meth:`RayServeOptions.from_args`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from ..server_limits import ServerLimits
from ..session_spec import SessionSpec

__all__ = ["RayServeOptions"]

#: ``ServerLimits`` fields an option may set (the rest come from the replicas' sessions).
LIMIT_NAMES: tuple[str, ...] = (
    "max_steps",
    "max_curve_len",
    "max_body_bytes",
    "request_timeout_s",
    "retry_after_s",
    "max_uploads",
)


@dataclass(frozen=True)
class RayServeOptions:
    """A stream-dit application on Ray Serve.

    Attributes:
        spec: the session every replica builds (its ``device`` is set from ``gpus_per_replica``).
        limits: overrides of the ingress's :class:`~stream_dit.server_limits.ServerLimits`
            (``max_steps``, ``max_body_bytes``, ``request_timeout_s``, ...; ``None``: default).
        replicas: a fixed number of replicas (default 1 without autoscaling).
        min_replicas, max_replicas: autoscale between these on queue length (either one turns
            autoscaling on; Ray Serve's ``autoscaling_config``).
        target_queue: requests in flight per replica the autoscaler aims at (default: ``depth``).
        gpus_per_replica: GPUs each replica asks Ray for; ``None``: 1 where the cluster has GPUs
            (one replica per GPU), 0 otherwise (CPU replicas).
        cpus_per_replica: CPUs each replica asks Ray for.
        torch_threads: torch threads in each replica (``None``: 1 on a CPU replica, so replicas
            on one machine do not fight over its cores; torch's default on a GPU one).
        max_queued: valid requests the ingress lets wait for a replica once every replica's
            queue is full, before it answers 503 (``None``: one replica's capacity).
        health_check_period_s: how often Ray Serve checks each replica (a dead one is replaced).
        app_name: the Serve application's name (and of its health board actor).
    """

    spec: SessionSpec = field(default_factory=SessionSpec)
    limits: dict[str, Any] = field(default_factory=dict)
    replicas: int | None = None
    min_replicas: int | None = None
    max_replicas: int | None = None
    target_queue: float | None = None
    gpus_per_replica: float | None = None
    cpus_per_replica: float = 1.0
    torch_threads: int | None = None
    max_queued: int | None = None
    health_check_period_s: float = 2.0
    app_name: str = "stream-dit"

    def __post_init__(self) -> None:
        unknown = set(self.limits) - set(LIMIT_NAMES)
        if unknown:
            raise ValueError(f"unknown server limits: {sorted(unknown)}")
        for name in ("replicas", "max_replicas", "max_queued", "torch_threads"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if self.min_replicas is not None and self.min_replicas < 0:
            raise ValueError(f"min_replicas must be >= 0, got {self.min_replicas}")
        if self.autoscaling and self.replicas is not None:
            raise ValueError("give replicas (a fixed count) or min/max_replicas, not both")
        low, high = self.min_replicas or 0, self.max_replicas or 1
        if self.autoscaling and low > high:
            raise ValueError(f"min_replicas={low} exceeds max_replicas={high}")
        if self.spec.max_queue < 1:
            raise ValueError("the replicas' sessions need max_queue >= 1")

    @property
    def autoscaling(self) -> bool:
        return self.min_replicas is not None or self.max_replicas is not None

    @property
    def replica_capacity(self) -> int:
        """Requests one replica holds: its slots and its queue (Ray Serve's
        ``max_ongoing_requests``, so the router never sends a replica more)."""
        return self.spec.depth + self.spec.max_queue

    @property
    def most_replicas(self) -> int:
        """The most replicas that can run at once."""
        if self.autoscaling:
            return max(self.max_replicas or 1, self.min_replicas or 0, 1)
        return self.replicas or 1

    def autoscaling_config(self) -> dict[str, Any] | None:
        """Ray Serve's ``autoscaling_config`` (``None`` for a fixed count)."""
        if not self.autoscaling:
            return None
        return {
            "min_replicas": self.min_replicas or 0,
            "max_replicas": self.most_replicas,
            "target_ongoing_requests": self.target_queue or float(self.spec.depth),
        }

    @classmethod
    def from_args(cls, args: dict[str, Any] | None) -> RayServeOptions:
        """Options from ``serve run stream_dit.ray:app key=value ...`` or a config file's
        ``args:``: session fields (``preset``, ``depth``, ``max_frames``, ...), limit names
        (``max_body_bytes``, ...) and the fields of this class, by name; values may be strings.

        Raises:
            ValueError: an unknown name or a value that does not parse.
        """
        args = dict(args or {})
        spec_names = {f.name for f in fields(SessionSpec)}
        own_names = {f.name for f in fields(cls)} - {"spec", "limits"}
        spec_values, limits, own = {}, {}, {}
        for key, value in args.items():
            if key in spec_names:
                spec_values[key] = _parse(key, value, SessionSpec.__dataclass_fields__[key].type)
            elif key in LIMIT_NAMES:
                limits[key] = _parse(key, value, ServerLimits.__dataclass_fields__[key].type)
            elif key in own_names:
                own[key] = _parse(key, value, cls.__dataclass_fields__[key].type)
            else:
                raise ValueError(f"unknown stream-dit option {key!r}")
        return cls(spec=SessionSpec(**spec_values), limits=limits, **own)


def _parse(key: str, value: Any, annotation: Any) -> Any:
    """``value`` as the type its annotation names (strings come from the command line)."""
    text = str(annotation)
    if not isinstance(value, str):
        return tuple(value) if "tuple" in text and value is not None else value
    if value.lower() in ("none", "null") and "None" in text:
        return None
    try:
        if "tuple" in text:
            return tuple(int(v) for v in value.replace(",", " ").split())
        if text.startswith("bool"):
            if value.lower() not in ("true", "false", "1", "0"):
                raise ValueError(value)
            return value.lower() in ("true", "1")
        if text.startswith("int"):
            return int(value)
        if text.startswith("float"):
            return float(value)
    except ValueError:
        raise ValueError(f"{key}={value!r} is not a valid {text}") from None
    return value
