"""The Ray Serve application: an ingress and ``N`` replicas, built from :class:`RayServeOptions`.

``serve run stream_dit.ray:app replicas=2 preset=tiny`` calls :func:`app` with those arguments;
Python code calls :func:`build_app` with options and runs it with ``serve.run``.
"""

from __future__ import annotations

from typing import Any

import torch
from ray import serve
from ray.serve import Application

from .ingress import StreamIngress
from .options import RayServeOptions
from .replica import StreamReplica

__all__ = ["app", "build_app", "gpus_per_replica", "replica_deployment_options"]

#: Requests the ingress takes at once (bodies being read, requests waiting for a replica): far
#: above what its limits let through, so that its own answers, not the proxy's queue, decide.
INGRESS_MAX_ONGOING = 4096


def gpus_per_replica(options: RayServeOptions) -> float:
    """The GPUs each replica asks for: the option, else 1 where the cluster (or, without a
    running Ray, this machine) has a GPU, else 0."""
    if options.gpus_per_replica is not None:
        return options.gpus_per_replica
    import ray

    if ray.is_initialized():
        return 1.0 if ray.cluster_resources().get("GPU", 0) > 0 else 0.0
    return 1.0 if torch.cuda.is_available() else 0.0


def replica_deployment_options(options: RayServeOptions, gpus: float) -> dict[str, Any]:
    """Ray Serve's settings of the ``StreamReplica`` deployment (``serve.deployment`` keywords)."""
    scaling: dict[str, Any] = {}
    if options.autoscaling:
        scaling["autoscaling_config"] = options.autoscaling_config()
    else:
        scaling["num_replicas"] = options.replicas or 1
    return {
        "name": "StreamReplica",
        "ray_actor_options": {"num_cpus": options.cpus_per_replica, "num_gpus": gpus},
        # the router never sends a replica more than its session holds; the ingress bounds
        # what waits for a replica (ReplicaRouter.capacity)
        "max_ongoing_requests": options.replica_capacity,
        "health_check_period_s": options.health_check_period_s,
        "health_check_timeout_s": max(10.0, 5 * options.health_check_period_s),
        **scaling,
    }


def build_app(options: RayServeOptions | None = None) -> Application:
    """The stream-dit application of ``options``: deploy it with ``serve.run(app, name=...,
    route_prefix="/")`` (``name`` should be ``options.app_name``, which names its health
    board)."""
    options = options or RayServeOptions()
    gpus = gpus_per_replica(options)
    spec = options.spec.with_device("cuda" if gpus > 0 else "cpu")
    threads = options.torch_threads or (None if gpus > 0 else 1)
    replicas = serve.deployment(StreamReplica, **replica_deployment_options(options, gpus)).bind(
        spec, dict(options.limits), threads, options.app_name
    )
    ingress = serve.deployment(
        StreamIngress,
        name="StreamIngress",
        num_replicas=1,
        ray_actor_options={"num_cpus": 0},
        max_ongoing_requests=INGRESS_MAX_ONGOING,
    )
    return ingress.bind(replicas, options)


def app(args: dict[str, Any]) -> Application:
    """The application builder of ``serve run stream_dit.ray:app key=value ...`` and of the
    ``import_path`` of a Serve config file (see :meth:`RayServeOptions.from_args`)."""
    return build_app(RayServeOptions.from_args(args))
