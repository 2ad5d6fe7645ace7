"""RayComputeBackend gives every caller thread the same DeploymentHandle with one router.

Ray Serve creates a handle's router on its first call, without a lock. Callers in several threads at once each
created one; the routers left over were never shut down, and with autoscaling on, their metrics pushers kept
running after Serve and Ray shut down and started a local Ray head in the gateway process every 30 s (found by
tests/integration/test_serving_on_ray.py's SLA scale-out test: a 91 s teardown). The fake below creates routers
the way Serve does (check, then create, with a pause between), so the race is there to lose.
"""

from __future__ import annotations

import threading
import time

from controlplane.compute.ray_backend import RayComputeBackend


class FakeHandle:
    routers_created = 0

    def __init__(self):
        self._router = None

    def options(self, **_):
        if self._router is None:  # as DeploymentHandle._options -> _init: no lock
            time.sleep(0.01)
            FakeHandle.routers_created += 1
            self._router = object()
        return self


class FakeServe:
    def __init__(self):
        self.handle = FakeHandle()

    def get_deployment_handle(self, name, app_name):  # Serve caches one handle per deployment
        return self.handle


def test_concurrent_first_calls_create_one_router(monkeypatch):
    backend = RayComputeBackend(address="auto")
    serve = FakeServe()
    monkeypatch.setattr(backend, "_serve", lambda: serve)
    FakeHandle.routers_created = 0
    barrier = threading.Barrier(8)
    got = []

    def caller():
        barrier.wait()
        got.append(backend._service_handle("fy-serve-1").options(stream=True))

    threads = [threading.Thread(target=caller) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert len(got) == 8 and FakeHandle.routers_created == 1
