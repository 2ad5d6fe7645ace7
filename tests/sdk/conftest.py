"""Fixtures for the SDK and CLI tests: the real Django app served over HTTP (pytest-django's live_server)
with the demo cluster on the in-memory compute backend, and a team token."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from django.db import close_old_connections

from controlplane.compute.memory import InMemoryComputeBackend
from controlplane.tenancy.services import api_token_create
from jobs import tasks, workflows
from jobs.models import TrainingJob


@pytest.fixture
def live(live_server, world, demo_cluster, monkeypatch, settings, tmp_path):
    settings.DATA_DIR = tmp_path
    backend = InMemoryComputeBackend.from_topology(demo_cluster)
    backend.steps_per_observe = 40
    monkeypatch.setattr(tasks, "get_compute_backend", lambda: backend)
    monkeypatch.setattr("jobs.api.views.get_compute_backend", lambda: backend)
    member = world["alpha"]["member"]
    _, token = api_token_create(actor=member, team=world["alpha"]["team"], user=member, name="sdk")
    monkeypatch.delenv("FLEETYARD_URL", raising=False)
    monkeypatch.delenv("FLEETYARD_TOKEN", raising=False)
    monkeypatch.setenv("FLEETYARD_CONFIG", str(tmp_path / "fleetyard-config.json"))

    def sync_until_done(name: str, *, timeout: float = 60) -> TrainingJob:
        """Play the beat's part: sync the named job's run until it ends (the memory backend's steps)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            close_old_connections()
            job = TrainingJob.objects.filter(name=name).first()
            if job is not None and job.is_terminal:
                return job
            if job is not None and job.compute_handle:
                workflows.training_job_sync(job_id=job.pk, backend=backend)
            time.sleep(0.2)
        raise AssertionError(f"job {name} did not end in {timeout} s")

    return SimpleNamespace(url=live_server.url, token=token, backend=backend, world=world,
                           sync_until_done=sync_until_done)
