"""Operator-facing QA (2026-11-29): what operators manage through the REST API (pools, nodes, cluster queues and
quotas, priority classes) refuses bad input with a 400 naming the field, and says what a change leaves behind.
Each test failed on the code before its fix."""

from __future__ import annotations

import pytest
from django.test import TestCase

from controlplane.tenancy.models import AuditEvent
from tests.conftest import JOB_BODY

pytestmark = pytest.mark.django_db


@pytest.fixture
def no_launch(monkeypatch):
    """Admitted jobs hold their quota; launching them is not what these tests are about."""
    from jobs.tasks import launch_training_job

    monkeypatch.setattr(launch_training_job, "apply_async", lambda *args, **kwargs: None)


def _submit(client, **overrides) -> int:
    with TestCase.captureOnCommitCallbacks(execute=True):
        response = client.post("/api/v1/training-jobs/", {**JOB_BODY, **overrides}, format="json")
    assert response.status_code == 201, response.json()
    return response.json()["id"]


def test_a_quota_cut_below_running_work_says_so(api, demo_cluster, no_launch):
    """Cutting `shared`'s H100 quota to 8 while a job holds 16 was a silent 200: the job ran on over quota and
    neither the answer nor the audit event said so (nor what the quota was before)."""
    member = api("alpha", "member")
    job = _submit(member, workers_min=2, workers_max=2, accelerator_types=["nvidia-h100"])
    assert member.get(f"/api/v1/training-jobs/{job}/").json()["status"]["state"] == "ADMITTED"

    cut = api("ops").patch("/api/v1/cluster-queues/shared/", {"quotas": [
        {"accelerator_type": "nvidia-h100", "nominal_quota": 8}]}, format="json")
    assert cut.status_code == 200, cut.json()
    assert cut.json()["quotas"][0]["nominal_quota"] == 8  # the change is made: running work is not stopped
    [warning] = cut.json()["warnings"]
    assert warning.startswith("nvidia-h100: admitted work of cluster queue shared uses 16, beyond its nominal "
                              "quota of 8"), warning
    event = AuditEvent.objects.filter(action="cluster_queue.update").latest("id")
    assert event.data["over_quota"] == [warning]
    assert {q["accelerator_type"]: q["nominal_quota"] for q in event.data["quotas_before"]} == {
        "nvidia-h100": 16, "nvidia-a100": 16, "cpu": 8}

    # a type left out altogether: no quota at all for what runs
    gone = api("ops").patch("/api/v1/cluster-queues/shared/", {"quotas": []}, format="json").json()
    assert gone["warnings"][0].startswith("nvidia-h100: admitted work of cluster queue shared uses 16, beyond no quota")
    # within quota again: nothing to say
    back = api("ops").patch("/api/v1/cluster-queues/shared/", {"quotas": [
        {"accelerator_type": "nvidia-h100", "nominal_quota": 16}]}, format="json").json()
    assert back["warnings"] == []
    assert "over_quota" not in AuditEvent.objects.filter(action="cluster_queue.update").latest("id").data


def test_a_quota_change_reads_what_runs_over_quota_once(api, demo_cluster, no_launch, monkeypatch,
                                                        django_assert_num_queries):
    """The PATCH read the over-quota figures twice: the service for the audit event, the view again for `warnings`.
    The service's one read is both (`cluster_queue_over_quota`: 4 queries here, a cohort's lenders included; one
    more lists the cohort's other queues, none here, whose borrowing a quota change may cut)."""
    from controlplane.quotas import selectors

    _submit(api("alpha", "member"), workers_min=2, workers_max=2, accelerator_types=["nvidia-h100"])
    ops = api("ops")
    reads = []
    real = selectors.cluster_queue_over_quota

    def counted(*, queue):
        reads.append(queue.name)
        return real(queue=queue)

    monkeypatch.setattr(selectors, "cluster_queue_over_quota", counted)
    with django_assert_num_queries(26):
        cut = ops.patch("/api/v1/cluster-queues/shared/", {"quotas": [
            {"accelerator_type": "nvidia-h100", "nominal_quota": 8}]}, format="json")
    assert cut.status_code == 200, cut.json()
    assert reads == ["shared"]
    [warning] = cut.json()["warnings"]
    assert AuditEvent.objects.filter(action="cluster_queue.update").latest("id").data["over_quota"] == [warning]
    # a change of other fields still answers what runs over quota (as before), from the same one read
    described = ops.patch("/api/v1/cluster-queues/shared/", {"description": "cut"}, format="json").json()
    assert described["warnings"] == [warning]
    assert "over_quota" not in AuditEvent.objects.filter(action="cluster_queue.update").latest("id").data


def test_a_queue_over_its_nominal_within_what_its_cohort_lends_is_not_over_quota(api, world, demo_cluster, no_launch):
    from controlplane.quotas.services import cluster_queue_create

    cluster_queue_create(actor=world["ops"], name="lender", cohort="all", quotas=[
        {"accelerator_type": "nvidia-h100", "nominal_quota": 8}])
    _submit(api("alpha", "member"), workers_min=2, workers_max=2, accelerator_types=["nvidia-h100"])
    within = api("ops").patch("/api/v1/cluster-queues/shared/", {"quotas": [
        {"accelerator_type": "nvidia-h100", "nominal_quota": 8}]}, format="json").json()
    assert within["warnings"] == []  # 16 = 8 nominal + the 8 lender lends
    capped = api("ops").patch("/api/v1/cluster-queues/shared/", {"quotas": [
        {"accelerator_type": "nvidia-h100", "nominal_quota": 8, "borrowing_limit": 4}]}, format="json").json()
    assert capped["warnings"][0].startswith("nvidia-h100: admitted work of cluster queue shared uses 16, beyond its "
                                            "nominal quota of 8 plus the 4 it may borrow from cohort all")
    alone = api("ops").patch("/api/v1/cluster-queues/shared/", {"cohort": "", "quotas": [
        {"accelerator_type": "nvidia-h100", "nominal_quota": 8}]}, format="json").json()
    assert "beyond its nominal quota of 8;" in alone["warnings"][0]


def test_borrowing_and_lending_limits_need_a_cohort(api, world):
    """A borrowing or lending limit on a queue in no cohort was accepted and did nothing (Kueue refuses it): a queue
    of nominal 0 + borrowing 8 then refused every job with "has no quota for"."""
    from controlplane.quotas.models import ClusterQueue

    ops = api("ops")
    for limit in ("borrowing_limit", "lending_limit"):
        body = {"name": "solo", "quotas": [
            {"accelerator_type": "nvidia-a100", "nominal_quota": 8},
            {"accelerator_type": "nvidia-h100", "nominal_quota": 4, limit: 2}]}
        refused = ops.post("/api/v1/cluster-queues/", body, format="json")
        assert refused.status_code == 400, refused.json()
        assert refused.json()["quotas"][0].startswith(f"quotas[1]: nvidia-h100: a {limit} needs a cohort")
        assert not ClusterQueue.objects.filter(name="solo").exists()
        assert ops.post("/api/v1/cluster-queues/", {**body, "cohort": "pool"}, format="json").status_code == 201
        # a PATCH that sets the limit on a queue in no cohort, or leaves the cohort while the limit stays
        assert ops.patch("/api/v1/cluster-queues/solo/", {"cohort": "", "quotas": body["quotas"]},
                         format="json").status_code == 400
        left = ops.patch("/api/v1/cluster-queues/solo/", {"cohort": ""}, format="json")
        assert left.status_code == 400 and "nvidia-h100" in left.json()["cohort"][0], left.json()
        assert ClusterQueue.objects.get(name="solo").cohort == "pool"
        # leaving the cohort with quotas free of limits is fine
        alone = ops.patch("/api/v1/cluster-queues/solo/", {"cohort": "", "quotas": [
            {"accelerator_type": "nvidia-h100", "nominal_quota": 4}]}, format="json")
        assert alone.status_code == 200 and alone.json()["cohort"] == "", alone.json()
        ClusterQueue.objects.filter(name="solo").delete()


def test_a_cohort_is_named_as_every_other_name(api):
    """`cohort` took any slug: "ALL" made a second cohort beside the fixture's "all" (no lending between them, nothing
    said), and "a_b" was accepted where every other name refuses it."""
    from controlplane.quotas.models import ClusterQueue

    ops = api("ops")
    for cohort in ("ALL", "a_b", "-all"):
        refused = ops.post("/api/v1/cluster-queues/", {"name": "other", "cohort": cohort}, format="json")
        assert refused.status_code == 400 and "lowercase" in refused.json()["cohort"][0], refused.json()
        assert not ClusterQueue.objects.filter(name="other").exists()
        patched = ops.patch("/api/v1/cluster-queues/shared/", {"cohort": cohort}, format="json")
        assert patched.status_code == 400 and "cohort" in patched.json(), patched.json()
    assert ClusterQueue.objects.get(name="shared").cohort == "all"
    assert ops.post("/api/v1/cluster-queues/", {"name": "other", "cohort": "all"}, format="json").status_code == 201


def test_a_priority_value_is_a_32_bit_integer_on_every_database(api):
    """SQLite stored 2**31 and -2**31 - 1 (201) where PostgreSQL answered 400: the bounds hang on the column type."""
    from controlplane.quotas.models import PriorityClass

    ops = api("ops")
    for value, word in ((2**31, "less than or equal to 2147483647"), (2**62, "less than or equal to 2147483647"),
                        (-2**31 - 1, "greater than or equal to -2147483648")):
        refused = ops.post("/api/v1/priority-classes/", {"name": "huge", "value": value}, format="json")
        assert refused.status_code == 400 and word in refused.json()["value"][0], refused.json()
    assert not PriorityClass.objects.filter(name="huge").exists()
    for name, value in (("top", 2**31 - 1), ("bottom", -2**31)):
        assert ops.post("/api/v1/priority-classes/", {"name": name, "value": value}, format="json").status_code == 201


def test_a_node_pools_devices_per_node_is_bounded_on_every_database(api):
    """SQLite stored devices_per_node 2**40 (201) where PostgreSQL refused it; a plan on such a pool of one 8-device
    node then counted 2**31 devices."""
    from controlplane.cluster.models import NodePool

    ops = api("ops")
    body = {"name": "big", "accelerator_type": "nvidia-h100", "simulated": True}
    for value in (1025, 2**31 - 1, 2**40):
        refused = ops.post("/api/v1/node-pools/", {**body, "devices_per_node": value}, format="json")
        assert refused.status_code == 400, refused.json()
        assert "less than or equal to 1024" in refused.json()["devices_per_node"][0], refused.json()
    assert not NodePool.objects.filter(name="big").exists()
    assert ops.post("/api/v1/node-pools/", {**body, "devices_per_node": 1024}, format="json").status_code == 201


def test_a_lenders_cut_that_leaves_a_borrower_over_quota_says_so(api, world, demo_cluster, no_launch):
    """QA, 2026-12-07: `shared` (nominal 8) ran 16 H100s by borrowing `lender`'s 8; cutting lender's quota to 0, or
    moving lender to another cohort, was a 200 with `warnings: []` and no `over_quota` in the audit event, while
    shared's admitted work now ran 8 beyond what it may hold."""
    from controlplane.quotas.services import cluster_queue_create

    cluster_queue_create(actor=world["ops"], name="lender", cohort="all", quotas=[
        {"accelerator_type": "nvidia-h100", "nominal_quota": 8}])
    ops = api("ops")
    ops.patch("/api/v1/cluster-queues/shared/", {"quotas": [
        {"accelerator_type": "nvidia-h100", "nominal_quota": 8}]}, format="json")
    _submit(api("alpha", "member"), workers_min=2, workers_max=2, accelerator_types=["nvidia-h100"])
    over = ("nvidia-h100: admitted work of cluster queue shared uses 16, beyond its nominal quota of 8;")

    cut = ops.patch("/api/v1/cluster-queues/lender/", {"quotas": [
        {"accelerator_type": "nvidia-h100", "nominal_quota": 0}]}, format="json")
    assert cut.status_code == 200, cut.json()
    [warning] = cut.json()["warnings"]
    assert warning.startswith(over), warning
    assert AuditEvent.objects.filter(action="cluster_queue.update").latest("id").data["over_quota"] == [warning]

    assert ops.patch("/api/v1/cluster-queues/lender/", {"quotas": [
        {"accelerator_type": "nvidia-h100", "nominal_quota": 8}]}, format="json").json()["warnings"] == []
    moved = ops.patch("/api/v1/cluster-queues/lender/", {"cohort": "other"}, format="json").json()
    assert len(moved["warnings"]) == 1 and moved["warnings"][0].startswith(over), moved
    # a change of neither quotas nor cohort looks at no other queue
    assert ops.patch("/api/v1/cluster-queues/lender/", {"description": "x"}, format="json").json()["warnings"] == []


def test_a_waiting_job_whose_type_loses_its_quota_is_told_it_can_never_run(api, demo_cluster, no_launch):
    """QA, 2026-12-07: a job queued for H100s read "shared would exceed its nvidia-h100 quota: uses 0 of 0 nominal + 0
    borrowing" once an operator removed shared's H100 quota, as if it would run when usage went down."""
    from django.db import transaction

    from jobs.admission import run_cycle

    member = api("alpha", "member")
    _submit(member, workers_min=2, workers_max=2, accelerator_types=["nvidia-h100"])
    waiting = _submit(member, workers_min=2, workers_max=2, accelerator_types=["nvidia-h100"])
    assert api("ops").patch("/api/v1/cluster-queues/shared/", {"quotas": [
        {"accelerator_type": "nvidia-a100", "nominal_quota": 8}]}, format="json").status_code == 200
    with TestCase.captureOnCommitCallbacks(execute=True), transaction.atomic():
        run_cycle()
    status = member.get(f"/api/v1/training-jobs/{waiting}/").json()["status"]
    assert status["state"] == "QUEUED"
    assert status["reason"].endswith("shared has no nvidia-h100 quota: it can never take 16 nvidia-h100 until an "
                                     "operator gives it one"), status["reason"]
