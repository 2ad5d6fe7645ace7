"""Training jobs through the REST API: bugs found by a QA pass (2026-11-29), each with the request that showed it."""

from __future__ import annotations

import pytest
from django.test import TestCase

from controlplane.tenancy.models import AuditEvent
from jobs.models import TrainingJob, TrainingJobEvent
from tests.conftest import JOB_BODY

ENTRYPOINT = {"trainer": "entrypoint", "entrypoint": "python train.py"}


def submit(client, **overrides):
    with TestCase.captureOnCommitCallbacks(execute=True):
        return client.post("/api/v1/training-jobs/", {**JOB_BODY, **overrides}, format="json")


@pytest.mark.parametrize("overrides,where", [
    ({**ENTRYPOINT, "hyperparameters": {"tag": "a\x00b"}}, "'tag'"),
    ({**ENTRYPOINT, "hyperparameters": {"tag\x00": 1}}, "'tag\\x00'"),
    ({**ENTRYPOINT, "hyperparameters": {"grid": {"lrs": [0.1, "x\x00"]}}}, "'grid.lrs[1]'"),
])
def test_a_nul_in_hyperparameters_is_a_400_naming_them_and_writes_nothing(api, overrides, where):
    """An entrypoint job's hyperparameters are free-form JSON: a NUL character in a key or a string was stored as is,
    which PostgreSQL's jsonb refuses ("unsupported Unicode escape sequence"): a 500 there, a 201 on SQLite."""
    response = submit(api("alpha", "member"), **overrides)
    assert response.status_code == 400, response.json()
    assert "NUL" in response.json()["hyperparameters"][0] and where in response.json()["hyperparameters"][0]
    assert not TrainingJob.objects.exists() and not TrainingJobEvent.objects.exists()
    assert not AuditEvent.objects.filter(action__startswith="training").exists()
