"""The scheduling cycle in the platform: jobs are admitted onto observed nodes within quota, and a
waiting job's API says its position and why it waits."""

from __future__ import annotations

import pytest
from django.test import TestCase

from jobs.admission import run_cycle
from jobs.models import TrainingJob
from tests.conftest import JOB_BODY


@pytest.fixture(autouse=True)
def admission_only(monkeypatch):
    """These tests are about admission: admitted jobs are not launched (tests/api/test_training_runs.py is)."""
    from jobs.tasks import launch_training_job

    monkeypatch.setattr(launch_training_job, "apply_async", lambda *args, **kwargs: None)


@pytest.fixture
def cluster(demo_cluster):
    return demo_cluster


def submit(client, **overrides):
    with TestCase.captureOnCommitCallbacks(execute=True):
        response = client.post("/api/v1/training-jobs/", {**JOB_BODY, **overrides}, format="json")
    assert response.status_code == 201, response.json()
    return response.json()["id"]


def status(client, job_id):
    return client.get(f"/api/v1/training-jobs/{job_id}/").json()["status"]


def test_submitted_job_is_admitted_on_its_cheapest_accepted_type(api, cluster):
    client = api("alpha", "member")
    job_id = submit(client, workers_min=2, workers_max=2, accelerator_types=["nvidia-h100", "nvidia-a100"])
    body = status(client, job_id)
    assert body["state"] == "ADMITTED" and body["queue_position"] is None
    # the A100 costs less per unit of work than the H100 for an unknown class (chip-fact prior and prices)
    assert body["admitted_accelerator_type"] in {"nvidia-h100", "nvidia-a100"}
    assert len(body["placement"]) == 2 and all(len(worker["taken"]) == 8 for worker in body["placement"])
    events = client.get(f"/api/v1/training-jobs/{job_id}/events/").json()["results"]
    assert events[-1]["to_state"] == "ADMITTED" and events[-1]["actor_label"] == "system:scheduler"


def test_waiting_job_reports_position_and_the_missing_capacity(api, cluster, world):
    from controlplane.quotas.services import cluster_queue_update

    cluster_queue_update(actor=world["ops"], queue=world["cluster_queue"],
                         quotas=[{"accelerator_type": "nvidia-h100", "nominal_quota": 64}])
    client = api("alpha", "member")
    first = submit(client, name="a", workers_min=2, workers_max=2, accelerator_types=["nvidia-h100"])
    second = submit(client, name="b", workers_min=2, workers_max=2, accelerator_types=["nvidia-h100"])
    third = submit(client, name="c", workers_min=1, workers_max=1, accelerator_types=["nvidia-h100"])
    assert status(client, first)["state"] == "ADMITTED"
    waiting = status(client, second)
    assert waiting["state"] == "QUEUED" and waiting["queue_position"] == 1
    assert "not enough free nvidia-h100" in waiting["reason"]
    assert status(client, third)["queue_position"] == 2
    # cancelling the running job frees its devices: the next cycle admits the head of the queue
    with TestCase.captureOnCommitCallbacks(execute=True):
        client.post(f"/api/v1/training-jobs/{first}/cancel/")
    assert status(client, second)["state"] == "ADMITTED"


def test_quota_is_never_exceeded(api, cluster, world):
    # the fixture's ClusterQueue "shared" has 16 H100 and 16 A100 nominal, no cohort partner
    client = api("alpha", "member")
    ids = [submit(client, name=f"j{i}", workers_min=1, workers_max=1, accelerator_types=["nvidia-a100"])
           for i in range(4)]
    states = [status(client, i)["state"] for i in ids]
    assert states.count("ADMITTED") == 2 and states.count("QUEUED") == 2
    reason = status(client, ids[-1])["reason"]
    assert "position 2" in reason and "needs to borrow 8 nvidia-a100" in reason


def test_a_job_of_a_non_preemptible_priority_class_waits_rather_than_borrow(api, cluster, world):
    """Only preemption gives borrowed quota back, so a job that cannot be preempted runs within its queue's
    nominal quota; the same job in a preemptible class borrows from the cohort."""
    from controlplane.quotas.services import cluster_queue_create, cluster_queue_update, priority_class_create

    cluster_queue_update(actor=world["ops"], queue=world["cluster_queue"],
                         quotas=[{"accelerator_type": "nvidia-h100", "nominal_quota": 8}])
    cluster_queue_create(actor=world["ops"], name="lender", cohort="all",
                         quotas=[{"accelerator_type": "nvidia-h100", "nominal_quota": 8}])
    priority_class_create(actor=world["ops"], name="critical", value=900, preemptible=False)
    client = api("alpha", "member")
    fixed = submit(client, name="fixed", priority="critical", workers_min=2, workers_max=2,
                   accelerator_types=["nvidia-h100"])
    waiting = status(client, fixed)
    assert waiting["state"] == "QUEUED", waiting
    assert "non-preemptible workloads would use 16 nvidia-h100, beyond its nominal quota of 8" in waiting["reason"]
    loose = submit(client, name="loose", workers_min=2, workers_max=2, accelerator_types=["nvidia-h100"])
    assert status(client, loose)["state"] == "ADMITTED"
    assert status(client, fixed)["state"] == "QUEUED"


def test_cycle_is_idempotent(cluster, world, api):
    client = api("alpha", "member")
    submit(client, workers_min=1, workers_max=1)
    before = list(TrainingJob.objects.values("id", "state", "placement", "queue_position"))
    run_cycle()
    run_cycle()
    assert list(TrainingJob.objects.values("id", "state", "placement", "queue_position")) == before


def test_console_job_detail_shows_position_and_placement(api, cluster, world):
    from django.test import Client

    client = api("alpha", "member")
    admitted = submit(client, name="a", workers_min=2, workers_max=2, accelerator_types=["nvidia-h100"])
    waiting = submit(client, name="b", workers_min=1, workers_max=1, accelerator_types=["nvidia-h100"])
    browser = Client()
    browser.force_login(world["alpha"]["member"])
    page = browser.get(f"/jobs/{waiting}/").content.decode()
    assert "Queue position" in page and "1 in cluster queue shared" in page
    page = browser.get(f"/jobs/{admitted}/").content.decode()
    assert "2 workers on nvidia-h100" in page and "h100-pool-0" in page


def test_preemption_in_the_platform_requeues_an_admitted_victim(api, cluster, world):
    from controlplane.quotas.services import priority_class_create

    priority_class_create(actor=world["ops"], name="urgent", value=1000)
    client = api("alpha", "member")
    victim = submit(client, name="low", workers_min=2, workers_max=2, accelerator_types=["nvidia-h100"])
    assert status(client, victim)["state"] == "ADMITTED"
    urgent = submit(client, name="urgent", workers_min=2, workers_max=2, accelerator_types=["nvidia-h100"],
                    priority="urgent")
    body = status(client, victim)
    assert body["state"] == "QUEUED" and body["placement"] == []
    events = client.get(f"/api/v1/training-jobs/{victim}/events/").json()["results"]
    assert events[-1]["to_state"] == "QUEUED" and "preempted for" in events[-1]["reason"]
    run_cycle()  # the victim is gone: the preemptor starts on the freed devices
    assert status(client, urgent)["state"] == "ADMITTED"
    # it waited for nothing (the victim had not started): its timeline does not say it waits (QA found "admitted:
    # waiting for 1 to checkpoint and release nvidia-h100 devices" on a job that went on at once)
    admitted = [e for e in client.get(f"/api/v1/training-jobs/{urgent}/events/").json()["results"]
                if e["to_state"] == "ADMITTED"][-1]["reason"]
    assert admitted == (f"admitted onto the devices of {victim}, preempted for it before they started (nothing to "
                        "checkpoint)"), admitted


def test_among_equal_priorities_the_victim_is_the_job_that_loses_the_least_work(api, cluster, world, monkeypatch):
    import datetime as dt

    from django.utils import timezone

    from controlplane.quotas.services import priority_class_create
    from jobs.tasks import stop_training_run

    monkeypatch.setattr(stop_training_run, "apply_async", lambda *args, **kwargs: None)
    priority_class_create(actor=world["ops"], name="urgent", value=1000)
    client = api("alpha", "member")
    older = submit(client, name="checkpointed-long-ago", workers_min=1, workers_max=1,
                   accelerator_types=["nvidia-h100"])
    recent = submit(client, name="checkpointed-recently", workers_min=1, workers_max=1,
                    accelerator_types=["nvidia-h100"])
    started = timezone.now() - dt.timedelta(seconds=100)  # 100 steps in 100 s: about 1 s a step
    TrainingJob.objects.filter(pk=older).update(state="RUNNING", compute_handle="fy-a", started_at=started,
                                                current_step=99, last_checkpoint_step=49)  # 50 s to redo
    TrainingJob.objects.filter(pk=recent).update(state="RUNNING", compute_handle="fy-b", started_at=started,
                                                 current_step=99, last_checkpoint_step=95)  # 4 s to redo
    submit(client, name="urgent", workers_min=1, workers_max=1, accelerator_types=["nvidia-h100"],
           priority="urgent")
    assert TrainingJob.objects.get(pk=recent).state == "PREEMPTED"
    assert TrainingJob.objects.get(pk=older).state == "RUNNING"
    reason = TrainingJob.objects.get(pk=recent).events.filter(to_state="PREEMPTED").get().reason
    assert "4 s since its last checkpoint" in reason


def test_a_starting_job_is_never_chosen_as_a_victim(api, cluster, world):
    from controlplane.quotas.services import priority_class_create

    priority_class_create(actor=world["ops"], name="urgent", value=1000)
    client = api("alpha", "member")
    victim = submit(client, name="low", workers_min=2, workers_max=2, accelerator_types=["nvidia-h100"])
    TrainingJob.objects.filter(pk=victim).update(state="STARTING")
    urgent = submit(client, name="urgent", workers_min=2, workers_max=2, accelerator_types=["nvidia-h100"],
                    priority="urgent")
    assert status(client, victim)["state"] == "STARTING"  # the cycle did not fail on an illegal transition
    assert status(client, urgent)["state"] == "QUEUED"


def test_console_queues_page_shows_usage_and_waiting_jobs(api, cluster, world):
    from django.test import Client

    client = api("alpha", "member")
    submit(client, name="holder", workers_min=2, workers_max=2, accelerator_types=["nvidia-h100"])
    submit(client, name="waiter", workers_min=1, workers_max=1, accelerator_types=["nvidia-h100"])
    submit(api("beta", "member"), name="beta-secret", workers_min=1, workers_max=1, accelerator_types=["nvidia-h100"])
    browser = Client()
    browser.force_login(world["alpha"]["member"])
    response = browser.get("/queues/")
    page = response.content.decode()
    used = {(cq.name, q.accelerator_type.slug): q.used for cq in response.context["cluster_queues"]
            for q in cq.quotas.all()}
    assert used[("shared", "nvidia-h100")] == 16 and used[("shared", "nvidia-a100")] == 0
    assert "waiter" in page and "needs to borrow" in page
    assert "beta-secret" not in page  # another team's waiting job is never shown


def test_a_cluster_queue_whose_policy_says_never_preempts_nothing_within_it(api, cluster, world):
    """QA found a queue's preemption_within_queue = Never shown in the API and console but ignored by the cycle: the
    urgent job still preempted the low one. The cycle now reads both policies (reclaim_within_cohort too)."""
    from controlplane.quotas.models import ClusterQueue
    from controlplane.quotas.services import priority_class_create
    from jobs.admission import cluster_queue_specs

    ClusterQueue.objects.filter(pk=world["cluster_queue"].pk).update(preemption_within_queue="Never",
                                                                     reclaim_within_cohort="Never")
    spec = next(q for q in cluster_queue_specs() if q.name == world["cluster_queue"].name)
    assert (spec.preemption_within_queue, spec.reclaim_within_cohort) == ("Never", "Never")
    priority_class_create(actor=world["ops"], name="urgent", value=1000)
    client = api("alpha", "member")
    low = submit(client, name="low", workers_min=2, workers_max=2, accelerator_types=["nvidia-h100"])
    assert status(client, low)["state"] == "ADMITTED"
    urgent = submit(client, name="urgent", workers_min=2, workers_max=2, accelerator_types=["nvidia-h100"],
                    priority="urgent")
    assert status(client, low)["state"] == "ADMITTED"
    assert status(client, urgent)["state"] == "QUEUED"
    ClusterQueue.objects.filter(pk=world["cluster_queue"].pk).update(preemption_within_queue="LowerPriority")
    run_cycle()
    assert status(client, low)["state"] == "QUEUED"  # preempted once the policy allows it


def test_a_new_cluster_queue_reclaims_lent_quota_of_any_priority_by_default():
    """The default keeps the behaviour from before the policies were read (reclaim "Any")."""
    from controlplane.quotas.models import ClusterQueue, ReclaimPolicy

    assert ClusterQueue._meta.get_field("reclaim_within_cohort").default == ReclaimPolicy.ANY
    assert ClusterQueue._meta.get_field("preemption_within_queue").default == "LowerPriority"


def test_the_migration_keeps_what_stored_queues_did(world):
    """Stored queues had the old default reclaim "LowerPriority", which the cycle ignored (it reclaimed from any
    priority): the migration makes it "Any"; "Never" stays."""
    from importlib import import_module

    from django.apps import apps

    from controlplane.quotas.models import ClusterQueue
    from controlplane.quotas.services import cluster_queue_create

    migration = import_module("controlplane.quotas.migrations.0002_reclaim_policy_any")
    cluster_queue_create(actor=world["ops"], name="kept-never", quotas=[])
    ClusterQueue.objects.filter(name="kept-never").update(reclaim_within_cohort="Never")
    ClusterQueue.objects.filter(name="shared").update(reclaim_within_cohort="LowerPriority")
    migration.keep_the_behaviour(apps, None)
    assert dict(ClusterQueue.objects.values_list("name", "reclaim_within_cohort")) == {"shared": "Any",
                                                                                     "kept-never": "Never"}


def test_the_dry_run_plan_counts_what_the_cohort_lends_as_the_cycle_does(api, cluster, world):
    """QA found the plan counting only nominal quota: with shared's 16 H100 in use it said H100 "has no room now
    (quota left 0 < 8)" and chose A100, while the cycle admitted the job on H100 by borrowing from the cohort; later
    plans showed "quota left -8". The plan now checks quota as the cycle does and never shows less than 0."""
    from controlplane.quotas.services import cluster_queue_create

    cluster_queue_create(actor=world["ops"], name="lender", cohort="all",
                         quotas=[{"accelerator_type": "nvidia-h100", "nominal_quota": 16}])
    client = api("alpha", "member")
    submit(client, name="fill", workers_min=2, workers_max=2, accelerator_types=["nvidia-h100"])  # shared's 16
    spec = ("name: next\nqueue: default\nworkers: 1\nresources:\n  accelerators: H100:8\n  any_of: [A100:8]\n"
            "hyperparameters: {steps: 100}\n")
    plan = client.post("/api/v1/specs/apply/?dry_run=1", {"spec": spec}, format="json").json()["plan"]
    h100 = next(o for o in plan["options"] if o["accelerator_type"] == "nvidia-h100")
    assert h100["quota_left"] == 16  # the lender's idle 16; not the quota but the devices are fill's (both nodes):
    assert h100["why_not"] == "not enough free nvidia-h100: 1 x 8 needed, 0 fit now"  # (counted free until 2026-11-29)
    ClusterQueue = type(world["cluster_queue"])
    ClusterQueue.objects.filter(name="lender").delete()  # nothing to borrow: over its nominal, never below 0
    plan = client.post("/api/v1/specs/apply/?dry_run=1", {"spec": spec}, format="json").json()["plan"]
    h100 = next(o for o in plan["options"] if o["accelerator_type"] == "nvidia-h100")
    assert h100["quota_left"] == 0 and "lends only 0 now" in h100["why_not"]  # and, since 2026-11-29, no room either:
    assert h100["why_not"].startswith("not enough free nvidia-h100: 1 x 8 needed, 0 fit now; quota left 0 < 8 (")
    assert plan["chosen"]["accelerator_type"] == "nvidia-a100"


def test_the_dry_run_plan_holds_non_preemptible_jobs_and_deployments_to_the_cycles_quota_rules(api, cluster, world):
    """A review found the plan saying a non-preemptible job fits by borrowing (the cycle refuses: such work stays
    within nominal), and a deployment's plan counting nominal quota only and nobody's usage ("quota left 0 < 1" for a
    replica the deploy check lets borrow)."""
    from controlplane.quotas.services import cluster_queue_create, cluster_queue_update, priority_class_create

    ops = world["ops"]
    cluster_queue_update(actor=ops, queue=world["cluster_queue"],
                         quotas=[{"accelerator_type": "nvidia-h100", "nominal_quota": 8},
                                 {"accelerator_type": "nvidia-a100", "nominal_quota": 0}])
    cluster_queue_create(actor=ops, name="lender", cohort="all",
                         quotas=[{"accelerator_type": "nvidia-h100", "nominal_quota": 16},
                                 {"accelerator_type": "nvidia-a100", "nominal_quota": 16}])
    priority_class_create(actor=ops, name="fixed", value=100, preemptible=False)
    client = api("alpha", "member")
    submit(client, name="fill", workers_min=1, workers_max=1, accelerator_types=["nvidia-h100"], priority="fixed")
    spec = ("name: next\nqueue: default\npriority: {priority}\nworkers: 1\nresources:\n  accelerators: H100:8\n"
            "hyperparameters: {{steps: 100}}\n")
    fixed = client.post("/api/v1/specs/apply/?dry_run=1", {"spec": spec.format(priority="fixed")},
                        format="json").json()["plan"]["options"][0]
    assert not fixed["fits_now"] and "a non-preemptible workload does not borrow" in fixed["why_not"], fixed
    borrows = client.post("/api/v1/specs/apply/?dry_run=1", {"spec": spec.format(priority="standard")},
                          format="json").json()["plan"]["options"][0]
    assert borrows["fits_now"] and borrows["quota_left"] == 16, borrows
    deployment = ("name: chat\nqueue: default\nresources: {accelerators: A100:1}\nservice:\n  model: file:///m\n"
                  "  replica_policy: {min_replicas: 1, max_replicas: 2}\n  sla: {ttft_p95_ms: 400, tpot_p95_ms: 40}\n")
    response = client.post("/api/v1/specs/apply/?dry_run=1", {"spec": deployment}, format="json")
    assert response.status_code == 200, response.json()
    a100 = response.json()["plan"]["options"][0]
    assert a100["quota_left"] == 16 and a100["why_not"] == "", a100


@pytest.mark.parametrize("state", ["RUNNING", "STARTING", "RECOVERING"])
def test_a_preemptible_job_starting_or_recovering_is_not_non_preemptible_usage(api, cluster, world, state):
    """Found by QA (2026-11-28): a preemptible job STARTING or RECOVERING (not preemptible at that moment) was
    counted as non-preemptible usage, so a non-preemptible job was held back ("would use 16 nvidia-h100") for quota
    only 8 of which was non-preemptible; RUNNING admitted it."""
    from controlplane.quotas.services import cluster_queue_create, cluster_queue_update, priority_class_create

    cluster_queue_update(actor=world["ops"], queue=world["cluster_queue"],
                         quotas=[{"accelerator_type": "nvidia-h100", "nominal_quota": 8}])
    cluster_queue_create(actor=world["ops"], name="lender", cohort="all",
                         quotas=[{"accelerator_type": "nvidia-h100", "nominal_quota": 8}])
    priority_class_create(actor=world["ops"], name="critical", value=900, preemptible=False)
    client = api("alpha", "member")
    first = submit(client, name="first", workers_min=1, workers_max=1, accelerator_types=["nvidia-h100"])
    assert status(client, first)["state"] == "ADMITTED"
    TrainingJob.objects.filter(pk=first).update(state=state)  # as the run workflow leaves it
    spec = ("name: critical\nqueue: default\npriority: critical\nworkers: 1\nresources:\n  accelerators: H100:8\n"
            "hyperparameters: {steps: 100}\n")  # the dry-run plan counted the STARTING job as fixed too
    option = client.post("/api/v1/specs/apply/?dry_run=1", {"spec": spec}, format="json").json()["plan"]["options"][0]
    assert option["fits_now"] and option["why_not"] == "", option
    critical = submit(client, name="critical", priority="critical", workers_min=1, workers_max=1,
                      accelerator_types=["nvidia-h100"])
    body = status(client, critical)
    assert body["state"] == "ADMITTED", body["reason"]
    assert status(client, first)["state"] == state  # and it was left alone


def test_a_starting_job_is_still_no_victim(api, cluster, world):
    from controlplane.quotas.services import cluster_queue_update, priority_class_create

    cluster_queue_update(actor=world["ops"], queue=world["cluster_queue"],
                         quotas=[{"accelerator_type": "nvidia-h100", "nominal_quota": 16}])
    priority_class_create(actor=world["ops"], name="urgent", value=1000)
    client = api("alpha", "member")
    low = submit(client, name="low", workers_min=2, workers_max=2, accelerator_types=["nvidia-h100"])
    TrainingJob.objects.filter(pk=low).update(state="STARTING")
    urgent = submit(client, name="urgent", priority="urgent", workers_min=1, workers_max=1,
                    accelerator_types=["nvidia-h100"])
    assert status(client, low)["state"] == "STARTING" and status(client, urgent)["state"] == "QUEUED"


def test_positions_have_no_gap_after_a_preemption_and_no_cohort_is_named_for_a_queue_without_one(api, cluster, world):
    """Found by QA (2026-11-28): the preemptor, admitted at once (it holds its victims' devices), was still counted in
    the queue, so the job behind it said "position 2" with nobody at 1; and a queue in no cohort was told "its cohort
    lends only 0 now"."""
    from controlplane.quotas.services import cluster_queue_create, local_queue_create, priority_class_create

    priority_class_create(actor=world["ops"], name="urgent", value=1000)
    client = api("alpha", "member")
    victim = submit(client, name="low", workers_min=2, workers_max=2, accelerator_types=["nvidia-h100"])
    waiter = submit(client, name="waiter", workers_min=1, workers_max=1, accelerator_types=["nvidia-h100"])
    assert status(client, waiter)["queue_position"] == 1
    urgent = submit(client, name="urgent", workers_min=2, workers_max=2, accelerator_types=["nvidia-h100"],
                    priority="urgent")
    assert status(client, urgent)["state"] == "ADMITTED" and status(client, victim)["state"] == "QUEUED"
    # the victim, back in the queue from ADMITTED, has its place at once (it had none until the next cycle): it
    # arrived before the waiter, at the same priority
    assert status(client, victim)["queue_position"] == 1, status(client, victim)["reason"]
    assert status(client, victim)["reason"].startswith("position 1 in cluster queue shared: requeued: preempted")
    assert status(client, waiter)["queue_position"] == 2, status(client, waiter)["reason"]
    run_cycle()  # the next cycle places them as this one did
    assert [status(client, i)["queue_position"] for i in (victim, waiter)] == [1, 2]

    solo = cluster_queue_create(actor=world["ops"], name="solo", cohort="",
                                quotas=[{"accelerator_type": "nvidia-a100", "nominal_quota": 8}])
    local_queue_create(actor=world["beta"]["admin"], team=world["beta"]["team"], name="solo", cluster_queue=solo)
    beta = api("beta", "member")
    submit(beta, name="first", queue="solo", workers_min=1, workers_max=1, accelerator_types=["nvidia-a100"])
    second = submit(beta, name="second", queue="solo", workers_min=1, workers_max=1, accelerator_types=["nvidia-a100"])
    reason = status(beta, second)["reason"]
    assert "solo would exceed its nvidia-a100 quota: uses 8 of 8 nominal and is in no cohort" in reason, reason


def test_the_dry_run_plan_counts_a_cpu_worker_of_more_than_a_core_in_whole_cores_as_the_cycle_does(api, cluster,
                                                                                                    world):
    """A review found the plan counting a 1.5-core worker as 1.5 cores where the cycle counts (and places) 2: on a
    nominal 2, a non-preemptible 0.5-core job was planned as fitting, and the submit waited."""
    from controlplane.quotas.services import cluster_queue_update, priority_class_create
    from jobs.selectors import quota_usage

    cluster_queue_update(actor=world["ops"], queue=world["cluster_queue"],
                         quotas=[{"accelerator_type": "cpu", "nominal_quota": 2}])
    priority_class_create(actor=world["ops"], name="critical", value=900, preemptible=False)
    client = api("alpha", "member")
    first = submit(client, name="first", accelerator_types=["cpu"], devices_per_worker=0, cpus_per_worker=1.5,
                   workers_min=1, workers_max=1, priority="critical")
    assert status(client, first)["state"] == "ADMITTED"
    assert quota_usage()[("shared", "cpu")] == quota_usage(non_preemptible_only=True)[("shared", "cpu")] == 2.0
    spec = ("name: second\nqueue: default\npriority: critical\nworkers: 1\nresources:\n  accelerators: cpu\n"
            "  cpus: 0.5\nhyperparameters: {steps: 100}\n")
    option = client.post("/api/v1/specs/apply/?dry_run=1", {"spec": spec}, format="json").json()["plan"]["options"][0]
    assert not option["fits_now"], option
    second = submit(client, name="second", accelerator_types=["cpu"], devices_per_worker=0, cpus_per_worker=0.5,
                    workers_min=1, workers_max=1, priority="critical")
    assert status(client, second)["state"] == "QUEUED"  # as planned


def test_the_dry_run_plan_says_when_a_job_can_never_run_as_asked(api, cluster, world):
    """3 x 8 H100 on two 8-device H100 nodes, and shared's H100 ceiling 16: the plan said "nothing fits now (...);
    it waits in the queue", and the job then waited for good (found by QA). Another type that could run it is still
    the one it waits for."""
    client = api("alpha", "member")
    spec = "name: big\nqueue: default\nworkers: 3\nresources:\n  accelerators: H100:8\nhyperparameters: {steps: 10}\n"
    plan = client.post("/api/v1/specs/apply/?dry_run=1", {"spec": spec}, format="json").json()["plan"]
    (h100,) = plan["options"]
    assert h100["never"] and not h100["fits_now"]
    assert h100["why_not"].startswith("nvidia-h100 nodes can never hold it: its 2 nodes (the largest with 8 "
                                      "devices) would hold at most 2 x 8 even all in service with nothing running, it "
                                      "needs 3"), h100
    assert plan["chosen"]["reason"].startswith("it can never run as asked (")
    two = spec.replace("workers: 3", "workers: 2").replace("H100:8", "H100:8\n  any_of: [A100:8]")
    from controlplane.quotas.services import cluster_queue_update

    cluster_queue_update(actor=world["ops"], queue=world["cluster_queue"], quotas=[
        {"accelerator_type": "nvidia-h100", "nominal_quota": 8},
        {"accelerator_type": "nvidia-a100", "nominal_quota": 16}, {"accelerator_type": "cpu", "nominal_quota": 8}])
    plan = client.post("/api/v1/specs/apply/?dry_run=1", {"spec": two}, format="json").json()["plan"]
    by_type = {o["accelerator_type"]: o for o in plan["options"]}
    assert by_type["nvidia-h100"]["never"] and "shared can never take 16 nvidia-h100" in \
        by_type["nvidia-h100"]["why_not"]
    assert not by_type["nvidia-a100"]["never"]
    assert plan["chosen"]["accelerator_type"] == "nvidia-a100"


def test_never_in_the_dry_run_is_never_a_cordon_a_cpu_replica_or_a_rule_that_may_change(api, cluster, world):
    """From a review: a cordoned node may come back (2 x 8 H100 with one of two nodes cordoned was told "never"); a
    CPU deployment's replicas are cores counted elsewhere (4 replicas on a 2-core node were told "never", while they
    fit at 0.25 core each); a CPU worker of 2.5 cores counts 3 against quota, as the cycle counts it; a
    non-preemptible job past its queue's nominal quota is a never."""
    from controlplane.cluster.models import Node
    from controlplane.quotas.services import cluster_queue_create, cluster_queue_update, priority_class_create

    client = api("alpha", "member")
    dry = lambda text: client.post("/api/v1/specs/apply/?dry_run=1", {"spec": text}, format="json").json()["plan"]  # noqa: E731
    Node.objects.filter(name="h100-pool-0").update(cordoned=True)
    two = "name: two\nqueue: default\nworkers: 2\nresources:\n  accelerators: H100:8\nhyperparameters: {steps: 1}\n"
    (h100,) = dry(two)["options"]
    assert not h100["never"] and "not enough free" in h100["why_not"], h100
    deploy = dry("name: d\nqueue: default\nresources:\n  accelerators: cpu\nservice:\n"
                 "  model: file:///checkpoints/lm/step-100\n  replicas: {min: 4, max: 4}\n"
                 "  sla: {ttft_p95: 500ms, tpot_p95: 50ms}\n")
    assert not any(o["never"] for o in deploy["options"]), deploy["options"]
    Node.objects.filter(pool__accelerator_type__slug="cpu").update(capacity_cpus=16, free_cpus=16)
    cpu = dry("name: cpu\nqueue: default\nworkers: 3\nresources:\n  cpus: 2.5\n  accelerators: cpu\n"
              "hyperparameters: {steps: 1}\n")
    (option,) = cpu["options"]
    assert option["never"] and "shared can never take 9 cpu" in option["why_not"], option
    priority_class_create(actor=world["ops"], name="fixed", value=900, preemptible=False)
    cluster_queue_update(actor=world["ops"], queue=world["cluster_queue"], quotas=[
        {"accelerator_type": "nvidia-h100", "nominal_quota": 16},
        {"accelerator_type": "nvidia-a100", "nominal_quota": 8}, {"accelerator_type": "cpu", "nominal_quota": 8}])
    cluster_queue_create(actor=world["ops"], name="lender", cohort="all",
                         quotas=[{"accelerator_type": "nvidia-a100", "nominal_quota": 8}])
    text = "name: f\nqueue: default\npriority: {}\nworkers: 3\nresources:\n  accelerators: A100:4\n" \
           "hyperparameters: {{steps: 1}}\n"
    (a100,) = dry(text.format("fixed"))["options"]
    assert a100["never"] and "shared can never take 12 nvidia-a100 for non-preemptible work: its nominal quota is 8" \
        in a100["why_not"], a100
    (a100,) = dry(text.format("standard"))["options"]
    assert not a100["never"], a100  # preemptible: it may borrow the lender's 8
