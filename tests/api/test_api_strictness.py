"""The README's promise for every invalid request (a 4xx JSON body naming the field and the reason, unknown fields
and query parameters too, and nothing written), on the holes a QA pass found: action endpoints that took any
body, list endpoints that ignored unknown parameters and orderings, environment variable names the workers'
OS refuses, and bounds reported under a column's name instead of the field sent."""

from __future__ import annotations

import pytest
from django.test import TestCase

from controlplane.cluster.models import Node, NodePool
from controlplane.cluster.services import node_pool_create
from controlplane.quotas.models import PriorityClass
from controlplane.tenancy.models import ApiToken
from controlplane.tenancy.services import api_token_create
from jobs.models import TrainingJob
from tests.api.test_job_retry import ended, make_job
from tests.api.test_jobs_api import submit

MAX_DURATION_SECONDS = 366 * 86400  # jobs.models.MAX_DURATION_SECONDS, a year
SPEC_HEAD = "kind: training_job\nname: from-spec\nqueue: default\nresources: {accelerators: cpu}\n"


def _refused(response, field: str) -> str:
    assert response.status_code == 400, (response.status_code, response.content[:300])
    body = response.json()
    assert field in body, body
    return " ".join(map(str, body[field])) if isinstance(body[field], list) else str(body[field])


# -- 1. unknown body fields on actions ------------------------------------------------------------------------

def test_retry_refuses_unknown_fields_and_creates_nothing(world, api):
    job = ended(world, make_job(world))
    client = api("alpha", "member")
    reason = _refused(client.post(f"/api/v1/training-jobs/{job.pk}/retry/", {"bogus": 1}, format="json"), "bogus")
    assert "unknown field" in reason
    assert TrainingJob.objects.count() == 1
    with TestCase.captureOnCommitCallbacks(execute=True):
        assert client.post(f"/api/v1/training-jobs/{job.pk}/retry/", format="json").status_code == 201
    assert TrainingJob.objects.count() == 2


def test_checkpoint_request_refuses_unknown_fields(world, api):
    job = make_job(world)
    response = api("alpha", "member").post(f"/api/v1/training-jobs/{job.pk}/checkpoints/", {"step": 5},
                                           format="json")
    _refused(response, "step")


@pytest.mark.parametrize("action,cordoned_before", [("cordon", False), ("uncordon", True)])
def test_cordon_and_uncordon_refuse_unknown_fields_and_change_nothing(world, api, accel, action, cordoned_before):
    pool = node_pool_create(actor=world["ops"], name="cpu-pool", accelerator_type=accel["cpu"], devices_per_node=1,
                            simulated=False)
    node = Node.objects.create(pool=pool, name="cpu-pool-0", cordoned=cordoned_before)
    ops = api("ops")
    reason = _refused(ops.post(f"/api/v1/nodes/{node.pk}/{action}/", {"reason": "nic", "bogus": 1}, format="json"),
                      "bogus")
    assert "reason" in reason  # the accepted fields are listed
    node.refresh_from_db()
    assert node.cordoned is cordoned_before
    assert ops.post(f"/api/v1/nodes/{node.pk}/{action}/", {"reason": "nic"}, format="json").status_code == 200
    node.refresh_from_db()
    assert node.cordoned is not cordoned_before


def test_revoke_refuses_unknown_fields_and_leaves_the_token_working(world, api):
    member = world["alpha"]["member"]
    token, _ = api_token_create(actor=member, team=world["alpha"]["team"], user=member, name="laptop")
    client = api("alpha", "member")
    _refused(client.post(f"/api/v1/api-tokens/{token.pk}/revoke/", {"bogus": 1}, format="json"), "bogus")
    assert ApiToken.objects.get(pk=token.pk).revoked_at is None
    assert client.post(f"/api/v1/api-tokens/{token.pk}/revoke/", format="json").status_code == 200
    assert ApiToken.objects.get(pk=token.pk).revoked_at is not None


def test_operator_creates_refuse_unknown_and_read_only_fields(world, api):
    ops = api("ops")
    pool = {"name": "p1", "accelerator_type": "cpu", "devices_per_node": 0, "simulated": False}
    _refused(ops.post("/api/v1/node-pools/", {**pool, "devices_per_nod": 4}, format="json"), "devices_per_nod")
    _refused(ops.post("/api/v1/node-pools/", {**pool, "node_count": 9}, format="json"), "node_count")
    assert not NodePool.objects.exists()
    assert ops.post("/api/v1/node-pools/", pool, format="json").status_code == 201
    _refused(ops.post("/api/v1/priority-classes/", {"name": "vip", "value": 9, "preemptable": False}, format="json"),
             "preemptable")
    assert not PriorityClass.objects.filter(name="vip").exists()


# -- 2. unknown query parameters and orderings on lists --------------------------------------------------------

@pytest.mark.parametrize("query,parameter", [
    ("stat=QUEUED", "stat"),               # a typo of state listed every job
    ("accelerator=nvidia-h100", "accelerator"),  # no such filter: every type was listed
    ("state=QUEUED&pagesize=5", "pagesize"),
])
def test_job_list_refuses_unknown_query_parameters(api, query, parameter):
    reason = _refused(api("alpha", "member").get(f"/api/v1/training-jobs/?{query}"), parameter)
    assert "unknown query parameter" in reason
    for accepted in ("state", "queue", "ordering", "search", "page", "page_size", "format", "created_after"):
        assert accepted in reason


def test_job_list_refuses_an_ordering_it_cannot_apply(api):
    client = api("alpha", "member")
    reason = _refused(client.get("/api/v1/training-jobs/?ordering=bogus"), "ordering")
    assert "bogus" in reason and "created_at" in reason and "state_changed_at" in reason
    _refused(client.get("/api/v1/training-jobs/?ordering=-name,cost"), "ordering")
    # by id, as benchmarks.control_plane_outage lists the jobs (the strict ordering refused it there at first)
    assert client.get("/api/v1/training-jobs/?ordering=id&page_size=500").status_code == 200
    assert client.get("/api/v1/deployments/?ordering=-id").status_code == 200


def test_a_requested_ordering_breaks_ties_by_id():
    """Rows that tie on the requested fields come in id order (found by QA: `?ordering=role` on memberships had no
    tie-breaker, so PostgreSQL could repeat or skip rows across pages; SQLite happens to be stable)."""
    from rest_framework.request import Request
    from rest_framework.test import APIRequestFactory

    from controlplane.common.filters import StrictOrderingFilter
    from controlplane.tenancy.models import Membership

    class View:
        ordering_fields = ["role", "created_at"]

    def order(query):
        request = Request(APIRequestFactory().get("/", {"ordering": query}))
        return StrictOrderingFilter().filter_queryset(request, Membership.objects.all(), View()).query.order_by

    assert order("role") == ("role", "pk")
    assert order("-created_at,role") == ("-created_at", "role", "pk")


def test_accepted_parameters_still_work(api):
    client = api("alpha", "member")
    submit(client, name="first")
    submit(client, name="second")
    url = ("/api/v1/training-jobs/?state=QUEUED&queue=default&ordering=-name&search=s&page=1&page_size=10"
           "&format=json")
    response = client.get(url)
    assert response.status_code == 200, response.content
    assert [job["name"] for job in response.json()["results"]] == ["second", "first"]
    assert client.get("/api/v1/training-jobs/?ordering=name,-created_at").status_code == 200


def test_sub_lists_and_lists_without_search_refuse_what_they_do_not_read(world, api):
    job = make_job(world)
    client = api("alpha", "member")
    _refused(client.get(f"/api/v1/training-jobs/{job.pk}/events/?state=QUEUED"), "state")
    assert client.get(f"/api/v1/training-jobs/{job.pk}/events/?page_size=5").status_code == 200
    _refused(client.get("/api/v1/memberships/?search=alpha"), "search")  # memberships have no search fields
    assert client.get("/api/v1/memberships/?role=admin&ordering=role").status_code == 200


@pytest.mark.parametrize("url,parameter", [("/api/v1/memberships/?role=", "role"),
                                           ("/api/v1/nodes/?cordoned=", "cordoned"),
                                           ("/api/v1/training-jobs/?trainer=", "trainer")])
def test_a_choice_filter_sent_empty_is_refused_not_taken_for_no_filter(api, url, parameter):
    """Found by schemathesis once `search` left the memberships' schema: `?role=` listed every membership."""
    reason = _refused(api("alpha", "member").get(url), parameter)
    assert "give one of" in reason


def test_the_schema_offers_search_only_where_a_list_searches(client):
    schema = client.get("/api/v1/schema/?format=json").json()

    def query(path):
        return {p["name"] for p in schema["paths"][path]["get"]["parameters"] if p["in"] == "query"}

    assert "search" in query("/api/v1/training-jobs/")
    assert "search" not in query("/api/v1/memberships/")


# -- 3. environment variable names ------------------------------------------------------------------------------

@pytest.mark.parametrize("envs,named", [
    ({"": "x"}, "''"),
    ({"A=B": "x"}, "'A=B'"),
    ({"A\x00": "x"}, "'A\\x00'"),
    ({"1ST": "x"}, "'1ST'"),
    ({"A\n": "x"}, "'A\\n'"),
])
def test_submit_refuses_environment_variable_names_the_workers_cannot_be_given(api, envs, named):
    reason = _refused(submit(api("alpha", "member"), envs=envs), "envs")
    assert named in reason and "environment variable name" in reason
    assert not TrainingJob.objects.exists()


def test_submit_refuses_a_nul_in_an_environment_value(api):
    _refused(submit(api("alpha", "member"), envs={"A": "x\x00y"}), "envs")
    assert not TrainingJob.objects.exists()


@pytest.mark.parametrize("line", ['envs: {"A=B": x}', 'envs: {"": x}', 'envs: {"A\\n": x}'])
def test_spec_refuses_bad_environment_variable_names_at_their_line(api, line):
    response = api("alpha", "member").post("/api/v1/specs/apply/", {"spec": SPEC_HEAD + line + "\n"}, format="json")
    _refused(response, "spec")
    (error,) = response.json()["errors"]
    assert error["line"] == 5 and error["field"].startswith("envs") and "environment variable name" in error["reason"]
    assert not TrainingJob.objects.exists()


@pytest.mark.parametrize("dry_run", ["?dry_run=1", ""])
@pytest.mark.parametrize("char", ["\x07", "\x1b", "\x7f"])
def test_spec_with_a_control_character_is_a_spec_error_at_its_line(api, dry_run, char):
    """PyYAML refuses such a character when its loader is built, before parsing: that escaped as a 500 (QA)."""
    text = SPEC_HEAD + f"description: bell{char}\n"
    response = api("alpha", "member").post(f"/api/v1/specs/apply/{dry_run}", {"spec": text}, format="json")
    _refused(response, "spec")
    (error,) = response.json()["errors"]
    assert error["line"] == 5 and f"U+{ord(char):04X} is not allowed" in error["reason"]
    assert not TrainingJob.objects.exists()


# -- 4. bounds named as the field the user wrote ------------------------------------------------------------------

@pytest.mark.parametrize("dry_run", ["?dry_run=1", ""])
def test_spec_max_duration_over_the_bound_is_a_spec_error_at_its_line(api, dry_run):
    text = SPEC_HEAD + "max_duration: 99999999999999999999h\n"
    response = api("alpha", "member").post(f"/api/v1/specs/apply/{dry_run}", {"spec": text}, format="json")
    _refused(response, "spec")
    (error,) = response.json()["errors"]
    assert error["line"] == 5 and error["field"] == "max_duration" and "at most 366d" in error["reason"]
    assert response.json()["spec"][0].startswith("spec.yaml:5: max_duration: at most 366d")
    assert not TrainingJob.objects.exists()


def test_submit_max_duration_over_the_bound_names_the_field(api):
    reason = _refused(submit(api("alpha", "member"), max_duration_seconds=10**20), "max_duration_seconds")
    assert f"at most {MAX_DURATION_SECONDS} seconds" in reason
    assert submit(api("alpha", "member"), max_duration_seconds=MAX_DURATION_SECONDS).status_code == 201


@pytest.mark.parametrize("interval", [0, 10**20, 1e20])
def test_checkpoint_interval_errors_name_checkpoint_interval_steps(api, interval):
    response = submit(api("alpha", "member"), checkpoint={"interval_steps": interval})
    assert response.status_code == 400
    assert set(response.json()) == {"checkpoint"} and set(response.json()["checkpoint"]) == {"interval_steps"}
    assert not TrainingJob.objects.exists()


def test_the_spec_parser_and_the_api_share_the_max_duration_bound():
    from fleetyard import spec
    from jobs import models

    assert spec.MAX_DURATION_SECONDS == models.MAX_DURATION_SECONDS == MAX_DURATION_SECONDS


def test_a_model_validation_error_on_the_spec_path_is_still_spec_lines(api, monkeypatch):
    """Whatever the serializer's bounds miss and the model's validation catches is answered as the spec's other
    errors are (the max_duration case was a bare `{"max_duration_seconds": [...]}` body)."""
    from django.core.exceptions import ValidationError

    from controlplane.specs import services

    def refuse(**kwargs):
        raise ValidationError({"max_duration_seconds": ["Ensure this value is less than or equal to 2147483647."]})

    monkeypatch.setattr(services, "spec_apply", refuse)
    response = api("alpha", "member").post("/api/v1/specs/apply/", {"spec": SPEC_HEAD + "max_duration: 2h\n"},
                                           format="json")
    _refused(response, "spec")
    assert response.json()["errors"] == [{"line": 5, "field": "max_duration",
                                          "reason": "max_duration_seconds: Ensure this value is less than or equal "
                                                    "to 2147483647."}]


@pytest.mark.parametrize("path", ["/api/v1/memberships/?page=99", "/api/v1/audit-events/?page=99&page_size=1"])
def test_a_page_past_the_last_names_the_parameter(world, api, path):
    """Found by QA: a page past the last answered 404 {"detail": "Invalid page."}, naming neither the parameter nor
    the reason."""
    response = api("alpha", "admin").get(path)
    assert response.status_code == 404
    assert list(response.json()) == ["page"], response.json()
    assert "page 99 does not exist" in response.json()["page"][0]


# -- a form field given more than once ------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["multipart", "urlencoded"])
def test_a_form_field_given_twice_is_refused_not_the_last_kept(api, fmt):
    """QA: a form or multipart body keeps every value of a repeated field, and DRF read the last one, so
    `name=first&name=second` quietly created `second`. Every strict input refuses it, naming the field."""
    from urllib.parse import urlencode

    from controlplane.datasets.models import Dataset

    client = api("alpha", "member")
    body = {"name": ["first", "second"], "description": "tiny"}
    if fmt == "multipart":
        response = client.post("/api/v1/datasets/", body, format="multipart")
    else:
        response = client.post("/api/v1/datasets/", urlencode(body, doseq=True),
                               content_type="application/x-www-form-urlencoded")
    assert "more than once" in _refused(response, "name")
    assert "description" not in response.json()
    assert not Dataset.objects.exists()


def test_a_list_field_still_takes_one_form_value_per_item(api):
    """A list-valued field (a cluster queue's `teams`) is written in a form as the field repeated: still accepted."""
    created = api("ops").post("/api/v1/cluster-queues/", {"name": "prod", "teams": ["alpha", "beta"]},
                              format="multipart")
    assert created.status_code == 201 and created.json()["teams"] == ["alpha", "beta"], created.json()
    twice = api("ops").post("/api/v1/cluster-queues/", {"name": ["a", "b"], "teams": ["alpha", "beta"]},
                            format="multipart")
    assert "more than once" in _refused(twice, "name") and "teams" not in twice.json()
