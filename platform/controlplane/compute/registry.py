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
    from controlplane.compute.memory import InMemoryComputeBackend
    from controlplane.compute.topology import load_topology

    return InMemoryComputeBackend.from_topology(load_topology())
