"""Writes about deployments: create (with its first revision), delete, and workflow transitions."""

from __future__ import annotations

from django.db import transaction

from controlplane.common.errors import ConflictError, ValidationFailed
from controlplane.common.lifecycle import record_event, transition
from controlplane.quotas.models import LocalQueue, PriorityClass
from controlplane.quotas.selectors import check_workload_request
from controlplane.tenancy.models import Team
from controlplane.tenancy.services import audit_record
from inference.models import Deployment, DeploymentEvent, DeploymentRevision
from inference.states import DeploymentState
from jobs.models import TrainingJob

SPEC_FIELDS = ("model_uri", "accelerator_types", "devices_per_replica", "replicas_min", "replicas_max",
               "sla_ttft_p95_ms", "sla_tpot_p95_ms", "sla_min_throughput_tps")


def deployment_spec(deployment: Deployment) -> dict:
    spec = {name: getattr(deployment, name) for name in SPEC_FIELDS}
    spec["source_job"] = deployment.source_job_id
    spec["local_queue"] = deployment.local_queue.name
    spec["priority_class"] = deployment.priority_class.name if deployment.priority_class else None
    return spec


@transaction.atomic
def deployment_create(*, actor, team: Team, name: str, local_queue: LocalQueue, accelerator_types: list[str],
                      sla_ttft_p95_ms: int, sla_tpot_p95_ms: int, model_uri: str = "",
                      source_job: TrainingJob | None = None, devices_per_replica: float = 1.0,
                      replicas_min: int = 1, replicas_max: int | None = None,
                      sla_min_throughput_tps: float | None = None,
                      priority_class: PriorityClass | None = None) -> Deployment:
    if local_queue.team_id != team.pk:
        raise ValidationFailed(f"queue {local_queue.name} does not belong to team {team.name}",
                               field="local_queue")
    if source_job is not None and source_job.team_id != team.pk:
        raise ValidationFailed("training job not found in this team", field="source_job")
    if not model_uri and source_job is None:
        raise ValidationFailed("give a model_uri or a source_job whose checkpoint to serve", field="model_uri")
    if Deployment.objects.filter(team=team, name=name).exclude(
        state__in=[DeploymentState.DELETED, DeploymentState.FAILED]
    ).exists():
        raise ValidationFailed(f"team {team.name} already has a live deployment named {name!r}", field="name")
    replicas_max = replicas_min if replicas_max is None else replicas_max
    if replicas_max < replicas_min:
        raise ValidationFailed(f"must be at least replicas_min ({replicas_min})", field="replicas_max")
    if replicas_max < 1:
        raise ValidationFailed("must be at least 1", field="replicas_max")
    if sla_ttft_p95_ms < 1 or sla_tpot_p95_ms < 1:
        raise ValidationFailed("SLA targets must be positive milliseconds",
                               field="sla_ttft_p95_ms" if sla_ttft_p95_ms < 1 else "sla_tpot_p95_ms")
    check_workload_request(local_queue=local_queue, accelerator_types=accelerator_types)
    deployment = Deployment(
        team=team, name=name, local_queue=local_queue, priority_class=priority_class, source_job=source_job,
        model_uri=model_uri, accelerator_types=list(accelerator_types),
        devices_per_replica=devices_per_replica, replicas_min=replicas_min, replicas_max=replicas_max,
        sla_ttft_p95_ms=sla_ttft_p95_ms, sla_tpot_p95_ms=sla_tpot_p95_ms,
        sla_min_throughput_tps=sla_min_throughput_tps, created_by=actor, state=DeploymentState.PENDING,
        state_reason="waiting for the serving workflow (not yet available in this release)",
    )
    deployment.full_clean()
    deployment.save()
    DeploymentRevision.objects.create(deployment=deployment, number=1, spec=deployment_spec(deployment),
                                      reason="created", created_by=actor)
    record_event(obj=deployment, event_model=DeploymentEvent, from_state="", to_state=DeploymentState.PENDING,
                 reason="created", actor=actor)
    audit_record(actor=actor, team=team, action="deployment.create", target=deployment,
                 data={"name": name, **deployment_spec(deployment)})
    return deployment


@transaction.atomic
def deployment_delete(*, actor, deployment: Deployment) -> Deployment:
    deployment = Deployment.objects.select_for_update().get(pk=deployment.pk)
    if deployment.state == DeploymentState.DELETED:
        raise ConflictError(f"deployment {deployment.name} is already deleted", field="state")
    was_placed = bool(deployment.compute_handle)
    if deployment.state == DeploymentState.FAILED:
        audit_record(actor=actor, team=deployment.team_id, action="deployment.delete", target=deployment,
                     data={"name": deployment.name})
        deployment.delete()
        return deployment
    deployment = transition(obj=deployment, machine=Deployment.machine, event_model=DeploymentEvent,
                            to=DeploymentState.DELETED, reason=f"deleted by {actor.get_username()}", actor=actor)
    if was_placed:
        from inference.tasks import tear_down_deployment

        transaction.on_commit(lambda: tear_down_deployment.delay(deployment.pk))
    return deployment
