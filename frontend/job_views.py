"""Console pages for training jobs: the list with filters, submit (form or YAML), and a job's page.

Actions (submit, cancel, retry, clone) go through the REST API from the browser (frontend/static/
frontend/console.js and pages/jobs.js), so the console validates and acts exactly as the API does.
"""

from __future__ import annotations

import json
from urllib.parse import urlencode

from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.shortcuts import get_object_or_404, render

from controlplane.cluster.selectors import accelerator_type_list
from controlplane.datasets.selectors import dataset_version_list
from controlplane.quotas.selectors import local_queue_list, priority_class_list, quota_types_for_local_queue
from controlplane.tenancy.models import Role
from controlplane.tenancy.selectors import has_role
from frontend.views import (
    _base_context,
    _id_param,
    _simulated_types,
    _state_counts,
    _timeline,
    _writable_team_ids,
)
from inference.selectors import deployment_list
from jobs.models import Trainer
from jobs.runtime.lm_config import TrainHyperparameters
from jobs.selectors import (
    training_job_events,
    training_job_list,
    training_job_run_view,
    training_job_trainer_layout,
)
from jobs.states import JobState

JOBS_PER_PAGE = 50
# Live states: the page keeps polling (htmx) and following the logs while the job is in one of them.
LIVE_STATES = [s.value for s in JobState if s.value not in ("SUCCEEDED", "FAILED", "CANCELLED")]


@login_required
def job_list(request):
    team_ids, context = _base_context(request, "jobs")
    jobs = training_job_list(team_ids=team_ids)
    queues = sorted(set(local_queue_list(team_ids=team_ids).values_list("name", flat=True)))
    types = [t.slug for t in accelerator_type_list()]
    state = request.GET.get("state", "").upper()
    if state not in JobState.__members__:
        state = ""
    queue = request.GET.get("queue", "")
    if queue not in queues:
        queue = ""
    accelerator = request.GET.get("accelerator", "")
    if accelerator not in types:
        accelerator = ""
    # NUL cannot be in a PostgreSQL text value (the query raised, a 500); no job name holds one.
    search = request.GET.get("q", "").replace("\x00", "").strip()[:100]
    if queue:
        jobs = jobs.filter(local_queue__name=queue)
    if accelerator:  # the JSON list of accepted types holds the quoted slug (slugs never contain quotes)
        jobs = jobs.filter(accelerator_types__icontains=f'"{accelerator}"')
    if search:
        jobs = jobs.filter(name__icontains=search)
    counts = _state_counts(jobs, JobState)
    if state:
        jobs = jobs.filter(state=state)
    page = Paginator(jobs, JOBS_PER_PAGE).get_page(request.GET.get("page"))
    filters = {k: v for k, v in (("q", search), ("queue", queue), ("accelerator", accelerator)) if v}
    context.update({
        "page": page, "jobs": page.object_list, "state": state, "job_counts": counts,
        "total": sum(n for _, n in counts), "queues": queues, "accelerator_types": types,
        "queue": queue, "accelerator": accelerator, "search": search, "filtered": bool(filters),
        # query strings that keep the other filters: for the state pills, and (with the state) for the pager
        "filter_query": urlencode(filters), "page_query": urlencode({**filters, **({"state": state} if state else {})}),
        "any_jobs": bool(team_ids) and training_job_list(team_ids=team_ids).exists(),
        "simulated_types": _simulated_types(),
    })
    return render(request, "frontend/jobs.html", context)


def _clone_initial(job) -> dict:
    """The form's values from a job's spec. Secrets are not copied (their values never leave the server)."""
    name = f"{job.name[:57].rstrip('-')}-clone"
    return {
        "team": job.team.name, "name": name, "queue": job.local_queue.name,
        "priority": job.priority_class.name if job.priority_class else "",
        "accelerator_types": list(job.accelerator_types), "workers_min": job.workers_min,
        "workers_max": job.workers_max, "devices_per_worker": job.devices_per_worker,
        "cpus_per_worker": job.cpus_per_worker, "trainer": job.trainer, "entrypoint": job.entrypoint,
        "working_dir": job.working_dir,
        "hyperparameters": json.dumps(job.hyperparameters, indent=2) if job.hyperparameters else "",
        "envs": json.dumps(job.envs, indent=2) if job.envs else "",
        "parallelism": json.dumps(job.parallelism, indent=2) if job.parallelism else "",
        "dataset": (f"dataset://{job.dataset_version.dataset.name}@{job.dataset_version.version}"
                    if job.dataset_version else ""),
        "checkpoint_interval_steps": job.checkpoint_interval_steps, "checkpoint_keep_last": job.checkpoint_keep_last,
        "max_restarts": job.max_restarts, "max_duration_seconds": job.max_duration_seconds or "",
    }


def _example_yaml(queue: str, accelerator: str, team: str = "") -> str:
    """The YAML tab's starting spec; `team` names the team (the API asks for it when the user is in several)."""
    devices = "" if accelerator == "cpu" else ":1"
    team_line = f"team: {team}\n" if team else ""
    return (f"# A training job spec (the same file `fleetyard apply` takes).\n"
            f"name: my-first-job\n"
            f"{team_line}"
            f"queue: {queue}\n"
            f"workers: 1\n"
            f"resources:\n"
            f"  accelerators: {accelerator}{devices}\n"
            f"hyperparameters:\n"
            f"  steps: 200\n"
            f"checkpoint: {{interval_steps: 50, keep_last: 3}}\n")


@login_required
def job_new(request):
    team_ids, context = _base_context(request, "jobs")
    teams = list(context["teams"])
    writable = set(_writable_team_ids(request.user, team_ids))
    simulated = _simulated_types()
    queues = []
    for local_queue in local_queue_list(team_ids=team_ids).order_by("team__name", "name"):
        queues.append({"team": local_queue.team.name, "name": local_queue.name,
                       "cluster_queue": local_queue.cluster_queue.name,
                       "types": sorted(quota_types_for_local_queue(local_queue=local_queue))})
    offered = sorted({slug for q in queues for slug in q["types"]})
    facts = {t.slug: t for t in accelerator_type_list()}
    type_rows = [{"slug": slug, "model": getattr(facts.get(slug), "model", ""),
                  "price": getattr(facts.get(slug), "price_per_hour_usd", None), "simulated": slug in simulated,
                  "queues": " ".join(f"{q['team']}/{q['name']}" for q in queues if slug in q["types"])}
                 for slug in offered]
    initial = {"checkpoint_interval_steps": 100, "checkpoint_keep_last": 3, "max_restarts": 3, "workers_min": 1,
               "devices_per_worker": 1, "cpus_per_worker": None, "trainer": Trainer.BUILTIN_LM,
               "hyperparameters": json.dumps({"steps": TrainHyperparameters.steps}, indent=2),
               "accelerator_types": []}
    clone = None
    clone_id = request.GET.get("clone", "")
    if clone_id:
        clone = get_object_or_404(training_job_list(team_ids=team_ids), pk=_id_param(clone_id) or 0)
        initial = _clone_initial(clone)
    # The chosen types first, in their preference order, then the rest.
    chosen = initial["accelerator_types"]
    type_rows.sort(key=lambda row: (chosen.index(row["slug"]) if row["slug"] in chosen else len(chosen), row["slug"]))
    yaml_text = clone.spec_yaml if clone is not None and clone.spec_yaml else ""
    if not yaml_text and queues:
        # A queue of a team the user may submit to (the first queue could be a viewer team's).
        example = next((q for q in queues if q["team"] in {t.name for t in teams if t.pk in writable}), queues[0])
        types = example["types"] or offered
        yaml_text = _example_yaml(example["name"], "cpu" if "cpu" in types else types[0] if types else "cpu",
                                  team=example["team"] if len(teams) > 1 else "")
    context.update({
        "queues": queues, "type_rows": type_rows, "priority_classes": priority_class_list(),
        "dataset_versions": [{"ref": f"dataset://{v.dataset.name}@{v.version}", "team": v.dataset.team.name}
                             for v in dataset_version_list(team_ids=team_ids).order_by("dataset__name", "-version")],
        "simulated_type_list": sorted(simulated),
        "trainers": Trainer.choices, "initial": initial, "clone": clone,
        "clone_secrets": sorted(clone.secret_envs or {}) if clone is not None else [],
        "several_teams": len(teams) > 1, "can_submit": bool(writable),
        "read_only_teams": [team.name for team in teams if team.pk not in writable],
        "yaml_text": yaml_text, "tab": "yaml" if request.GET.get("tab") == "yaml" else "form",
    })
    return render(request, "frontend/job_new.html", context)


@login_required
def job_detail(request, job_id: int):
    team_ids, context = _base_context(request, "jobs")
    job = get_object_or_404(training_job_list(team_ids=team_ids), pk=job_id)
    run = training_job_run_view(job=job)
    context.update({
        "job": job,
        **_timeline(training_job_events(job=job), api=f"/api/v1/training-jobs/{job.pk}/events/"),
        "deployments": deployment_list(team_ids=team_ids).filter(source_job=job),
        "can_write": has_role(user=request.user, team_id=job.team_id, minimum=Role.MEMBER),
        "live": job.state in LIVE_STATES,
        "simulated_types": _simulated_types(),
        "workers": range(job.workers_max),
        "trainer_layout": training_job_trainer_layout(job=job),
        "log_after": run["log_lines"][-1].id if run["log_lines"] else "",
        **run,
    })
    return render(request, "frontend/job_detail.html", context)
