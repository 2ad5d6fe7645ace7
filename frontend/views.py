"""Console pages. Thin: read through selectors, render."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.shortcuts import render

from controlplane.cluster.selectors import node_list, node_pool_list
from controlplane.tenancy.selectors import visible_team_ids
from inference.selectors import deployment_list
from jobs.selectors import training_job_list


@login_required
def overview(request):
    team_ids = visible_team_ids(user=request.user)
    return render(request, "frontend/overview.html", {
        "pools": node_pool_list(),
        "nodes": node_list(),
        "jobs": training_job_list(team_ids=team_ids)[:20],
        "deployments": deployment_list(team_ids=team_ids)[:20],
    })
