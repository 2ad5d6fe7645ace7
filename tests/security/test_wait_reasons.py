"""A job's or deployment's reason, as its team reads it (API and console), names no other team's workload by id:
"launches once another team's job checkpoints and stops", "preempted for another team's job (...)". The stored reason
is unchanged (README, Scheduling)."""

from __future__ import annotations

import pytest
from django.test import Client, TestCase

from controlplane.quotas.services import priority_class_create
from jobs.models import TrainingJob
from tests.conftest import JOB_BODY


@pytest.fixture(autouse=True)
def admission_only(monkeypatch):
    from jobs.tasks import launch_training_job, stop_training_run

    monkeypatch.setattr(launch_training_job, "apply_async", lambda *args, **kwargs: None)
    monkeypatch.setattr(stop_training_run, "apply_async", lambda *args, **kwargs: None)


def submit(client, **overrides) -> int:
    with TestCase.captureOnCommitCallbacks(execute=True):
        response = client.post("/api/v1/training-jobs/", {**JOB_BODY, **overrides}, format="json")
    assert response.status_code == 201, response.json()
    return response.json()["id"]


def test_a_preemption_across_teams_names_neither_teams_job_to_the_other(api, demo_cluster, world):
    priority_class_create(actor=world["ops"], name="urgent", value=1000)
    alpha, beta = api("alpha", "viewer"), api("beta", "viewer")
    # a few alpha jobs first, so that the ids differ from any count in the texts
    for i in range(3):
        TrainingJob.objects.create(team=world["alpha"]["team"], name=f"filler-{i}", local_queue=world["alpha"]["queue"],
                                   accelerator_types=["nvidia-h100"])
    victim = submit(api("beta", "member"), name="low", workers_min=2, workers_max=2,
                    accelerator_types=["nvidia-h100"])
    TrainingJob.objects.filter(pk=victim).update(state="RUNNING", compute_handle="fy-beta", current_step=10)
    urgent = submit(api("alpha", "member"), name="urgent", workers_min=2, workers_max=2,
                    accelerator_types=["nvidia-h100"], priority="urgent")
    stored = TrainingJob.objects.get(pk=urgent).state_reason
    assert f"job {victim} checkpoints and stops" in stored  # kept for operators (Django admin)

    shown = alpha.get(f"/api/v1/training-jobs/{urgent}/").json()["status"]["reason"]
    assert "another team's job checkpoints and stops" in shown and str(victim) not in shown, shown
    listed = next(j for j in alpha.get("/api/v1/training-jobs/").json()["results"] if j["id"] == urgent)
    assert str(victim) not in listed["status"]["reason"]
    for event in alpha.get(f"/api/v1/training-jobs/{urgent}/events/").json()["results"]:
        assert str(victim) not in event["reason"], event
        assert event["data"].get("waits_for") in (None, [None]), event

    preempted = [e for e in beta.get(f"/api/v1/training-jobs/{victim}/events/").json()["results"]
                 if e["to_state"] == "PREEMPTED"][-1]
    assert "preempted for another team's job (" in preempted["reason"], preempted
    assert str(urgent) not in preempted["reason"] and preempted["data"]["for"] is None

    # the console, as the API
    browser = Client()
    browser.force_login(world["alpha"]["viewer"])
    page = browser.get(f"/jobs/{urgent}/").content.decode()
    assert "another team&#x27;s job checkpoints and stops" in page and f"job {victim} " not in page
    browser.force_login(world["beta"]["viewer"])
    page = browser.get(f"/jobs/{victim}/").content.decode()
    assert "preempted for another team&#x27;s job" in page and f"job {urgent} " not in page


def test_own_ids_stay_and_every_form_of_another_teams_id_is_replaced(world):
    from jobs.selectors import reason_shown_for_team

    alpha, beta = world["alpha"], world["beta"]

    def job(team):
        return TrainingJob.objects.create(team=team["team"], name="j", local_queue=team["queue"],
                                          accelerator_types=["nvidia-h100"]).pk

    mine, other, other2 = job(alpha), job(beta), job(beta)
    team = alpha["team"].pk
    cases = {
        f"launches once job {other} checkpoints and stops": "launches once another team's job checkpoints and stops",
        f"launches once job {mine} checkpoints and stops": f"launches once job {mine} checkpoints and stops",
        f"launches once jobs {mine}, {other}, {other2} checkpoint and stop":
            f"launches once job {mine} and 2 jobs of other teams checkpoint and stop",
        f"preempted for job {other} (lower priority)": "preempted for another team's job (lower priority)",
        f"waiting for {other} (shrunk), {mine} to checkpoint and release nvidia-h100 devices":
            f"waiting for {mine}, another team's job to checkpoint and release nvidia-h100 devices",
        f"admitted onto the devices of {other}, preempted for it before they started":
            "admitted onto the devices of another team's job, preempted for it before they started",
        f"admitted: x; {other} preempted or shrunk for it":
            "admitted: x; another team's job preempted or shrunk for it",
        f"(8 nvidia-h100 of shared's quota set aside for {other}, which waits ahead of it)":
            "(8 nvidia-h100 of shared's quota set aside for another team's job, which waits ahead of it)",
        "held by deployment 999999's replica": "held by another team's deployment's replica",
        f"lends only 0 now; lower-priority {other}, {mine} (16 nvidia-h100 devices), which it may preempt, are "
        "starting": f"lends only 0 now; lower-priority {mine}, another team's job (16 nvidia-h100 devices), which it "
                    "may preempt, are starting",
        f"launches once job {other} (cancelled) has stopped":
            "launches once another team's job (cancelled) has stopped",
        "position 2 in cluster queue shared: needs to borrow 8 nvidia-a100": "position 2 in cluster queue shared: "
                                                                            "needs to borrow 8 nvidia-a100",
    }
    for text, expected in cases.items():
        assert reason_shown_for_team(text=text, team_id=team) == expected, text
