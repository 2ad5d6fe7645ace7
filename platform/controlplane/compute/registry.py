"""Chooses the compute backend from settings, once per process."""

from __future__ import annotations

from functools import lru_cache

from django.conf import settings

from controlplane.compute.base import ComputeBackend


@lru_cache(maxsize=1)
def get_compute_backend() -> ComputeBackend:
    if settings.FLEETYARD_COMPUTE_BACKEND == "ray":
        from controlplane.compute.ray_backend import RayComputeBackend

        return RayComputeBackend(address=settings.RAY_ADDRESS or "auto")
    from controlplane import celery_app
    from controlplane.compute.memory import PROCESS_LOCAL, InMemoryComputeBackend
    from controlplane.compute.topology import load_topology

    backend = InMemoryComputeBackend.from_topology(load_topology())
    if not celery_app.conf.task_always_eager:  # a Celery worker deploys the services, the web server calls them
        backend.process_note = PROCESS_LOCAL
    return backend
