"""Writes for specs: create the training job or deployment a parsed spec describes, with the YAML kept
on it for the console. Resolves the names the spec uses, then calls the one create service of its kind."""

from __future__ import annotations

from django.db import transaction

from controlplane.common import references
from controlplane.common.errors import ValidationFailed
from controlplane.tenancy.models import Team
from inference import services as inference_services
from inference.models import Deployment
from jobs import services as job_services
from jobs.models import TrainingJob

JOB = "training_job"


def spec_job_secrets(*, secret_names: list[str], secrets: dict[str, str]) -> dict:
    """The values of the secrets the spec names, as the client sent them (kept apart from `envs`: the workers
    get them, the API shows only their names)."""
    missing = [name for name in secret_names if name not in secrets]
    if missing:
        raise ValidationFailed(f"no value sent for {', '.join(missing)} (the CLI reads them from your environment)",
                               field="secrets")
    extra = sorted(set(secrets) - set(secret_names))
    if extra:
        raise ValidationFailed(f"{', '.join(extra)} not named under secrets in the spec", field="secrets")
    return {name: str(secrets[name]) for name in secret_names}


@transaction.atomic
def spec_apply(*, actor, team: Team, kind: str, values: dict, spec_yaml: str) -> TrainingJob | Deployment:
    """`values`: the validated create body (without team) of the spec's kind."""
    if kind != JOB:
        return inference_services.deployment_create_from_body(actor=actor, team=team, values=values,
                                                              spec_yaml=spec_yaml)
    values = dict(values)
    checkpoint = values.pop("checkpoint") or {}
    job = job_services.training_job_create(
        actor=actor, team=team, local_queue=references.resolve_local_queue(team=team, name=values.pop("queue")),
        priority_class=references.resolve_priority_class(name=values.pop("priority", "")),
        dataset_version=references.resolve_dataset_version(team=team, reference=values.pop("dataset")),
        checkpoint_interval_steps=checkpoint.get("interval_steps", 100),
        checkpoint_keep_last=checkpoint.get("keep_last", 3), **values)
    TrainingJob.objects.filter(pk=job.pk).update(spec_yaml=spec_yaml)
    return job


class _Rehearsed(Exception):
    """Ends a rehearsal: the transaction it ran in rolls back."""


def spec_apply_rehearse(*, actor, team: Team, kind: str, values: dict, spec_yaml: str) -> None:
    """Run spec_apply and roll it back: raises what the apply would (DomainError), writes and sends nothing (tasks are
    sent on commit). A dry run checked only the spec's fields and the plan, so it answered "fits now" for specs the
    apply then refused: an unknown dataset, bad hyperparameters, a checkpoint of a job that does not exist (QA)."""
    try:
        with transaction.atomic():
            spec_apply(actor=actor, team=team, kind=kind, values=values, spec_yaml=spec_yaml)
            raise _Rehearsed
    except _Rehearsed:
        pass
