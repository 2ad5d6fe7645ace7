"""The console with each role and odd input, second QA pass (2026-12-07). Each test failed on the code before its
fix."""

from __future__ import annotations

import html as html_lib
import json
import re

from django.test import Client

from controlplane.common.lifecycle import record_event
from inference.models import DeploymentEvent
from jobs.models import TrainingJob, TrainingJobEvent
from jobs.services import training_job_create
from tests.api.test_console_deployments import make_deployment


def session(user) -> Client:
    client = Client(raise_request_exception=False)
    client.force_login(user)
    return client


def make_job(team_world, name: str, **extra) -> TrainingJob:
    return training_job_create(actor=team_world["admin"], team=team_world["team"], name=name,
                               local_queue=team_world["queue"], **{"accelerator_types": ["nvidia-h100"], **extra})


def event_data_shown(page: str) -> list[dict]:
    """The JSON of every timeline event's "data" block on a console page."""
    return [json.loads(html_lib.unescape(text)) for text in
            re.findall(r"<summary>data</summary><pre class=\"code\">(.*?)</pre>", page, re.S)]


def test_the_timeline_data_hides_another_teams_ids_as_the_api_does(world):
    """A job's or a deployment's timeline showed each event's data as stored: the scheduler's `for` (the preemptor)
    and `waits_for` (the victims) named another team's job by id, which the API's events endpoint and every reason
    hide (null there). The console shows the data as the API does; the team's own ids stay."""
    alpha, beta = world["alpha"], world["beta"]
    for i in range(3):  # ids that differ from any count on the page
        make_job(beta, f"filler-{i}")
    theirs, mine = make_job(beta, "theirs"), make_job(alpha, "mine")
    record_event(obj=mine, event_model=TrainingJobEvent, from_state="QUEUED", to_state="PREEMPTED", reason="preempted",
                 system="scheduler", data={"for": theirs.pk, "waits_for": [theirs.pk, mine.pk]})
    deployment = make_deployment(alpha, "chat")
    record_event(obj=deployment, event_model=DeploymentEvent, from_state="SERVING", to_state="SERVING",
                 reason="shrunk", system="scheduler", data={"for": theirs.pk})
    client = session(alpha["viewer"])
    api = client.get(f"/api/v1/training-jobs/{mine.pk}/events/").json()["results"]
    assert [e["data"] for e in api if e["data"]] == [{"for": None, "waits_for": [None, mine.pk]}]

    assert event_data_shown(client.get(f"/jobs/{mine.pk}/").content.decode()) == [
        {"for": None, "waits_for": [None, mine.pk]}]
    assert {"for": None} in event_data_shown(client.get(f"/deployments/{deployment.pk}/").content.decode())
