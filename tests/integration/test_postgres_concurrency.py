"""Locking under real concurrency, on PostgreSQL (CI sets FLEETYARD_DATABASE_URL=postgres://...).

Each test races several threads, each with its own database connection, through one service and
checks that the row locks let exactly the right number win.
"""

from __future__ import annotations

import threading

import pytest
from django.db import connection, connections

from controlplane.common.errors import ConflictError
from controlplane.datasets.services import dataset_create, dataset_version_register
from controlplane.tenancy.models import Membership, Role
from controlplane.tenancy.services import membership_set
from jobs.models import TrainingJob
from jobs.services import training_job_cancel, training_job_create

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def _needs_postgres():
    if connection.vendor != "postgresql":
        pytest.skip("row-locking tests run on PostgreSQL (set FLEETYARD_DATABASE_URL=postgres://...)")


def race(count: int, action) -> list:
    """Run action(i) in `count` threads released together; return each result or exception."""
    barrier = threading.Barrier(count)
    results: list = [None] * count

    def run(index: int) -> None:
        try:
            barrier.wait(10)
            results[index] = action(index)
        except Exception as exc:  # collected and asserted on by the caller
            results[index] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return results


def test_concurrent_versions_get_distinct_gapless_numbers(world):
    alpha = world["alpha"]
    dataset = dataset_create(actor=alpha["admin"], team=alpha["team"], name="racy")
    results = race(8, lambda i: dataset_version_register(actor=alpha["member"], dataset=dataset,
                                                          uri=f"s3://bucket/racy/{i}").version)
    assert sorted(results) == list(range(1, 9)), results


def test_concurrent_cancels_transition_once(world):
    alpha = world["alpha"]
    job = training_job_create(actor=alpha["member"], team=alpha["team"], name="c", local_queue=alpha["queue"],
                              accelerator_types=["cpu"], devices_per_worker=0)
    results = race(6, lambda i: training_job_cancel(actor=alpha["member"], job=job).state)
    wins = [r for r in results if r == "CANCELLED"]
    assert len(wins) == 1 and all(isinstance(r, ConflictError) for r in results if r != "CANCELLED"), results
    assert TrainingJob.objects.get(pk=job.pk).events.filter(to_state="CANCELLED").count() == 1


def test_two_admins_demoting_each_other_keep_one_admin(world):
    alpha = world["alpha"]
    membership_set(actor=alpha["admin"], team=alpha["team"], username=alpha["member"].username, role=Role.ADMIN)
    admins = [alpha["admin"], alpha["member"]]
    results = race(2, lambda i: membership_set(actor=admins[i], team=alpha["team"],
                                               username=admins[i].username, role=Role.VIEWER).role)
    assert [str(r) for r in results if not isinstance(r, Exception)] == ["viewer"], results
    assert [type(r) for r in results if isinstance(r, Exception)] == [ConflictError], results
    assert Membership.objects.filter(team=alpha["team"], role=Role.ADMIN).count() == 1


def test_concurrent_submissions_cycles_and_cancels_never_over_admit(world, settings, tmp_path):
    """Eight threads submit, schedule and cancel at once; quota and devices are never over-committed."""
    from collections import defaultdict

    from controlplane.cluster.models import AcceleratorType
    from controlplane.cluster.services import node_pool_create, nodes_sync
    from controlplane.compute.memory import InMemoryComputeBackend
    from controlplane.compute.topology import load_topology
    from jobs.admission import run_cycle

    topology = load_topology()
    types = {a.slug: a for a in AcceleratorType.objects.all()}
    for pool in topology.pools:
        node_pool_create(actor=world["ops"], name=pool.name, accelerator_type=types[pool.accelerator_type],
                         devices_per_node=pool.devices_per_node, simulated=pool.simulated)
    nodes_sync(observed=InMemoryComputeBackend.from_topology(topology).list_nodes())
    teams = [world["alpha"], world["beta"]]

    def work(index: int):
        team = teams[index % 2]
        made = []
        for round_ in range(4):
            job = training_job_create(actor=team["member"], team=team["team"], name=f"t{index}-{round_}",
                                      local_queue=team["queue"], accelerator_types=["nvidia-h100", "nvidia-a100"],
                                      devices_per_worker=8 if round_ % 2 else 4, workers_min=1, workers_max=2)
            made.append(job)
            run_cycle()
            if round_ == 2:
                training_job_cancel(actor=team["member"], job=made[0])
                run_cycle()
        return len(made)

    results = race(8, work)
    assert results == [4] * 8, results
    holding = TrainingJob.objects.filter(state__in=["ADMITTED", "STARTING", "RUNNING", "RECOVERING"])
    usage, devices = defaultdict(float), defaultdict(float)
    for job in holding:
        usage[job.admitted_accelerator_type] += len(job.placement) * job.devices_per_worker
        for worker in job.placement:
            for index, share in worker["taken"]:
                devices[(worker["node"], index)] += share
    assert holding.exists()
    assert usage["nvidia-h100"] <= 16 and usage["nvidia-a100"] <= 16, usage  # the shared queue's nominal
    assert all(total <= 1.0 + 1e-9 for total in devices.values()), devices


def test_a_token_created_while_its_member_is_removed_ends_revoked(world, monkeypatch):
    """The token's insert waits (up to 1 s) for the removal to finish. Before the membership row was locked, the
    removal finished first, revoked nothing, and the token committed afterwards active for a removed member (review,
    2026-11-29); now the removal waits for the token and revokes it."""
    import secrets as real_secrets

    from controlplane.tenancy import services
    from controlplane.tenancy.models import ApiToken
    from controlplane.tenancy.services import api_token_create, membership_delete

    alpha = world["alpha"]
    membership = Membership.objects.get(team=alpha["team"], user=alpha["member"])
    removed = threading.Event()

    class SlowSecrets:
        @staticmethod
        def token_urlsafe(n):
            removed.wait(1.0)  # (past the membership check, inside the transaction)
            return real_secrets.token_urlsafe(n)

    monkeypatch.setattr(services, "secrets", SlowSecrets)

    def act(index: int):
        if index == 0:
            return api_token_create(actor=alpha["member"], team=alpha["team"], user=alpha["member"], name="racy")
        import time
        time.sleep(0.2)  # the create is past its membership check by now
        membership_delete(actor=alpha["admin"], membership=membership)
        removed.set()

    results = race(2, act)
    assert not any(isinstance(r, Exception) for r in results), results
    assert not Membership.objects.filter(pk=membership.pk).exists()
    assert not ApiToken.objects.filter(team=alpha["team"], user=alpha["member"], revoked_at__isnull=True).exists()
