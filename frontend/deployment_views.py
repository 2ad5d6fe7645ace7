"""Console pages for deployments: the list, create with an SLA, a deployment's page and its playground.

Actions (create, update, scale, delete) go through the REST API from the browser (console.js). The one
console endpoint here is the playground: a browser session has no team API token for the gateway, so
POST /deployments/<id>/playground/ runs the gateway's own chat completion (same parsing, same
generation, same request log) for a member of the deployment's team, answered as server-sent events.
"""

from __future__ import annotations

import time
import uuid
from urllib.parse import urlencode

from django.contrib.auth.decorators import login_required
from django.core.exceptions import RequestDataTooBig
from django.core.paginator import Paginator
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_POST

from controlplane.cluster.selectors import node_pool_list
from controlplane.compute.base import ROUTERS
from controlplane.quotas.selectors import local_queue_list, priority_class_list
from controlplane.tenancy.models import Role
from controlplane.tenancy.selectors import has_role, visible_team_ids
from frontend.views import (
    TIMELINE_LIMIT,
    _base_context,
    _id_param,
    _mark_simulated_deployments,
    _state_counts,
    _timeline,
    _writable_team_ids,
)
from inference.gateway import services as gateway
from inference.gateway.openai_schema import CHAT_COMPLETIONS, GatewayError, parse_json_body, parse_request
from inference.gateway.views import error_response, stream_response
from inference.selectors import (
    deployable_jobs,
    deployment_list,
    deployment_metrics,
    deployment_pools,
)
from inference.states import DeploymentState

CONSOLE_METRICS_WINDOW_S = 900  # the deployment page shows the last 15 minutes of requests
PLAYGROUND_MAX_TOKENS = 64  # the playground's default answer length
DEPLOYMENTS_PER_PAGE = 50
SLA_DEFAULTS = {"ttft_p95_ms": 500, "tpot_p95_ms": 50}


@login_required
def deployment_list_page(request):
    team_ids, context = _base_context(request, "deployments")
    everything = deployment_list(team_ids=team_ids)
    states = [state.value for state in DeploymentState]
    wanted = request.GET.get("state", "").upper()
    wanted = wanted if wanted in states else ""
    deployments = everything.filter(state=wanted) if wanted else everything
    # paged like the jobs list: deleted deployments stay listed, and the live region re-renders every 3 s
    page = Paginator(deployments, DEPLOYMENTS_PER_PAGE).get_page(request.GET.get("page"))
    context.update({"deployments": _mark_simulated_deployments(page.object_list), "page": page,
                    "page_query": urlencode({"state": wanted} if wanted else {}), "state_filter": wanted,
                    "total": everything.count(),
                    "deployment_counts": _state_counts(everything, DeploymentState),
                    "can_create": bool(_writable_team_ids(request.user, team_ids))})
    return render(request, "frontend/deployments.html", context)


@login_required
def deployment_new(request):
    """The create form: it posts JSON to POST /api/v1/deployments/ and opens the new deployment's page."""
    team_ids, context = _base_context(request, "deployments")
    writable = _writable_team_ids(request.user, team_ids)
    jobs = list(deployable_jobs(team_ids=writable))
    chosen_job = None
    wanted = request.GET.get("job", "")
    wanted_id = _id_param(wanted)
    if wanted_id is not None:
        chosen_job = next((job for job in jobs if job.pk == wanted_id), None)
    pools = list(node_pool_list())
    types: dict[str, dict] = {}
    for pool in pools:
        entry = types.setdefault(pool.accelerator_type.slug, {"slug": pool.accelerator_type.slug,
                                                              "model": pool.accelerator_type.model,
                                                              "pools": [], "simulated": True})
        entry["pools"].append(pool.name)
        entry["simulated"] = entry["simulated"] and pool.simulated
    context.update({
        "writable_teams": [team for team in context["teams"] if team.pk in writable],
        "queues": local_queue_list(team_ids=writable),
        "priorities": priority_class_list(),
        "jobs": jobs,
        "chosen_job": chosen_job,
        "job_missing": bool(wanted) and chosen_job is None,
        "accelerators": list(types.values()),
        "routers": ROUTERS,
        "sla_defaults": SLA_DEFAULTS,
    })
    return render(request, "frontend/deployment_new.html", context)


@login_required
def deployment_detail(request, deployment_id: int):
    team_ids, context = _base_context(request, "deployments")
    deployment = get_object_or_404(deployment_list(team_ids=team_ids), pk=deployment_id)
    metrics = deployment_metrics(deployment=deployment, window_s=CONSOLE_METRICS_WINDOW_S)
    revisions = list(deployment.revisions.select_related("created_by")[:TIMELINE_LIMIT])
    context.update({
        "deployment": deployment,
        "can_write": has_role(user=request.user, team_id=deployment.team_id, minimum=Role.MEMBER),
        "live": not deployment.is_terminal,
        "serving": deployment.state in gateway.SERVING_STATES,
        "pools": deployment_pools(deployment=deployment),
        "revisions": revisions,  # the newest first, as many as the timeline shows (the API pages through them all)
        "revisions_total": len(revisions) if len(revisions) < TIMELINE_LIMIT else deployment.revisions.count(),
        **_timeline(deployment.events.all(), api=f"/api/v1/deployments/{deployment.pk}/events/"),
        "metrics": metrics,
        "chart_data": {"series": metrics["series"], "sla": metrics["sla"],
                       "window_s": CONSOLE_METRICS_WINDOW_S,
                       "metrics_url": f"/api/v1/deployments/{deployment.pk}/metrics/"},
        "metrics_window_min": CONSOLE_METRICS_WINDOW_S // 60,
        "api_base": request.build_absolute_uri("/v1/"),
        "routers": ROUTERS,
        "playground_max_tokens": PLAYGROUND_MAX_TOKENS,
    })
    return render(request, "frontend/deployment_detail.html", context)


@login_required
@require_POST
def deployment_playground(request, deployment_id: int):
    """A chat completion on this deployment for the signed-in member, streamed as server-sent events.

    The body is an OpenAI chat completions body (`messages`, `max_tokens`, ...); `model` and `stream` are
    set here. Errors are the gateway's OpenAI-shaped JSON (403 for a viewer, 503 not serving, 429, 400)."""
    started = time.monotonic()
    deployment = get_object_or_404(deployment_list(team_ids=visible_team_ids(user=request.user)), pk=deployment_id)
    try:
        if not has_role(user=request.user, team_id=deployment.team_id, minimum=Role.MEMBER):
            raise GatewayError("the playground needs the member role in the deployment's team", status=403,
                               kind="permission_error", code="forbidden")
        if deployment.is_terminal:
            raise GatewayError(f"the deployment {deployment.name!r} is {deployment.state}; it takes no requests",
                               status=409, kind="invalid_request_error", code="model_not_live")
        try:
            body = parse_json_body(request.body)
        except RequestDataTooBig as exc:
            raise GatewayError(f"the request body is too large: {exc}", status=413,
                               code="request_too_large") from None
        body.update(model=deployment.name, stream=True)
        parsed = parse_request(body, endpoint=CHAT_COMPLETIONS)
        generation = gateway.completion_start(team=deployment.team, request=parsed, started=started)
    except GatewayError as error:
        return error_response(error)
    return stream_response(generation, parsed, f"chatcmpl-{uuid.uuid4().hex}", int(time.time()))
