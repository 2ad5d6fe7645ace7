"""Console pages: overview, cluster, queues, datasets, and the helpers every page module shares.

Thin: read through selectors scoped to the caller's teams, render.

Every page needs a login. Team-owned objects (datasets, jobs, deployments, local queues) are read
with the team ids of `visible_team_ids`, so another team's job or deployment is a 404, never a 403
that would confirm it exists. Cluster inventory, cluster queues and priority classes are shared
facts that every signed-in user may read.
"""

from __future__ import annotations

from collections import defaultdict

from django.contrib.auth.decorators import login_required
from django.db.models import Count
from django.shortcuts import render

from controlplane.cluster.models import NodeHealth
from controlplane.cluster.selectors import accelerator_type_list, node_list, node_pool_list
from controlplane.datasets.selectors import dataset_list, dataset_version_list
from controlplane.quotas.selectors import cluster_queue_list, local_queue_list, priority_class_list
from controlplane.tenancy.selectors import team_list, visible_team_ids
from inference.selectors import deployment_list
from inference.states import DeploymentState
from jobs.selectors import (
    goodput_overview,
    quota_usage,
    training_job_list,
    waiting_jobs,
)
from jobs.states import JobState

SIMULATED_NOTE = ("SIMULATED pools have logical chips: Ray nodes on a CPU host advertise them as custom "
                  "resources, and the work itself runs on CPU.")


def _state_counts(queryset, states) -> list[tuple[str, int]]:
    """(state, count) for every state of a machine, in the machine's order, zeros included."""
    counts = dict(queryset.order_by().values_list("state").annotate(n=Count("id")))
    return [(state.value, counts.get(state.value, 0)) for state in states]


def _pools_with_nodes():
    """Node pools (with their annotated device totals) each carrying its nodes and healthy CPU totals."""
    nodes_by_pool = defaultdict(list)
    for node in node_list():
        nodes_by_pool[node.pool_id].append(node)
    pools = list(node_pool_list())
    for pool in pools:
        pool.node_rows = nodes_by_pool.get(pool.pk, [])
        healthy = [node for node in pool.node_rows if node.health == NodeHealth.HEALTHY]
        pool.capacity_cpus = sum(node.capacity_cpus for node in healthy)
        pool.free_cpus = sum(node.free_cpus for node in healthy)
    return pools


def _base_context(request, section: str) -> tuple[list[int], dict]:
    team_ids = visible_team_ids(user=request.user)
    return team_ids, {"section": section, "teams": team_list(team_ids=team_ids),
                      "simulated_note": SIMULATED_NOTE}


@login_required
def overview(request):
    team_ids, context = _base_context(request, "overview")
    jobs = training_job_list(team_ids=team_ids)
    deployments = deployment_list(team_ids=team_ids)
    context.update({
        "pools": _pools_with_nodes(),
        "job_counts": _state_counts(jobs, JobState),
        "deployment_counts": _state_counts(deployments, DeploymentState),
        "latest_jobs": jobs[:10],
        "latest_deployments": deployments[:5],
        "goodput": goodput_overview(team_ids=team_ids),
    })
    return render(request, "frontend/overview.html", context)


@login_required
def cluster(request):
    _, context = _base_context(request, "cluster")
    context.update({"pools": _pools_with_nodes(), "accelerator_types": accelerator_type_list()})
    return render(request, "frontend/cluster.html", context)


@login_required
def queues(request):
    team_ids, context = _base_context(request, "queues")
    usage = quota_usage()
    cluster_queues = list(cluster_queue_list())
    for cq in cluster_queues:
        for quota in cq.quotas.all():
            quota.used = usage.get((cq.name, quota.accelerator_type.slug), 0.0)
    context.update({
        "cluster_queues": cluster_queues,
        "waiting_jobs": waiting_jobs(team_ids=team_ids),
        "local_queues": local_queue_list(team_ids=team_ids),
        "priority_classes": priority_class_list(),
    })
    return render(request, "frontend/queues.html", context)


@login_required
def datasets(request):
    team_ids, context = _base_context(request, "datasets")
    versions = defaultdict(list)
    for version in dataset_version_list(team_ids=team_ids):
        versions[version.dataset_id].append(version)
    rows = list(dataset_list(team_ids=team_ids))
    for dataset in rows:
        dataset.version_rows = versions.get(dataset.pk, [])
    context["datasets"] = rows
    return render(request, "frontend/datasets.html", context)
