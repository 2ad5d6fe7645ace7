"""Mixed load, from a review (2026-11-29): a CPU replica Ray runs on an accelerator node holds no device there; the
deploy check counts fractional replicas as the cycle places them (shares packed per whole device)."""

from __future__ import annotations

import pytest
from django.test import TestCase

from controlplane.cluster.models import Node
from controlplane.scheduling.mixed_load import replica_devices, replicas_fit
from inference.models import Deployment
from inference.selectors import replica_capacity
from jobs.admission import run_cycle
from jobs.models import TrainingJob
from tests.api import test_mixed_load
from tests.api.test_mixed_load import post
from tests.conftest import DEPLOYMENT_BODY, JOB_BODY

backend = test_mixed_load.backend  # the fixture: the in-memory backend the mixed-load tests drive


def test_a_cpu_replica_on_an_h100_node_does_not_take_an_h100_device(api, backend, model_dir):
    client = api("alpha", "member")
    h100 = list(Node.objects.filter(pool__accelerator_type__slug="nvidia-h100").order_by("name")
                .values_list("name", flat=True))
    assert len(h100) == 2
    dep = post(client, "/api/v1/deployments/", {**DEPLOYMENT_BODY, "model_uri": f"file://{model_dir}",
                                                "accelerator_types": ["cpu"], "replicas_min": 1, "replicas_max": 1})
    # Ray Serve put the 0.25-CPU replica on an H100 node (it has CPUs too)
    Deployment.objects.filter(pk=dep).update(state="SERVING", replicas_ready=1, replicas_target=1,
                                             observed={"node_names": [h100[0]]})
    # the deploy check: the whole H100 pool is free for 8-device replicas
    assert sum(replica_capacity(accelerator_type="nvidia-h100", devices_per_replica=8,
                                cpus_per_replica=0).values()) == 2
    jobs = [post(client, "/api/v1/training-jobs/", {**JOB_BODY, "name": f"j{i}", "workers_min": 1, "workers_max": 1,
                                                    "accelerator_types": ["nvidia-h100"]}) for i in range(2)]
    with TestCase.captureOnCommitCallbacks(execute=True):
        run_cycle()
    states = {TrainingJob.objects.get(pk=j).state: TrainingJob.objects.get(pk=j).state_reason for j in jobs}
    assert set(states) == {"ADMITTED"}, states


@pytest.mark.parametrize("per_replica", [0.6, 0.3])
def test_the_deploy_check_counts_fractional_replicas_as_the_cycle_places_them(demo_cluster, per_replica):
    fits = replica_capacity(accelerator_type="nvidia-a100", devices_per_replica=per_replica, cpus_per_replica=0)
    cycle = 2 * replicas_fit(8.0, per_replica)  # the A100 pool: 2 idle nodes of 8
    assert replica_devices(cycle, per_replica) == 16.0
    assert sum(fits.values()) == cycle, (fits, cycle)
