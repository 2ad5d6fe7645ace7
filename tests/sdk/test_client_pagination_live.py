"""Client.paginate against the real app (live_server): a job that leaves a filtered list while the list is read does
not make the SDK miss another one. With page numbers it did (QA): cancelling a job of the first page of
`state=QUEUED` shifted the rest back a place, so the first job of the next page had already passed. The SDK reads by
the API's cursor now (`?cursor=`, keyset), and falls back to page numbers on a server without it."""

from __future__ import annotations

import pytest

from controlplane.cluster.models import Node
from fleetyard import Client
from fleetyard.errors import BadRequest
from jobs.models import TrainingJob

pytestmark = pytest.mark.django_db(transaction=True)

JOB = """\
name: {name}
queue: default
workers: 1
resources:
  accelerators: H100:8
hyperparameters: {{steps: 100}}
"""


@pytest.fixture
def queued(live):
    Node.objects.update(cordoned=True)  # nothing is admitted: the jobs wait
    client = Client(live.url, live.token)
    ids = [client.apply_spec(JOB.format(name=f"wait-{n}"))["object"]["id"] for n in range(5)]
    assert set(TrainingJob.objects.filter(pk__in=ids).values_list("state", flat=True)) == {"QUEUED"}
    return client, ids


def test_a_job_leaving_the_filtered_list_does_not_hide_another(queued):
    client, ids = queued
    seen, cancelled = [], None
    for job in client.training_jobs(state="QUEUED", page_size=2):
        seen.append(job.id)
        if len(seen) == 2 and cancelled is None:  # the first page is read: one of its jobs ends
            cancelled = client.cancel_training_job(seen[0]).id
    assert sorted(seen) == sorted(ids), f"missed {sorted(set(ids) - set(seen))}"
    assert client.training_job(cancelled).state == "CANCELLED"


def test_a_server_without_the_cursor_is_read_by_page_numbers(queued, monkeypatch):
    """An older server refuses `cursor` (a 400 naming it): the SDK reads that list by page numbers."""
    client, ids = queued
    real = Client.request

    def older_server(self, method, path, **kwargs):
        if "cursor" in (kwargs.get("params") or {}) or "cursor=" in path:
            raise BadRequest("400: cursor: unknown query parameter", status=400,
                             body={"cursor": ["unknown query parameter; accepted: page, page_size"]})
        return real(self, method, path, **kwargs)

    monkeypatch.setattr(Client, "request", older_server)
    assert sorted(job.id for job in client.training_jobs(page_size=2)) == sorted(ids)
