"""Console pages for training jobs: the list with filters, submit (form or YAML), and a job's page.

Actions (submit, cancel, retry, clone) go through the REST API from the browser (frontend/static/
frontend/console.js), so the console validates and acts exactly as the API does.
"""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.shortcuts import get_object_or_404, render

from frontend.views import _base_context, _state_counts
from inference.selectors import deployment_list
from jobs.selectors import training_job_events, training_job_list, training_job_run_view
from jobs.states import JobState

JOBS_PER_PAGE = 50


@login_required
def job_list(request):
    team_ids, context = _base_context(request, "jobs")
    jobs = training_job_list(team_ids=team_ids)
    state = request.GET.get("state", "").upper()
    if state not in JobState.__members__:
        state = ""
    counts = _state_counts(jobs, JobState)
    if state:
        jobs = jobs.filter(state=state)
    page = Paginator(jobs, JOBS_PER_PAGE).get_page(request.GET.get("page"))
    context.update({"page": page, "jobs": page.object_list, "state": state, "job_counts": counts,
                    "total": sum(n for _, n in counts)})
    return render(request, "frontend/jobs.html", context)


@login_required
def job_detail(request, job_id: int):
    team_ids, context = _base_context(request, "jobs")
    job = get_object_or_404(training_job_list(team_ids=team_ids), pk=job_id)
    context.update({
        "job": job,
        "events": training_job_events(job=job),
        "deployments": deployment_list(team_ids=team_ids).filter(source_job=job),
        **training_job_run_view(job=job),
    })
    return render(request, "frontend/job_detail.html", context)
