"""stream-dit on Ray Serve: one replica per GPU behind an ingress that speaks the HTTP API of
``stream-dit serve`` (extra ``ray``).

* :class:`~stream_dit.ray.replica.StreamReplica` (deployment ``StreamReplica``): one
  :class:`~stream_dit.session.StreamSession` with its engine and decoder, built from the
  application's :class:`~stream_dit.session_spec.SessionSpec` like the single server's; one GPU
  each where the cluster has GPUs (``num_gpus=1``), CPU replicas otherwise.
* :class:`~stream_dit.ray.ingress.StreamIngress` (deployment ``StreamIngress``): reads, bounds and
  validates every request with the single server's code before routing it; Ray Serve's router
  picks the replica.
* Backpressure: a replica takes at most its slots + queue (``max_ongoing_requests``); when every
  replica is full and ``max_queued`` requests wait for one, the ingress answers 503 with
  ``Retry-After``.
  Autoscaling on queue length with ``min_replicas``/``max_replicas`` (Ray Serve's
  ``autoscaling_config``).
* A replica that dies: a request it held that had not started streaming is sent to another
  replica once; a started stream ends early; Ray Serve replaces the replica.

Run it with ``stream-dit serve --ray --replicas 2`` (Ray started on this machine, or
``--ray-address auto`` to join a cluster) or ``serve run stream_dit.ray:app replicas=2``.
"""

from .app import app, build_app
from .options import RayServeOptions

__all__ = ["RayServeOptions", "app", "build_app"]
