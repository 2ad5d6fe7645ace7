"""REST endpoints for training jobs: submit, list, get, cancel, retry, delete, the event timeline, and the
run's metrics and logs (queryable, or streamed with `follow`), faults, checkpoints and ETTR."""

from __future__ import annotations

import json
import time

from django.http import StreamingHttpResponse
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response

from controlplane.common import references
from controlplane.common.api import no_fields_check, validated_query
from controlplane.common.parsers import BoundedJSONParser
from controlplane.compute.registry import get_compute_backend
from controlplane.tenancy.api.scoping import TeamScopedMixin
from controlplane.tenancy.models import Role
from jobs import selectors, services, workflows
from jobs.api import serializers as s
from jobs.api.filters import TrainingJobFilter
from jobs.models import TrainingJob

FOLLOW_POLL_S = 0.5
# The schema of metrics and logs: a page (JSON), or with `follow=true` an NDJSON stream of the same rows (its
# schema reads the stream as the array of its lines). Neither is a paginated list nor takes the job list's
# filters, which drf-spectacular documented for them (found by schemathesis, S7).
NDJSON = "application/x-ndjson"


def _stream_schema(query_serializer, page_serializer, row_serializer):
    return extend_schema(parameters=[query_serializer],
                         responses={200: page_serializer, (200, NDJSON): row_serializer(many=True)})


class TrainingJobViewSet(TeamScopedMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin,
                         viewsets.GenericViewSet):
    serializer_class = s.TrainingJobSerializer
    filterset_class = TrainingJobFilter
    submission_actions = ("create", "retry")  # may answer 429 (controlplane.common.openapi)
    ordering_fields = ["id", "created_at", "name", "state", "state_changed_at"]
    search_fields = ["name"]

    def get_queryset(self):
        return selectors.training_job_list(team_ids=self.team_ids).select_related("created_by")

    def filter_queryset(self, queryset):
        """The list's filters, search and ordering narrow the list only. A job's own routes ran them too (DRF's
        get_object does), so `GET /training-jobs/7/?state=FAILED` of a running job was a 404, and so were its cancel,
        retry and delete with such a parameter (QA); they refuse query parameters instead (`_no_query_params`)."""
        return queryset if self.detail else super().filter_queryset(queryset)

    def retrieve(self, request, pk=None):
        job = self.get_object()
        _no_query_params(request)
        return Response(self.get_serializer(job).data)

    @extend_schema(request=s.TrainingJobCreateSerializer, responses={201: s.TrainingJobSerializer})
    def create(self, request):
        data = s.TrainingJobCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = dict(data.validated_data)
        team = self.resolve_team(values.pop("team", None))
        checkpoint = values.pop("checkpoint") or {}
        job = services.training_job_create(
            actor=request.user, team=team,
            local_queue=references.resolve_local_queue(team=team, name=values.pop("queue")),
            priority_class=references.resolve_priority_class(name=values.pop("priority")),
            dataset_version=references.resolve_dataset_version(team=team, reference=values.pop("dataset")),
            checkpoint_interval_steps=checkpoint.get("interval_steps", 100),
            checkpoint_keep_last=checkpoint.get("keep_last", 3),
            **values,
        )
        return Response(s.TrainingJobSerializer(self.get_queryset().get(pk=job.pk)).data,
                        status=status.HTTP_201_CREATED)

    # JSON only (as the console and SDK send it): the body is optional, so a multipart body that parsed to
    # nothing was taken for "no reason" instead of refused (found by schemathesis, S7).
    @extend_schema(request=s.CancelSerializer, responses=s.TrainingJobSerializer)
    @action(detail=True, methods=["post"], parser_classes=[BoundedJSONParser])
    def cancel(self, request, pk=None):
        job = self.get_object()
        self.require_role(job.team_id, Role.MEMBER)
        _no_query_params(request)
        data = s.CancelSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        services.training_job_cancel(actor=request.user, job=job, reason=data.validated_data["reason"])
        return Response(s.TrainingJobSerializer(self.get_queryset().get(pk=job.pk)).data)

    @extend_schema(request=None, responses={201: s.TrainingJobSerializer})
    @action(detail=True, methods=["post"])
    def retry(self, request, pk=None):
        """A new job with this ended job's spec (secrets included), named `<name>-retry-<n>`."""
        job = self.get_object()
        self.require_role(job.team_id, Role.MEMBER)
        _no_query_params(request)
        no_fields_check(request)
        new = services.training_job_retry(actor=request.user, job=job)
        return Response(s.TrainingJobSerializer(self.get_queryset().get(pk=new.pk)).data,
                        status=status.HTTP_201_CREATED)

    def destroy(self, request, pk=None):
        job = self.get_object()
        self.require_role(job.team_id, Role.MEMBER)
        _no_query_params(request)
        services.training_job_delete(actor=request.user, job=job)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(responses=s.TrainingJobEventSerializer(many=True))
    @action(detail=True, methods=["get"], filter_backends=[])
    def events(self, request, pk=None):
        job = self.get_object()
        page = self.paginate_queryset(selectors.training_job_events(job=job))
        return self.get_paginated_response(s.TrainingJobEventSerializer(page, many=True).data)

    @_stream_schema(s.MetricQuerySerializer, s.TrainingMetricPageSerializer, s.TrainingMetricSerializer)
    @action(detail=True, methods=["get"], filter_backends=[], pagination_class=None)
    def metrics(self, request, pk=None):
        """Per-worker step metrics (step, loss, step time, compute time, tokens/s), oldest first."""
        job = self.get_object()
        query = validated_query(request, s.MetricQuerySerializer)

        def rows(after):
            return selectors.training_job_metrics(job=job, since_step=query.get("since_step"),
                                                  worker=query.get("worker"), after_id=after)
        return _respond(job, query, rows, s.TrainingMetricSerializer)

    @_stream_schema(s.StreamQuerySerializer, s.TrainingLogPageSerializer, s.TrainingLogLineSerializer)
    @action(detail=True, methods=["get"], filter_backends=[], pagination_class=None)
    def logs(self, request, pk=None):
        """The run's log lines (every worker; `worker=` for one), oldest first; `follow=true` streams."""
        job = self.get_object()
        query = validated_query(request, s.StreamQuerySerializer)

        def rows(after):
            return selectors.training_job_logs(job=job, after_id=after, worker=query.get("worker"))
        return _respond(job, query, rows, s.TrainingLogLineSerializer)

    @extend_schema(responses=s.TrainingFaultSerializer(many=True))
    @action(detail=True, methods=["get"], filter_backends=[], pagination_class=None)
    def faults(self, request, pk=None):
        """Detected faults with node, worker, evidence, detection time and how the run recovered."""
        job = self.get_object()
        _no_query_params(request)
        return Response(s.TrainingFaultSerializer(selectors.training_job_faults(job=job), many=True).data)

    @extend_schema(methods=["GET"], responses=s.CheckpointSerializer(many=True))
    @extend_schema(methods=["POST"], request=None, responses={202: s.CheckpointRequestedSerializer})
    @action(detail=True, methods=["get", "post"], filter_backends=[], pagination_class=None)
    def checkpoints(self, request, pk=None):
        """GET: the complete checkpoints (step, size, time). POST: ask the running job for one now."""
        job = self.get_object()
        if request.method == "POST":
            self.require_role(job.team_id, Role.MEMBER)
            no_fields_check(request)
            step = workflows.training_job_request_checkpoint(actor=request.user, job=job,
                                                             backend=get_compute_backend())
            return Response({"requested": True, "step": step}, status=status.HTTP_202_ACCEPTED)
        _no_query_params(request)
        return Response(s.CheckpointSerializer(selectors.training_job_checkpoints(job=job), many=True).data)

    @extend_schema(responses=s.GoodputOverviewSerializer)
    @action(detail=False, methods=["get"])
    def goodput(self, request):
        """Effective training time ratio of the jobs you can see, together and per job."""
        _no_query_params(request)
        return Response(selectors.goodput_overview(team_ids=self.team_ids))


def _no_query_params(request) -> None:
    """A 400 naming each query parameter of a route that takes none but `format`: the faults, the checkpoints and the
    goodput overview ignored them, so `goodput/?team=beta` or `faults/?kind=hang` answered for everything (QA); a job,
    its cancel, retry and delete took the list's filters (TrainingJobViewSet.filter_queryset)."""
    unknown = sorted(set(request.query_params) - {"format"})
    if unknown:
        raise ValidationError({name: ["unknown query parameter; accepted: format"] for name in unknown})


def _respond(job: TrainingJob, query: dict, rows, serializer):
    """A page (`results` + `next_after`), or with follow an NDJSON stream that ends with the job."""
    limit = query["limit"]
    if not query["follow"]:
        page = list(rows(query.get("after"))[:limit])
        return Response({"results": serializer(page, many=True).data,
                         "next_after": page[-1].id if page else query.get("after")})

    def stream():
        after = query.get("after")
        deadline = time.monotonic() + query["timeout"]
        while True:
            ended = TrainingJob.objects.filter(pk=job.pk, state__in=TrainingJob.terminal_state_values()).exists()
            page = list(rows(after)[:limit])
            for item in serializer(page, many=True).data:
                yield json.dumps(item) + "\n"
            if page:
                after = page[-1].id
                continue
            if ended or time.monotonic() >= deadline:
                return
            time.sleep(FOLLOW_POLL_S)

    return StreamingHttpResponse(stream(), content_type=NDJSON)
