"""Training jobs through the REST API: bugs found by a QA pass (2026-11-29), each with the request that showed it."""

from __future__ import annotations

import pytest
from django.test import TestCase
from django.utils import timezone

from controlplane.tenancy.models import AuditEvent
from jobs.models import TrainingJob, TrainingJobEvent, TrainingLogLine, TrainingMetric
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


def test_since_step_is_refused_by_the_logs_and_still_read_by_the_metrics(api):
    """A log line has no step: `GET .../logs/?since_step=100` was accepted and ignored, listing every line from step 0
    as if they came after step 100."""
    client = api("alpha", "member")
    job = TrainingJob.objects.get(pk=submit(client).json()["id"])
    now = timezone.now()
    TrainingLogLine.objects.bulk_create([TrainingLogLine(job=job, worker=0, line=f"line {i}", recorded_at=now)
                                         for i in range(3)])
    TrainingMetric.objects.bulk_create([TrainingMetric(job=job, step=step, worker=0, recorded_at=now)
                                        for step in (50, 100, 150)])
    refused = client.get(f"/api/v1/training-jobs/{job.pk}/logs/?since_step=100")
    assert refused.status_code == 400, refused.json()
    assert "unknown field" in refused.json()["since_step"][0]
    assert len(client.get(f"/api/v1/training-jobs/{job.pk}/logs/").json()["results"]) == 3
    metrics = client.get(f"/api/v1/training-jobs/{job.pk}/metrics/?since_step=100").json()["results"]
    assert [row["step"] for row in metrics] == [100, 150]
    schema = client.get("/api/v1/schema/?format=json").json()["paths"]
    names = lambda path: {p["name"] for p in schema[path]["get"]["parameters"]}  # noqa: E731
    assert "since_step" not in names("/api/v1/training-jobs/{id}/logs/")
    assert "since_step" in names("/api/v1/training-jobs/{id}/metrics/")


@pytest.mark.parametrize("endpoint", ["logs", "metrics"])
def test_a_repeated_stream_parameter_is_refused_not_the_last_one_taken(api, endpoint):
    """`?after=1&after=2` read only the last `after` (QueryDict.dict()), so a client that added its cursor to a URL
    already holding one skipped rows without a word; a repeated `page` or `page_size` of a list is a 400 too."""
    client = api("alpha", "member")
    job = submit(client).json()
    response = client.get(f"/api/v1/training-jobs/{job['id']}/{endpoint}/?after=1&after=2&limit=5")
    assert response.status_code == 400, response.json()
    assert response.json() == {"after": ["give this parameter once"]}
    assert client.get(f"/api/v1/training-jobs/{job['id']}/{endpoint}/?after=1&limit=5").status_code == 200


@pytest.mark.parametrize("path,query", [
    ("{id}/faults/", "kind=hang"), ("{id}/checkpoints/", "step=10"), ("goodput/", "team=beta"),
    ("goodput/", "state=RUNNING"),
])
def test_reads_that_take_no_query_parameters_refuse_them_by_name(api, path, query):
    """Lists ignored nothing since an earlier pass, but these reads did: `goodput/?team=beta` answered for every team
    the caller sees, and `faults/?kind=hang` listed every fault, as if they had been filtered."""
    client = api("alpha", "member")
    url = "/api/v1/training-jobs/" + path.format(id=submit(client).json()["id"])
    name = query.split("=")[0]
    response = client.get(f"{url}?{query}")
    assert response.status_code == 400, response.json()
    assert response.json() == {name: ["unknown query parameter; accepted: format"]}
    assert client.get(url).status_code == 200 and client.get(f"{url}?format=json").status_code == 200


def test_an_env_value_longer_than_the_os_passes_to_a_process_is_a_400(api):
    """Linux gives a process no `NAME=value` over 128 KiB (MAX_ARG_STRLEN): a 200 KB value was a 201, and every start
    of the workers' command then failed with E2BIG ("Argument list too long") until the job failed."""
    client = api("alpha", "member")
    refused = submit(client, **ENTRYPOINT, envs={"BIG": "x" * (131071 - 3)})  # "BIG=" + value: 131,072 bytes
    assert refused.status_code == 400, refused.json()
    assert "BIG" in refused.json()["envs"][0] and "131,071 bytes per variable" in refused.json()["envs"][0]
    assert not TrainingJob.objects.exists()
    accepted = submit(client, **ENTRYPOINT, envs={"BIG": "x" * (131071 - 4)})
    assert accepted.status_code == 201, accepted.json()


@pytest.mark.parametrize("endpoint", ["logs", "metrics"])
def test_logs_and_metrics_take_the_format_parameter_as_every_endpoint_does(api, endpoint):
    """`?format=json` (DRF's renderer choice, accepted by the job list, its detail, events, faults...) was a 400
    "unknown field" on these two."""
    client = api("alpha", "member")
    job = submit(client).json()
    response = client.get(f"/api/v1/training-jobs/{job['id']}/{endpoint}/?format=json&limit=5")
    assert response.status_code == 200, response.json()
    assert response.json() == {"results": [], "next_after": None}


def test_env_values_reach_the_job_as_sent_whitespace_included(api):
    """DRF's CharField trims whitespace: {"SEP": " ", "PROMPT": "> "} was stored as {"SEP": "", "PROMPT": ">"}, a
    different program input than the one sent (the spec's secrets were already kept as sent)."""
    envs = {"SEP": " ", "PROMPT": "> ", "LINES": "a\nb\n"}
    response = submit(api("alpha", "member"), **ENTRYPOINT, envs=envs)
    assert response.status_code == 201, response.json()
    assert response.json()["spec"]["envs"] == envs
    assert TrainingJob.objects.get().envs == envs


def test_at_the_submission_limit_a_request_the_model_refuses_is_a_400_not_a_429(api, settings):
    """The model's rules (full_clean: a name of lowercase letters, digits and dashes; DRF's SlugField takes "Bad_Name")
    were checked after the rate limit, so at the limit such a request was told to retry in 60 s, then refused."""
    settings.FLEETYARD_MAX_SUBMISSIONS_PER_TEAM_PER_MINUTE = 1
    client = api("alpha", "member")
    assert submit(client, name="first").status_code == 201
    refused = submit(client, name="Bad_Name")
    assert refused.status_code == 400, refused.json()
    assert "name" in refused.json()
    assert submit(client, name="second").status_code == 429  # a valid one still waits for its slot
    assert TrainingJob.objects.count() == 1


def test_an_entrypoint_job_refuses_hyperparameters_nothing_would_pass_on(api):
    """QA (2026-11-29): an entrypoint job's hyperparameters were stored (201) and never reached its command; the spec
    already refused them ("use envs")."""
    response = submit(api("alpha", "member"), **ENTRYPOINT, hyperparameters={"lr": 0.1})
    assert response.status_code == 400 and "as envs" in response.json()["hyperparameters"][0], response.json()
    assert "built-in trainer" in response.json()["hyperparameters"][0]
    assert not TrainingJob.objects.exists()
    assert submit(api("alpha", "member"), **ENTRYPOINT, envs={"LR": "0.1"}).status_code == 201


def test_retrying_an_entrypoint_job_stored_with_hyperparameters_drops_them(api):
    """A job stored before the refusal retries (its hyperparameters never reached the command, and would be refused)."""
    client = api("alpha", "member")
    job_id = submit(client, **ENTRYPOINT).json()["id"]
    TrainingJob.objects.filter(pk=job_id).update(hyperparameters={"lr": 0.1}, state="FAILED")
    with TestCase.captureOnCommitCallbacks(execute=True):
        retried = client.post(f"/api/v1/training-jobs/{job_id}/retry/", format="json")
    assert retried.status_code == 201, retried.json()
    assert TrainingJob.objects.get(pk=retried.json()["id"]).hyperparameters == {}


def test_more_environment_variables_than_a_process_can_be_given_are_a_400(api):
    client = api("alpha", "member")
    many = {f"V{i}": "x" for i in range(1001)}
    response = submit(client, envs=many)
    assert response.status_code == 400 and "at most 1,000" in response.json()["envs"][0], response.json()
    assert not TrainingJob.objects.exists()
    assert submit(client, envs=dict(list(many.items())[:1000])).status_code == 201


@pytest.mark.parametrize("query", ["state=FAILED", "name=other", "search=other", "queue=nope", "ordering=name",
                                   "page=2", "stat=QUEUED"])
def test_a_jobs_own_routes_refuse_list_filters_instead_of_filtering_the_job_away(api, query):
    """`GET /api/v1/training-jobs/ID/?state=FAILED` of a queued job ran the list's filters on the lookup and answered
    404, as if the job did not exist (and so did its cancel, retry and delete). A job's own routes read no query
    parameter but `format`: a 400 naming the parameter, and nothing is written."""
    client = api("alpha", "member")
    job = TrainingJob.objects.get(pk=submit(client).json()["id"])
    url = f"/api/v1/training-jobs/{job.pk}/"
    name = query.partition("=")[0]
    refused = {name: ["unknown query parameter; accepted: format"]}
    for response in (client.get(f"{url}?{query}"), client.post(f"{url}cancel/?{query}", {}, format="json"),
                     client.post(f"{url}retry/?{query}", format="json"), client.delete(f"{url}?{query}")):
        assert response.status_code == 400 and response.json() == refused, (response.status_code, response.json())
    job.refresh_from_db()
    assert job.state == "QUEUED" and TrainingJob.objects.count() == 1
    assert client.get(f"{url}?format=json").json()["id"] == job.pk
    assert client.get("/api/v1/training-jobs/?state=FAILED").json()["results"] == []  # the list still filters
    assert [row["id"] for row in client.get("/api/v1/training-jobs/?state=QUEUED").json()["results"]] == [job.pk]
