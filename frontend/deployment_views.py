"""Console pages for deployments: the list, create with an SLA, a deployment's page and its playground.

Actions (create, update, scale, delete) go through the REST API from the browser (console.js).
"""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, render

from frontend.views import _base_context, _state_counts
from inference.selectors import deployment_list, deployment_metrics
from inference.states import DeploymentState

CONSOLE_METRICS_WINDOW_S = 900  # the deployment page shows the last 15 minutes of requests


@login_required
def deployment_list_page(request):
    team_ids, context = _base_context(request, "deployments")
    deployments = deployment_list(team_ids=team_ids)
    context.update({"deployments": deployments,
                    "deployment_counts": _state_counts(deployments, DeploymentState)})
    return render(request, "frontend/deployments.html", context)


@login_required
def deployment_detail(request, deployment_id: int):
    team_ids, context = _base_context(request, "deployments")
    deployment = get_object_or_404(deployment_list(team_ids=team_ids), pk=deployment_id)
    context.update({
        "deployment": deployment,
        "revisions": deployment.revisions.select_related("created_by"),
        "events": deployment.events.all(),
        "metrics": deployment_metrics(deployment=deployment, window_s=CONSOLE_METRICS_WINDOW_S),
        "metrics_window_min": CONSOLE_METRICS_WINDOW_S // 60,
        "api_base": request.build_absolute_uri("/v1/"),
    })
    return render(request, "frontend/deployment_detail.html", context)
