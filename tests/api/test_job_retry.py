"""Retrying an ended training job: POST /api/v1/training-jobs/<id>/retry/ and training_job_retry."""

from __future__ import annotations

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import TestCase

from controlplane.common.errors import ConflictError
from controlplane.datasets.services import dataset_create, dataset_version_upload
from controlplane.tenancy.models import AuditEvent
from jobs.models import TrainingJob
from jobs.services import training_job_cancel, training_job_create, training_job_retry
from jobs.states import JobState


def make_job(world, name="train-lm", **extra) -> TrainingJob:
    alpha = world["alpha"]
    with TestCase.captureOnCommitCallbacks(execute=True):
        return training_job_create(actor=alpha["member"], team=alpha["team"], name=name,
                                   local_queue=alpha["queue"], accelerator_types=["nvidia-h100", "nvidia-a100"],
                                   **extra)


def retry(client, job):
    with TestCase.captureOnCommitCallbacks(execute=True):
        return client.post(f"/api/v1/training-jobs/{job.pk}/retry/", format="json")


def ended(world, job, state=JobState.CANCELLED) -> TrainingJob:
    if state == JobState.CANCELLED:
        training_job_cancel(actor=world["alpha"]["admin"], job=job, reason="wrong learning rate")
    else:
        TrainingJob.objects.filter(pk=job.pk).update(state=state)
    job.refresh_from_db()
    return job


def test_retry_copies_the_spec_and_secrets_under_a_new_name(world, api):
    alpha = world["alpha"]
    dataset = dataset_create(actor=alpha["admin"], team=alpha["team"], name="tales")
    version = dataset_version_upload(actor=alpha["admin"], dataset=dataset,
                                     upload=SimpleUploadedFile("tales.txt", b"once upon a time"))
    job = make_job(world, workers_min=2, workers_max=4, devices_per_worker=4, cpus_per_worker=2.0,
                   priority_class=world["priority"], hyperparameters={"steps": 50, "lr": 0.01},
                   envs={"MODE": "offline"}, secret_envs={"HF_TOKEN": "s3cret"}, dataset_version=version,
                   checkpoint_interval_steps=25, checkpoint_keep_last=2, max_restarts=5,
                   max_duration_seconds=3600)
    job = ended(world, job)

    response = retry(api("alpha", "member"), job)
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["name"] == "train-lm-retry-1" and body["id"] != job.pk
    spec = body["spec"]
    assert spec["queue"] == "default" and spec["priority"] == "standard"
    assert spec["accelerator_types"] == ["nvidia-h100", "nvidia-a100"]
    assert (spec["workers_min"], spec["workers_max"], spec["devices_per_worker"]) == (2, 4, 4)
    assert spec["cpus_per_worker"] == 2.0
    assert spec["hyperparameters"] == {"steps": 50, "lr": 0.01}
    assert spec["envs"] == {"MODE": "offline"}
    assert spec["secrets"] == ["HF_TOKEN"]  # names only; the values stay server-side
    assert "s3cret" not in response.content.decode()
    assert spec["dataset"] == "dataset://tales@1"
    assert spec["checkpoint"] == {"interval_steps": 25, "keep_last": 2}
    assert spec["max_restarts"] == 5 and spec["max_duration_seconds"] == 3600

    new = TrainingJob.objects.get(pk=body["id"])
    assert new.secret_envs == {"HF_TOKEN": "s3cret"}
    assert new.state == JobState.QUEUED  # enqueued like any submitted job
    assert new.created_by == alpha["member"]
    first = new.events.order_by("id").first()
    assert first.to_state == "PENDING" and f"retry of job {job.pk}" in first.reason
    assert first.actor_label == "alpha-member"
    actions = set(AuditEvent.objects.filter(target_id=str(new.pk)).values_list("action", flat=True))
    assert {"training_job.create", "training_job.retry"} <= actions
    audit = AuditEvent.objects.get(action="training_job.retry")
    assert audit.data["retry_of"] == job.pk
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED  # the original is untouched


def test_retry_names_count_up_and_a_retry_of_a_retry_keeps_the_base(world, api):
    job = ended(world, make_job(world))
    client = api("alpha", "member")
    assert retry(client, job).json()["name"] == "train-lm-retry-1"
    assert retry(client, job).json()["name"] == "train-lm-retry-2"
    second = ended(world, TrainingJob.objects.get(name="train-lm-retry-2"))
    assert retry(client, second).json()["name"] == "train-lm-retry-3"


def test_retry_name_stays_within_63_characters(world):
    job = ended(world, make_job(world, name="a" * 63))
    new = training_job_retry(actor=world["alpha"]["member"], job=job)
    assert len(new.name) <= 63 and new.name.endswith("-retry-1")


def test_retries_of_a_long_name_with_dashes_at_the_cut_get_different_names(world):
    """The names already taken were looked up by the first 40 characters of the name; a retry's name is trimmed and
    then loses its trailing dashes, so for a name whose 40th character is a dash no earlier retry was found and the
    second retry took the first one's name (QA)."""
    job = ended(world, make_job(world, name="a" * 30 + "-" * 32 + "b"))
    first = training_job_retry(actor=world["alpha"]["member"], job=job)
    second = training_job_retry(actor=world["alpha"]["member"], job=job)
    assert (first.name, second.name) == ("a" * 30 + "-retry-1", "a" * 30 + "-retry-2")


def test_a_retry_picks_its_name_under_the_teams_submission_lock(world, monkeypatch):
    """Retries of one family (`lm`, `lm-retry-1`) lock different job rows, so two at once could both pick
    `lm-retry-2`: the name is chosen after the team's submission lock is taken."""
    import jobs.services as services

    calls = []
    lock, name = services.lock_team_submissions, services._retry_name
    monkeypatch.setattr(services, "lock_team_submissions", lambda **kw: (calls.append("lock"), lock(**kw))[1])
    monkeypatch.setattr(services, "_retry_name", lambda **kw: (calls.append("name"), name(**kw))[1])
    training_job_retry(actor=world["alpha"]["member"], job=ended(world, make_job(world)))
    assert calls[:2] == ["lock", "name"], calls


@pytest.mark.parametrize("state", [JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED])
def test_every_ended_state_can_be_retried(world, api, state):
    job = ended(world, make_job(world), state)
    assert retry(api("alpha", "member"), job).status_code == 201


@pytest.mark.parametrize("state", [JobState.QUEUED, JobState.RUNNING, JobState.PREEMPTED])
def test_a_live_job_cannot_be_retried(world, api, state):
    job = make_job(world)
    TrainingJob.objects.filter(pk=job.pk).update(state=state)
    response = retry(api("alpha", "member"), job)
    assert response.status_code == 409
    assert "only a job that ended" in response.json()["state"][0]
    assert TrainingJob.objects.count() == 1
    with pytest.raises(ConflictError):
        training_job_retry(actor=world["alpha"]["member"], job=job)


def test_viewers_cannot_retry_and_other_teams_see_nothing(world, api):
    job = ended(world, make_job(world))
    viewer = retry(api("alpha", "viewer"), job)
    assert viewer.status_code == 403 and "member role" in viewer.json()["detail"]
    assert retry(api("beta", "admin"), job).status_code == 404
    assert TrainingJob.objects.count() == 1


def test_retry_still_checks_the_queue_quota(world, api):
    """The copy is validated like a new submission: a queue that lost its quota for a type rejects it."""
    from controlplane.quotas.models import ResourceQuota

    job = ended(world, make_job(world))
    ResourceQuota.objects.filter(accelerator_type__slug="nvidia-a100").delete()
    response = retry(api("alpha", "member"), job)
    assert response.status_code == 400
    assert "no quota for nvidia-a100" in response.json()["accelerator_types"][0]
    assert TrainingJob.objects.count() == 1
