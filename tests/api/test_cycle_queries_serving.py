"""A review (2026-11-29): each CPU deployment waiting for capacity cost the cycle its own queries (45 waiting: 347
queries where 5 took 42). The per-type reads are made once per cycle now."""

from __future__ import annotations

from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from inference.models import Deployment
from jobs.admission import run_cycle


def cycle_queries() -> int:
    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        run_cycle()
    return len(queries)


def pending_cpu(world, model_dir, start, count):
    team, queue = world["alpha"]["team"], world["alpha"]["queue"]
    Deployment.objects.bulk_create([
        Deployment(team=team, name=f"cpu-{i}", local_queue=queue, model_uri=f"file://{model_dir}",
                   accelerator_types=["cpu"], devices_per_replica=0, replicas_min=1, replicas_max=1,
                   sla_ttft_p95_ms=500, sla_tpot_p95_ms=50, state="PENDING",
                   state_reason="waiting for capacity: 0 of 1 replica(s) fit now")
        for i in range(start, start + count)])


def test_the_cycle_asks_the_same_whatever_the_number_of_cpu_deployments_waiting(demo_cluster, world, model_dir):
    """Counted on a cycle that has nothing new to say: the first one records each deployment's waiting reason (an
    event each, written once)."""
    counts = {}
    pending_cpu(world, model_dir, 0, 5)
    cycle_queries()
    counts[5] = cycle_queries()
    pending_cpu(world, model_dir, 5, 40)
    cycle_queries()
    counts[45] = cycle_queries()
    assert counts[45] - counts[5] < 10, counts
