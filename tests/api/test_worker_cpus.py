"""The CPU cores a training worker reserves on accelerator nodes (jobs.services.worker_cpus): at most the cores its
devices come with, so a placement by devices can always be reserved in Ray (before, 2 workers of 4 devices at 1 core
each went onto one demo node with 1 core, and the gang waited for placement for ever)."""

from __future__ import annotations

from controlplane.cluster.models import Node
from jobs.models import TrainingJob
from tests.conftest import JOB_BODY


def submit(client, **changes):
    return client.post("/api/v1/training-jobs/", {**JOB_BODY, "accelerator_types": ["nvidia-h100"], **changes},
                       format="json")


def test_unset_a_worker_reserves_the_cores_its_devices_come_with(api, demo_cluster):
    client = api("alpha", "member")
    response = submit(client, name="packed", workers_min=2, workers_max=2, devices_per_worker=4)
    assert response.status_code == 201, response.json()
    assert TrainingJob.objects.get(pk=response.json()["id"]).cpus_per_worker == 0.5  # 1 core per 8 devices
    whole = submit(client, name="whole", workers_min=1, workers_max=1, devices_per_worker=8)
    assert TrainingJob.objects.get(pk=whole.json()["id"]).cpus_per_worker == 1.0
    on_cpu = submit(client, name="cpu", accelerator_types=["cpu"], workers_min=1, workers_max=1,
                    devices_per_worker=0)
    assert on_cpu.status_code == 201, on_cpu.json()
    assert TrainingJob.objects.get(pk=on_cpu.json()["id"]).cpus_per_worker == 1.0


def test_more_cores_than_the_devices_come_with_is_refused_with_the_field_and_why(api, demo_cluster):
    client = api("alpha", "member")
    response = submit(client, name="greedy", workers_min=2, workers_max=2, devices_per_worker=4, cpus_per_worker=1)
    assert response.status_code == 400
    body = response.json()
    assert "cpus_per_worker" in str(body), body
    assert "nvidia-h100 nodes have 0.125 core(s) per device" in str(body) and "at most 0.5" in str(body), body
    assert not TrainingJob.objects.filter(name="greedy").exists()
    assert submit(client, name="fits", workers_min=2, workers_max=2, devices_per_worker=4,
                  cpus_per_worker=0.5).status_code == 201


def test_without_known_nodes_of_the_type_the_default_stays_one_core(api, world):
    response = submit(api("alpha", "member"), name="no-nodes", workers_min=1, workers_max=1, devices_per_worker=4)
    assert response.status_code == 201, response.json()
    assert TrainingJob.objects.get(pk=response.json()["id"]).cpus_per_worker == 1.0


def test_a_job_from_before_the_rule_is_retried_with_the_cores_its_devices_come_with(api, demo_cluster):
    client = api("alpha", "member")
    created = submit(client, name="old", workers_min=2, workers_max=2, devices_per_worker=4, cpus_per_worker=0.5)
    TrainingJob.objects.filter(pk=created.json()["id"]).update(cpus_per_worker=1.0, state="FAILED")  # as stored then
    response = client.post(f"/api/v1/training-jobs/{created.json()['id']}/retry/")
    assert response.status_code == 201, response.json()
    retry = TrainingJob.objects.get(pk=response.json()["id"])
    assert retry.cpus_per_worker == 0.5
    first = retry.events.order_by("id").first().reason
    assert first.endswith("; 1 cores per worker lowered to 0.5, what its devices come with"), first


def test_a_job_that_also_accepts_the_cpu_pool_keeps_its_size_there_and_reserves_the_share_on_accelerators(
        api, demo_cluster):
    from jobs.selectors import cores_on

    client = api("alpha", "member")
    response = submit(client, name="either", accelerator_types=["cpu", "nvidia-h100"], workers_min=1,
                      workers_max=1, devices_per_worker=1, cpus_per_worker=4)
    assert response.status_code == 201, response.json()
    job = TrainingJob.objects.get(pk=response.json()["id"])
    assert job.cpus_per_worker == 4  # 4 cores on the CPU pool
    assert cores_on(accelerator_type="nvidia-h100", devices_per_worker=1, cpus_per_worker=4) == 0.125
    assert cores_on(accelerator_type="cpu", devices_per_worker=1, cpus_per_worker=4) == 4
    unset = submit(client, name="either-unset", accelerator_types=["cpu", "nvidia-h100"], workers_min=1,
                   workers_max=1, devices_per_worker=1)
    assert TrainingJob.objects.get(pk=unset.json()["id"]).cpus_per_worker == 1.0


def test_the_cores_per_device_are_the_hardwares_and_do_not_move_when_a_node_is_cordoned(api, demo_cluster):
    """What was reserved at launch is counted with it later (the held cores): it must not move with a cordon."""
    from controlplane.cluster.models import Node
    from controlplane.cluster.selectors import cores_share, cpus_per_device

    Node.objects.filter(pool__accelerator_type__slug="nvidia-h100").update(capacity_cpus=96)
    assert cpus_per_device(accelerator_type="nvidia-h100") == 12.0
    Node.objects.filter(name="h100-pool-1").update(cordoned=True, health="unreachable")
    assert cpus_per_device(accelerator_type="nvidia-h100") == 12.0
    response = submit(api("alpha", "member"), name="big", workers_min=1, workers_max=1, devices_per_worker=8,
                      cpus_per_worker=64)
    assert response.status_code == 201, response.json()
    assert 3 * cores_share(2 / 3, 1) <= 2  # shares round down: three on a 2-core, 3-device node fit


def test_a_retry_of_a_job_that_also_accepts_the_cpu_pool_keeps_its_size_there(api, demo_cluster):
    client = api("alpha", "member")
    created = submit(client, name="either", accelerator_types=["cpu", "nvidia-h100"], workers_min=1, workers_max=1,
                     devices_per_worker=1, cpus_per_worker=4)
    TrainingJob.objects.filter(pk=created.json()["id"]).update(state="FAILED")
    response = client.post(f"/api/v1/training-jobs/{created.json()['id']}/retry/")
    assert response.status_code == 201, response.json()
    assert TrainingJob.objects.get(pk=response.json()["id"]).cpus_per_worker == 4


def test_a_replica_reserves_at_most_the_cores_its_devices_come_with(demo_cluster):
    from inference.workflows import CPUS_PER_REPLICA, replica_cpus

    assert replica_cpus(accelerator_type="nvidia-h100", devices_per_replica=1) == 0.125  # 1 core per 8 devices
    assert replica_cpus(accelerator_type="nvidia-h100", devices_per_replica=8) == CPUS_PER_REPLICA
    assert replica_cpus(accelerator_type="cpu", devices_per_replica=0) == CPUS_PER_REPLICA


def test_a_launch_on_an_accelerator_reserves_the_share_for_a_job_that_also_accepts_the_cpu_pool(api, demo_cluster):
    from jobs.workflows import build_launch

    created = submit(api("alpha", "member"), name="either", accelerator_types=["cpu", "nvidia-h100"], workers_min=1,
                     workers_max=1, devices_per_worker=1, cpus_per_worker=4)
    job = TrainingJob.objects.get(pk=created.json()["id"])
    job.admitted_accelerator_type, job.compute_handle = "nvidia-h100", "fy-train-x"
    assert build_launch(job).cpus_per_worker == 0.125
    job.admitted_accelerator_type = "cpu"
    assert build_launch(job).cpus_per_worker == 4


def test_a_cpu_worker_of_no_cores_is_refused_with_the_field_and_why(api, demo_cluster):
    """QA found a job of 0 cores on the CPU pool accepted (201); every scheduling cycle after it then failed (the
    scheduler divides by a worker's size), so no team's job was admitted until it was cancelled. A tiny size was
    accepted too and counted next to nothing against quota."""
    client = api("alpha", "member")
    for number, cores in enumerate((0, 1e-9, 0.005)):
        response = submit(client, name=f"tiny-{number}", accelerator_types=["cpu"], devices_per_worker=0,
                          cpus_per_worker=cores)
        assert response.status_code == 400, (cores, response.json())
        assert "cpus_per_worker" in str(response.json()) and "at least 0.01 core" in str(response.json())
        assert not TrainingJob.objects.filter(name__startswith="tiny").exists()
    also = submit(client, name="also-cpu", accelerator_types=["nvidia-h100", "cpu"], cpus_per_worker=0)
    assert also.status_code == 400 and "cpus_per_worker" in str(also.json())
    assert submit(client, name="small", accelerator_types=["cpu"], devices_per_worker=0,
                  cpus_per_worker=0.01).status_code == 201


def test_a_worker_no_node_of_an_accepted_type_could_hold_is_refused(api, demo_cluster):
    """QA found a 1 x 9-device H100 job on 8-device nodes accepted; it waited for ever (and took a reservation every
    cycle). Refused now, naming the field; a type that can hold it lets it pass."""
    client = api("alpha", "member")
    response = submit(client, name="fat", devices_per_worker=9)
    assert response.status_code == 400, response.json()
    assert "devices_per_worker" in str(response.json())
    assert "the largest nvidia-h100 node has 8 devices, a worker asks for 9" in str(response.json())
    assert not TrainingJob.objects.filter(name="fat").exists()
    on_cpu = submit(client, name="cores", accelerator_types=["cpu"], devices_per_worker=0, cpus_per_worker=64)
    assert on_cpu.status_code == 400 and "cpus_per_worker" in str(on_cpu.json()), on_cpu.json()
    assert "the largest cpu node has" in str(on_cpu.json())
    assert submit(client, name="fits", devices_per_worker=8).status_code == 201


def test_a_job_accepting_the_cpu_pool_and_an_accelerator_is_sized_per_type_by_the_cycle(api, demo_cluster):
    """QA found such a job admitted as `1 x 4 nvidia-h100` (its 4 cores, its size on the CPU pool listed first, used as
    devices), and `H100:8` + cpu counted as 8 cores on the CPU pool. Each type now gets the job's size there."""
    from django.test import TestCase

    from jobs.admission import _workload, run_cycle
    from jobs.services import training_job_enqueue

    client = api("alpha", "member")
    fill = submit(client, name="fill", workers_min=1, workers_max=1, devices_per_worker=8)
    first_cpu = submit(client, name="cpu-first", accelerator_types=["cpu", "nvidia-h100"], workers_min=1,
                       workers_max=1, devices_per_worker=1, cpus_per_worker=4)  # no CPU node has 4 cores
    eight = submit(client, name="h100-first", accelerator_types=["nvidia-h100", "cpu"], workers_min=1,
                   workers_max=1, devices_per_worker=8, cpus_per_worker=1)
    jobs = [TrainingJob.objects.get(pk=r.json()["id"]) for r in (fill, first_cpu, eight)]
    assert _workload(jobs[1]).devices_per_worker == 4 and _workload(jobs[1]).on("nvidia-h100").devices_per_worker == 1
    assert _workload(jobs[2]).on("cpu").devices_per_worker == 1 and not _workload(jobs[0]).sizes
    with TestCase.captureOnCommitCallbacks(execute=True):
        for job in jobs:
            training_job_enqueue(job_id=job.pk)
        run_cycle()
    _, cpu_first, h100_first = (TrainingJob.objects.get(pk=job.pk) for job in jobs)
    assert cpu_first.admitted_accelerator_type == "nvidia-h100"
    assert sum(len(w["taken"]) for w in cpu_first.placement) == 1  # one device, not four
    # no H100 node has 8 free devices left: it falls back to the CPU pool, where it is 1 core (not 8)
    assert h100_first.admitted_accelerator_type == "cpu", h100_first.state_reason
    assert [len(w["taken"]) for w in h100_first.placement] == [1]


def test_cpu_workers_of_more_than_a_core_are_placed_as_whole_cores_rounded_up(api, demo_cluster):
    """A review found 4 x 2.5-core workers placed on one 8-core node (the core places sizes from 1 up as whole units,
    and round(2.5) is 2) while Ray reserved 10 cores: the gang could never start. The cycle now places 3 cores each."""
    from jobs.admission import _workload

    response = submit(api("alpha", "member"), name="halves", accelerator_types=["cpu"], devices_per_worker=0,
                      workers_min=2, workers_max=2, cpus_per_worker=1.5)
    assert response.status_code == 201, response.json()
    job = TrainingJob.objects.get(pk=response.json()["id"])
    assert _workload(job).devices_per_worker == 2.0 and job.cpus_per_worker == 1.5
    either = submit(api("alpha", "member"), name="either", accelerator_types=["nvidia-h100", "cpu"],
                    devices_per_worker=1, cpus_per_worker=1.5)
    assert _workload(TrainingJob.objects.get(pk=either.json()["id"])).on("cpu").devices_per_worker == 2.0


def test_a_replacement_cpu_worker_of_more_than_a_core_takes_whole_cores_rounded_up(api, demo_cluster):
    """replace_workers placed a lost 2.5-core worker's replacement as round(2.5) = 2 cores while Ray reserves 2.5
    (the cycle places 3; a review found the two disagreeing)."""
    from django.test import TestCase

    from jobs.admission import replace_workers

    cpu = Node.objects.get(pool__accelerator_type__slug="cpu")
    Node.objects.filter(pk=cpu.pk).update(capacity_cpus=4, free_cpus=4)
    spare = Node.objects.get(pk=cpu.pk)
    spare.pk, spare.name = None, "cpu-spare"
    spare.save()
    with TestCase.captureOnCommitCallbacks(execute=True):  # submitted, then the cycle admits it
        response = submit(api("alpha", "member"), name="wide", accelerator_types=["cpu"], devices_per_worker=0,
                          workers_min=1, workers_max=1, cpus_per_worker=2.5)
    job = TrainingJob.objects.get(pk=response.json()["id"])
    assert job.state in ("ADMITTED", "STARTING") and len(job.placement[0]["taken"]) == 3
    moved = replace_workers(job_id=job.pk, exclude=[job.placement[0]["node"]])
    assert moved is not None and moved.placement[0]["node"] != job.placement[0]["node"]
    assert len(moved.placement[0]["taken"]) == 3, moved.placement
