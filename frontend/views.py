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
from django.core.paginator import Paginator
from django.db.models import Count
from django.shortcuts import render

from controlplane.cluster.models import NodeHealth
from controlplane.cluster.selectors import (
    accelerator_type_list,
    cluster_utilization,
    node_list,
    node_pool_list,
    node_utilization,
    simulated_pool_flags,
)
from controlplane.datasets.models import DatasetFormat
from controlplane.datasets.selectors import dataset_list, dataset_versions_latest
from controlplane.quotas.selectors import cluster_queue_list, local_queue_list, priority_class_list
from controlplane.tenancy.models import Role
from controlplane.tenancy.selectors import roles_by_team, team_list, visible_team_ids
from inference.selectors import deployment_list, serving_quota_usage
from inference.states import DeploymentState
from jobs.selectors import (
    goodput_overview,
    held_units_by_node,
    job_counts_by_local_queue,
    queue_depth,
    quota_usage,
    quota_usage_by_local_queue,
    training_job_list,
    waiting_jobs,
)
from jobs.states import HOLDING_STATES, JobState

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


def _simulated_types() -> set[str]:
    """Accelerator types whose every node pool is SIMULATED (logical chips on a CPU host)."""
    _, by_type = simulated_pool_flags()
    return {slug for slug, simulated in by_type.items() if simulated}


def _mark_simulated_deployments(deployments) -> list:
    """The deployments as a list, each with `simulated`: placed on a SIMULATED pool (or, with no pinned pool, on a
    type whose every pool is SIMULATED)."""
    by_pool, by_type = simulated_pool_flags()
    rows = list(deployments)
    for deployment in rows:
        deployment.simulated = (by_pool.get(deployment.pool, False) if deployment.pool
                                else by_type.get(deployment.accelerator_type, False))
    return rows


def _base_context(request, section: str) -> tuple[list[int], dict]:
    team_ids = visible_team_ids(user=request.user)
    return team_ids, {"section": section, "teams": team_list(team_ids=team_ids),
                      "simulated_note": SIMULATED_NOTE}


def _writable_team_ids(user, team_ids: list[int]) -> list[int]:
    """The teams among team_ids where the user may submit and change things (member or admin)."""
    roles = roles_by_team(user=user, team_ids=team_ids)
    return [team_id for team_id in team_ids if roles.get(team_id) in (Role.ADMIN, Role.MEMBER)]


def _id_param(value: str) -> int | None:
    """A positive object id from a query-string value, or None ("abc", "", "-1", and digits outside ASCII such as
    "²", which str.isdigit accepts but int refuses)."""
    return int(value) if value.isascii() and value.isdigit() else None


# A job's or deployment's page shows its latest events and revisions, not all of them: a long-lived elastic job or an
# often-scaled deployment gathers thousands, and the live page re-renders every 3 s. The API lists them all (paged).
TIMELINE_LIMIT = 100
WAITING_LIMIT = 100  # waiting jobs listed on the Queues page
DATASETS_PER_PAGE = 50  # the Datasets page, as the jobs list
VERSIONS_SHOWN = 20  # the latest versions of each dataset there


def _timeline(events, *, api: str) -> dict:
    """The template context of a timeline: the latest TIMELINE_LIMIT events in time order, how many there are, and
    the API URL that lists them all."""
    latest = list(events.order_by("-created_at", "-id")[:TIMELINE_LIMIT])[::-1]
    total = len(latest) if len(latest) < TIMELINE_LIMIT else events.count()
    return {"events": latest, "events_total": total, "events_api": api}


def _pct(fraction) -> float | None:
    return round(fraction * 100, 1) if fraction is not None else None


@login_required
def overview(request):
    team_ids, context = _base_context(request, "overview")
    jobs = training_job_list(team_ids=team_ids)
    deployments = deployment_list(team_ids=team_ids)
    utilization = cluster_utilization(held=held_units_by_node())
    depth = queue_depth()
    context.update({
        "pools": _pools_with_nodes(),
        "utilization": utilization,
        "utilization_chart": {
            "pools": [{"name": p["name"], "type": p["accelerator_type"], "unit": p["unit"], "used": p["used"],
                       "capacity": p["capacity"], "percent": _pct(p["fraction"]), "simulated": p["simulated"]}
                      for p in utilization["pools"]],
            "types": [{"name": t["accelerator_type"], "unit": t["unit"], "used": t["used"],
                       "capacity": t["capacity"], "percent": _pct(t["fraction"]), "simulated": t["simulated"]}
                      for t in utilization["types"]],
        },
        "queue_depth": [(cq.name, depth.get(cq.name, 0)) for cq in cluster_queue_list()],
        "waiting_total": sum(depth.values()),
        "job_counts": _state_counts(jobs, JobState),
        "deployment_counts": _state_counts(deployments, DeploymentState),
        "running_jobs": jobs.filter(state__in=HOLDING_STATES)[:20],
        "running_job_total": jobs.filter(state__in=HOLDING_STATES).count(),
        "serving_deployments": _mark_simulated_deployments(deployments.filter(
            state__in=[DeploymentState.SERVING, DeploymentState.UPDATING, DeploymentState.DEGRADED])[:20]),
        "latest_jobs": jobs[:10],
        "goodput": goodput_overview(team_ids=team_ids),
        "simulated_types": _simulated_types(),  # the job tables badge a job running on SIMULATED chips
    })
    return render(request, "frontend/overview.html", context)


@login_required
def cluster(request):
    _, context = _base_context(request, "cluster")
    nodes = node_utilization(held=held_units_by_node())
    pool_names = [pool.name for pool in node_pool_list()]
    # Heatmap cells: one per node, x = the node's place in its pool, y = the pool.
    slots: dict[str, int] = defaultdict(int)
    cells = []
    for node in nodes:
        x = slots[node["pool"]]
        slots[node["pool"]] += 1
        cells.append({"x": x, "y": pool_names.index(node["pool"]), "name": node["name"], "unit": node["unit"],
                      "used": node["used"], "capacity": node["capacity"], "percent": _pct(node["fraction"]),
                      "health": node["health"], "cordoned": node["cordoned"], "simulated": node["simulated"]})
    context.update({
        "pools": _pools_with_nodes(),
        "accelerator_types": accelerator_type_list(),
        "can_cordon": request.user.is_staff,
        "heatmap": {"pools": pool_names, "columns": max(slots.values(), default=0), "cells": cells},
    })
    return render(request, "frontend/cluster.html", context)


def _quota_limit(quota, cohort: str) -> float | None:
    """The most a cluster queue may hold of a type: nominal, plus borrowing in a cohort (None: no cap)."""
    if not cohort:
        return quota.nominal_quota
    if quota.borrowing_limit is None:
        return None
    return quota.nominal_quota + quota.borrowing_limit


@login_required
def queues(request):
    team_ids, context = _base_context(request, "queues")
    usage = quota_usage()
    serving = serving_quota_usage()  # accelerator replicas count against their queue's quota too
    depth = queue_depth()
    cluster_queues = list(cluster_queue_list())
    chart_rows = []
    for cq in cluster_queues:
        cq.waiting = depth.get(cq.name, 0)
        for quota in cq.quotas.all():
            quota.serving = serving.get((cq.name, quota.accelerator_type.slug), 0.0)
            quota.used = usage.get((cq.name, quota.accelerator_type.slug), 0.0) + quota.serving
            quota.limit = _quota_limit(quota, cq.cohort)
            quota.borrowed = max(0.0, quota.used - quota.nominal_quota)
            scale = quota.limit if quota.limit else max(quota.nominal_quota, quota.used) or 1.0
            quota.used_percent = min(100.0, quota.used / scale * 100)
            quota.nominal_percent = min(100.0, quota.nominal_quota / scale * 100)
            chart_rows.append({"queue": cq.name, "type": quota.accelerator_type.slug,
                               "unit": "CPUs" if quota.accelerator_type.slug == "cpu" else "devices",
                               "used": quota.used, "serving": quota.serving, "nominal": quota.nominal_quota,
                               "limit": quota.limit,
                               "borrowing_limit": quota.borrowing_limit, "cohort": cq.cohort})
    local_usage = quota_usage_by_local_queue(team_ids=team_ids)
    local_counts = job_counts_by_local_queue(team_ids=team_ids)
    local_queues = list(local_queue_list(team_ids=team_ids).order_by("team__name", "name"))
    for lq in local_queues:
        lq.usage = sorted((slug, used) for (queue_id, slug), used in local_usage.items() if queue_id == lq.pk)
        lq.counts = local_counts.get(lq.pk, {"waiting": 0, "holding": 0})
    # the first WAITING_LIMIT in queue order: the page re-renders every 3 s (the jobs page pages through them all)
    waiting = list(waiting_jobs(team_ids=team_ids).select_related("priority_class")[:WAITING_LIMIT])
    context.update({
        "cluster_queues": cluster_queues,
        "quota_chart": chart_rows,
        "waiting_jobs": waiting,
        "waiting_total": len(waiting) if len(waiting) < WAITING_LIMIT else waiting_jobs(team_ids=team_ids).count(),
        "local_queues": local_queues,
        "priority_classes": priority_class_list(),
    })
    return render(request, "frontend/queues.html", context)


@login_required
def datasets(request):
    team_ids, context = _base_context(request, "datasets")
    # paged like the jobs list, and each dataset's latest versions (the API's paged list has them all): the page
    # listed every version of every dataset
    page = Paginator(dataset_list(team_ids=team_ids), DATASETS_PER_PAGE).get_page(request.GET.get("page"))
    rows = list(page.object_list)
    versions = defaultdict(list)
    for version in dataset_versions_latest(team_ids=team_ids, dataset_ids=[dataset.pk for dataset in rows],
                                           limit=VERSIONS_SHOWN):
        versions[version.dataset_id].append(version)
    roles = roles_by_team(user=request.user, team_ids=team_ids)
    for dataset in rows:
        dataset.version_rows = versions.get(dataset.pk, [])
        dataset.can_write = roles.get(dataset.team_id) in ("admin", "member")
    writable = [team for team in context["teams"] if roles.get(team.pk) in ("admin", "member")]
    context.update({
        "datasets": rows, "page": page,
        "writable_teams": writable,
        "read_only_teams": [team for team in context["teams"] if team not in writable],
        "formats": DatasetFormat.choices,
    })
    return render(request, "frontend/datasets.html", context)
