"""Limits on what one request may ask of the platform (issue 8, S6; OWASP API4, unrestricted resource consumption).

- `RequestBodyLimitMiddleware`: a body longer than FLEETYARD_MAX_REQUEST_BODY_BYTES is answered 413 from its
  Content-Length alone, before anything reads it (a dataset upload, multipart to a dataset's versions, may be
  up to FLEETYARD_MAX_DATASET_UPLOAD_BYTES). Without the check a JSON body was read whole into memory by the
  parser, and a multipart upload was spooled whole to a temporary file before its size was looked at.
- `job_size_check` / `deployment_size_check`: workers, devices and replicas of one workload, as 400s naming
  the field (services call them, so the API, retry and spec apply all get them).
- `submission_rate_check`: training jobs and deployments a team may submit per minute. It counts the team's
  submission audit events of the last minute in the database, under a lock on the team row, like the sign-in
  throttle (tenancy.LoginThrottle): every web process sees the same count and two concurrent submissions
  cannot both take the last slot. Audit events are never deleted with the job, so cancelling and deleting
  does not give a slot back.
"""

from __future__ import annotations

import math
from datetime import timedelta

from django.conf import settings
from django.db import connection
from django.http import JsonResponse
from django.urls import Resolver404, resolve
from django.utils import timezone

from controlplane.common.errors import RateLimited, ValidationFailed

# URL names whose POST may carry a dataset file (multipart) of up to FLEETYARD_MAX_DATASET_UPLOAD_BYTES.
UPLOAD_URL_NAMES = frozenset({"dataset-versions"})
# Room for the multipart boundaries and the other form fields around the file.
MULTIPART_OVERHEAD_BYTES = 64 * 1024
# Audit actions that are a submission (training_job_create, which retry and spec apply use too, and
# deployment_create).
SUBMISSION_ACTIONS = ("training_job.create", "deployment.create")
SUBMISSION_WINDOW = timedelta(minutes=1)


def declared_body_length(meta: dict) -> int:
    """The request's Content-Length (0 when absent or malformed: Django then reads no body at all)."""
    try:
        return max(0, int(meta.get("CONTENT_LENGTH") or 0))
    except ValueError:
        return 0


def body_limit_refusal(*, length: int, path: str, content_type: str) -> tuple[str, int] | None:
    """(field, limit) when a body of `length` bytes to `path` is too long, or None."""
    general = settings.FLEETYARD_MAX_REQUEST_BODY_BYTES
    if length <= general:
        return None
    if content_type.startswith("multipart/form-data") and _is_upload_route(path):
        upload_limit = settings.FLEETYARD_MAX_DATASET_UPLOAD_BYTES
        return None if length <= upload_limit + MULTIPART_OVERHEAD_BYTES else ("file", upload_limit)
    return ("body", general)


def _is_upload_route(path: str) -> bool:
    try:
        return resolve(path).url_name in UPLOAD_URL_NAMES
    except Resolver404:
        return False


class RequestBodyLimitMiddleware:
    """Answers 413 to a body longer than its limit before any of it is read (the limit is checked against the
    declared Content-Length; Django never reads past it, and reads nothing without one)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        length = declared_body_length(request.META)
        refusal = body_limit_refusal(length=length, path=request.path_info,
                                     content_type=request.META.get("CONTENT_TYPE", "")) if length else None
        if refusal is None:
            return self.get_response(request)
        field, limit = refusal
        setting = "FLEETYARD_MAX_DATASET_UPLOAD_BYTES" if field == "file" else "FLEETYARD_MAX_REQUEST_BODY_BYTES"
        message = f"request body of {length} bytes is over the limit of {limit} bytes ({setting})"
        if request.path_info.startswith("/v1/"):  # the OpenAI-compatible gateway answers in OpenAI's error shape
            body = {"error": {"message": message, "type": "invalid_request_error", "param": None,
                              "code": "request_too_large"}}
        else:
            body = {field: [message]}
        response = JsonResponse(body, status=413)
        response["Connection"] = "close"  # the unread body must not be taken for the next request
        return response


def job_size_check(*, workers_min: int, workers_max: int, devices_per_worker: int) -> None:
    """Refuse a training job larger than the platform's limits (400 naming the field)."""
    max_workers = settings.FLEETYARD_MAX_WORKERS_PER_JOB
    for field, value in (("workers_min", workers_min), ("workers_max", workers_max)):
        if value > max_workers:
            raise ValidationFailed(f"{value} workers is over the limit of {max_workers} per job "
                                   "(FLEETYARD_MAX_WORKERS_PER_JOB)", field=field)
    max_per_worker = settings.FLEETYARD_MAX_DEVICES_PER_WORKER
    if devices_per_worker > max_per_worker:
        raise ValidationFailed(f"{devices_per_worker} devices per worker is over the limit of {max_per_worker} "
                               "(FLEETYARD_MAX_DEVICES_PER_WORKER)", field="devices_per_worker")
    max_devices = settings.FLEETYARD_MAX_DEVICES_PER_JOB
    if workers_max * devices_per_worker > max_devices:
        raise ValidationFailed(f"{workers_max} workers x {devices_per_worker} devices = "
                               f"{workers_max * devices_per_worker} devices is over the limit of {max_devices} "
                               "per job (FLEETYARD_MAX_DEVICES_PER_JOB)", field="workers_max")


def deployment_size_check(*, replicas_min: int, replicas_max: int) -> None:
    """Refuse a deployment with more replicas than the platform's limit (400 naming the field)."""
    limit = settings.FLEETYARD_MAX_REPLICAS_PER_DEPLOYMENT
    for field, value in (("replicas_min", replicas_min), ("replicas_max", replicas_max)):
        if value > limit:
            raise ValidationFailed(f"{value} replicas is over the limit of {limit} per deployment "
                                   "(FLEETYARD_MAX_REPLICAS_PER_DEPLOYMENT)", field=field)


def lock_team_submissions(*, team) -> None:
    """Lock the team's row until the transaction ends, so its submissions are decided one after the other (the rate
    limit counts them; a deployment's live name is checked free before it is taken). FOR NO KEY UPDATE where the
    database has it: rows that only reference the team (jobs, audit events) are not blocked by the lock, only other
    submissions of this team."""
    from controlplane.tenancy.models import Team

    no_key = connection.features.has_select_for_no_key_update
    list(Team.objects.select_for_update(no_key=no_key).filter(pk=team.pk).values_list("pk", flat=True))


def submission_rate_check(*, team, now=None, team_locked: bool = False) -> None:
    """Raise RateLimited (429, Retry-After) when the team has submitted its limit of training jobs and
    deployments in the last minute. Call it inside the transaction that records the submission: it locks the
    team row (lock_team_submissions; `team_locked`: the caller holds that lock already in this transaction, and
    it is not taken again), so concurrent submissions of one team are counted one after the other."""
    from controlplane.tenancy.models import AuditEvent

    limit = settings.FLEETYARD_MAX_SUBMISSIONS_PER_TEAM_PER_MINUTE
    if not limit:
        return
    if not team_locked:
        lock_team_submissions(team=team)
    now = now or timezone.now()
    recent = list(AuditEvent.objects.filter(team=team, action__in=SUBMISSION_ACTIONS,
                                            created_at__gt=now - SUBMISSION_WINDOW)
                  .order_by("-created_at").values_list("created_at", flat=True)[:limit])
    if len(recent) < limit:
        return
    # A slot frees when the oldest of the last `limit` submissions leaves the window.
    retry_after = math.ceil((recent[-1] + SUBMISSION_WINDOW - now).total_seconds())
    raise RateLimited(f"team {team.name} submitted {limit} training jobs and deployments in the last "
                      f"{int(SUBMISSION_WINDOW.total_seconds())} s, its limit "
                      f"(FLEETYARD_MAX_SUBMISSIONS_PER_TEAM_PER_MINUTE); retry in {max(1, retry_after)} s",
                      retry_after=retry_after)
