"""Writes about deployments: create (with its first revision), update, scale, delete, and workflow transitions.

Every change of the spec bumps the deployment's `revision` and writes a DeploymentRevision holding the
whole new spec and why; the rolling update itself is the workflow's (inference/workflows.py), enqueued
after the commit.
"""

from __future__ import annotations

import os
from pathlib import Path

from django.db import transaction

from controlplane.common import references
from controlplane.common.errors import ConflictError, ValidationFailed
from controlplane.common.lifecycle import record_event, transition
from controlplane.common.limits import deployment_size_check, lock_team_submissions, submission_rate_check
from controlplane.common.tasks import dispatch_on_commit
from controlplane.compute.base import ROUTERS
from controlplane.quotas.models import LocalQueue, PriorityClass
from controlplane.quotas.selectors import check_workload_request
from controlplane.tenancy.models import Team
from controlplane.tenancy.services import audit_record
from inference.models import Deployment, DeploymentEvent, DeploymentRevision
from inference.runtime.engine_config import EngineConfig
from inference.states import DeploymentState
from jobs.models import TrainingJob
from jobs.runtime.checkpoints import latest_checkpoint
from jobs.workflows import checkpoint_dir

SPEC_FIELDS = ("model_uri", "accelerator_types", "devices_per_replica", "replicas_min", "replicas_max",
               "sla_ttft_p95_ms", "sla_tpot_p95_ms", "sla_min_throughput_tps", "engine", "router")
# What deployment_update may change (source_job is a TrainingJob or None).
UPDATABLE_FIELDS = (*SPEC_FIELDS, "source_job")
S = DeploymentState
# A deployment serves one model (the spec's "give model or checkpoint, not both"); before, the API took both and
# served the model_uri.
NOT_BOTH = "give a model_uri or a source_job whose checkpoint to serve, not both (model_uri is also given)"
# The longest file or folder name, in bytes, that file systems take (Linux's NAME_MAX): a longer one fails every file
# system call on the path (ENAMETOOLONG), as a NUL character does.
NAME_MAX = 255


def deployment_spec(deployment: Deployment) -> dict:
    spec = {name: getattr(deployment, name) for name in SPEC_FIELDS}
    spec["source_job"] = deployment.source_job_id
    spec["local_queue"] = deployment.local_queue.name
    spec["priority_class"] = deployment.priority_class.name if deployment.priority_class else None
    return spec


def validate_engine(engine: dict | None) -> dict:
    """The engine settings as stored (only the keys given); a bad one is a 400 naming `engine.<name>`."""
    if engine is None:
        return {}
    if not isinstance(engine, dict):
        raise ValidationFailed("must be an object of engine settings", field="engine")
    try:
        EngineConfig.from_dict(engine)
    except (TypeError, ValueError) as exc:  # the message starts with the setting's name
        message = str(exc)
        name = message.split(":", 1)[0].strip()
        if name not in EngineConfig.__dataclass_fields__:
            name = next((key for key in engine if key not in EngineConfig.__dataclass_fields__), "")
        raise ValidationFailed(message, field=f"engine.{name}" if name else "engine") from None
    return dict(engine)


def validate_router(router: str) -> str:
    if router not in ROUTERS:
        raise ValidationFailed(f"{router!r} is not a router (choose {', '.join(ROUTERS)})", field="router")
    return router


def validate_model_uri(model_uri: str) -> str:
    """An absolute path or a file:// URI of a directory holding config.json + model.pt (checked at deploy), inside
    the platform's model folders (FLEETYARD_MODEL_DIRS): never another team's checkpoints or the host's files."""
    from inference.workflows import model_dir_refusal, model_uri_path

    if not model_uri:
        return model_uri
    path = model_uri_path(model_uri)
    if path is None:
        raise ValidationFailed("must be an absolute path or a file:// URI of a model directory (config.json + "
                               "model.pt)", field="model_uri")
    # Before any file system call: a path holding NUL (`file:///m%00`) or a name longer than NAME_MAX made them raise
    # (ValueError, OSError) and the create or update answered 500.
    if "\x00" in str(path):
        raise ValidationFailed("must not contain a NUL character (%00)", field="model_uri")
    long_name = next((part for part in path.parts if len(os.fsencode(part)) > NAME_MAX), None)
    if long_name is not None:
        raise ValidationFailed(f"the name {long_name[:40]}... is {len(os.fsencode(long_name))} bytes long; a folder or "
                               f"file name takes at most {NAME_MAX}", field="model_uri")
    refusal = model_dir_refusal(path)
    if refusal:
        raise ValidationFailed(refusal, field="model_uri")
    return model_uri


def _check_model(model_uri: str, engine: dict, source_job: TrainingJob | None = None) -> None:
    """The model to serve is checked now (a 400), not only at deploy: a model_uri's directory must exist and hold
    config.json + model.pt, and a finished source job must have a complete checkpoint that holds them (a job still
    running may save one: the deploy waits for it), as the deploy would refuse them for good; and when its
    config.json is already there, its shape must be a built-in LM's, and with the engine settings its replicas' keys
    and values must fit a replica."""
    from inference.workflows import CONFIG_FILE, MODEL_FILE, model_refusal, model_uri_path

    path = None
    if model_uri:
        path = model_uri_path(model_uri)
        # as the deploy checks it (workflows.resolve_model_dir), which failed the deployment right after a 201
        missing = _model_dir_missing(path) if path is not None else ""
        if missing:
            raise ValidationFailed(missing, field="model_uri")
    elif source_job is not None:
        root = checkpoint_dir(source_job)
        try:
            info = latest_checkpoint(root)
        except OSError:  # an unreadable checkpoint folder: the deploy reports it
            info = None
        if source_job.is_terminal:  # it saves no more checkpoints: what it has now is all it will ever have
            if info is None:
                raise ValidationFailed(
                    f"training job {source_job.pk} ({source_job.name}) is {source_job.state} and has no complete "
                    f"checkpoint under {root}: there is nothing to serve (a job still running is waited for)",
                    field="source_job")
            missing = [name for name in (CONFIG_FILE, MODEL_FILE) if name not in info.files]
            if missing:
                raise ValidationFailed(f"checkpoint {info.path} of training job {source_job.pk} has no "
                                       f"{', '.join(missing)} (only built-in LM checkpoints can be served)",
                                       field="source_job")
        path = Path(info.path) if info is not None else None
    refused = model_refusal(path, engine) if path is not None else None
    if refused:
        field, why = refused
        raise ValidationFailed(why, field=field)


def _model_dir_missing(path: Path) -> str:
    """Why a model directory (inside the model folders) cannot be served as it is now: it does not exist, or lacks
    config.json / model.pt; "" when it has them."""
    from inference.workflows import CONFIG_FILE, MODEL_FILE

    if not path.is_dir():
        return f"model directory {path} does not exist" if not path.exists() else f"{path} is not a directory"
    missing = [name for name in (CONFIG_FILE, MODEL_FILE) if not (path / name).is_file()]
    if missing:
        return f"model directory {path} has no {', '.join(missing)} (a built-in LM's config.json and model.pt)"
    return ""


def _validate_replicas(replicas_min: int, replicas_max: int, *, sent: set[str] | None = None) -> None:
    """`sent`: the fields the client gave (None: both). A bound the client did not send is the deployment's, so a
    minimum above it is the minimum's fault: `PATCH {"replicas_min": 3}` on 1-2 replicas was refused as "replicas_max:
    must be at least replicas_min (3)", a field the client never sent (QA)."""
    if replicas_min < 0:
        raise ValidationFailed("must be at least 0", field="replicas_min")
    if replicas_max < replicas_min:
        if sent is not None and "replicas_max" not in sent:
            raise ValidationFailed(f"must be at most replicas_max ({replicas_max}); send replicas_max too to raise "
                                   f"both", field="replicas_min")
        raise ValidationFailed(f"must be at least replicas_min ({replicas_min})", field="replicas_max")
    if replicas_max < 1:
        raise ValidationFailed("must be at least 1", field="replicas_max")
    deployment_size_check(replicas_min=replicas_min, replicas_max=replicas_max)


@transaction.atomic
def deployment_create(*, actor, team: Team, name: str, local_queue: LocalQueue, accelerator_types: list[str],
                      sla_ttft_p95_ms: int, sla_tpot_p95_ms: int, model_uri: str = "",
                      source_job: TrainingJob | None = None, devices_per_replica: float = 1.0,
                      replicas_min: int = 1, replicas_max: int | None = None,
                      sla_min_throughput_tps: float | None = None,
                      priority_class: PriorityClass | None = None, engine: dict | None = None,
                      router: str = "prefix") -> Deployment:
    if local_queue.team_id != team.pk:
        raise ValidationFailed(f"queue {local_queue.name} does not belong to team {team.name}",
                               field="local_queue")
    if source_job is not None and source_job.team_id != team.pk:
        raise ValidationFailed("training job not found in this team", field="source_job")
    if not model_uri and source_job is None:
        raise ValidationFailed("give a model_uri or a source_job whose checkpoint to serve", field="model_uri")
    if model_uri and source_job is not None:
        raise ValidationFailed(NOT_BOTH, field="source_job")
    validate_model_uri(model_uri)
    engine = validate_engine(engine)
    _check_model(model_uri, engine, source_job)
    router = validate_router(router)
    # Checked under the team's lock: two creates of one name at once both found it free, and the second hit the
    # unique constraint (a 500 on PostgreSQL; QA, 2026-11-29).
    lock_team_submissions(team=team)
    if Deployment.objects.filter(team=team, name=name).exclude(
        state__in=[DeploymentState.DELETED, DeploymentState.FAILED]
    ).exists():
        raise ValidationFailed(f"team {team.name} already has a live deployment named {name!r}", field="name")
    replicas_max = replicas_min if replicas_max is None else replicas_max
    _validate_devices_per_replica(devices_per_replica)
    _check_replica_fits_a_node(list(accelerator_types), devices_per_replica)
    _validate_replicas(replicas_min, replicas_max)
    if sla_ttft_p95_ms < 1 or sla_tpot_p95_ms < 1:
        raise ValidationFailed("SLA targets must be positive milliseconds",
                               field="sla_ttft_p95_ms" if sla_ttft_p95_ms < 1 else "sla_tpot_p95_ms")
    check_workload_request(local_queue=local_queue, accelerator_types=accelerator_types)
    # last: a request refused for its content takes no slot (the team is locked above: not a second time)
    submission_rate_check(team=team, team_locked=True)
    deployment = Deployment(
        team=team, name=name, local_queue=local_queue, priority_class=priority_class, source_job=source_job,
        model_uri=model_uri, accelerator_types=list(accelerator_types),
        devices_per_replica=devices_per_replica, replicas_min=replicas_min, replicas_max=replicas_max,
        sla_ttft_p95_ms=sla_ttft_p95_ms, sla_tpot_p95_ms=sla_tpot_p95_ms,
        sla_min_throughput_tps=sla_min_throughput_tps, engine=engine, router=router, created_by=actor,
        state=DeploymentState.PENDING, state_reason="waiting to be placed and deployed",
    )
    deployment.full_clean()
    deployment.save()
    DeploymentRevision.objects.create(deployment=deployment, number=1, spec=deployment_spec(deployment),
                                      reason="created", created_by=actor)
    record_event(obj=deployment, event_model=DeploymentEvent, from_state="", to_state=DeploymentState.PENDING,
                 reason="created", actor=actor)
    audit_record(actor=actor, team=team, action="deployment.create", target=deployment,
                 data={"name": name, **deployment_spec(deployment)})
    from inference.tasks import deploy_deployment

    dispatch_on_commit(deploy_deployment, deployment.pk)
    return deployment


@transaction.atomic
def deployment_update(*, actor, deployment: Deployment, changes: dict, reason: str = "") -> Deployment:
    """Change the spec: a new revision, rolled out by the workflow (SERVING/DEGRADED -> UPDATING).

    `changes` holds any of UPDATABLE_FIELDS; a change that changes nothing is a 400."""
    # of=self: PostgreSQL cannot lock the nullable side of an outer join (priority_class)
    deployment = Deployment.objects.select_for_update(of=("self",)).select_related(
        "local_queue", "priority_class").get(pk=deployment.pk)
    if deployment.is_terminal:
        raise ConflictError(f"deployment {deployment.name} is {deployment.state}; it cannot change any more",
                            field="state")
    unknown = sorted(set(changes) - set(UPDATABLE_FIELDS))
    if unknown:
        raise ValidationFailed(f"cannot be changed (changeable: {', '.join(UPDATABLE_FIELDS)})", field=unknown[0])
    values = _validated_changes(deployment, changes)
    changed = {name: value for name, value in values.items() if _differs(deployment, name, value)}
    if not changed:
        raise ValidationFailed(f"nothing to change: {', '.join(sorted(changes)) or 'no fields'} already "
                               f"as given", field=next(iter(sorted(changes)), None))
    before = {name: _current(deployment, name) for name in changed}
    for name, value in changed.items():
        setattr(deployment, name, value)
    if changed.get("source_job") is not None and changed.get("model_uri"):
        raise ValidationFailed(NOT_BOTH, field="source_job")
    if "source_job" in changed and changed["source_job"] is not None and "model_uri" not in changed:
        deployment.model_uri = ""  # a job's checkpoint replaces the uploaded model
    if "model_uri" in changed and changed["model_uri"] and "source_job" not in changed:
        deployment.source_job = None
    if not deployment.model_uri and deployment.source_job_id is None:
        raise ValidationFailed("give a model_uri or a source_job whose checkpoint to serve", field="model_uri")
    if {"model_uri", "source_job", "engine"} & set(changed):  # the model it will serve, as settled just above
        _check_model(deployment.model_uri, deployment.engine, deployment.source_job)
    if {"devices_per_replica", "accelerator_types"} & set(changed):
        _check_replica_fits_a_node(list(deployment.accelerator_types), float(deployment.devices_per_replica))
    _check_quota_for_more(deployment, before, changed)
    deployment.revision += 1
    deployment.full_clean()
    deployment.save()
    why = reason or f"changed {', '.join(sorted(changed))}"
    DeploymentRevision.objects.create(deployment=deployment, number=deployment.revision,
                                      spec=deployment_spec(deployment), reason=why[:200], created_by=actor)
    data = {"revision": deployment.revision, "changed": {name: {"from": before[name], "to": _current(deployment, name)}
                                                         for name in changed}}
    if deployment.state in (S.SERVING, S.DEGRADED):
        deployment = transition(obj=deployment, machine=Deployment.machine, event_model=DeploymentEvent,
                                to=S.UPDATING, reason=f"rolling update to revision {deployment.revision}: {why}",
                                actor=actor, data=data)
    else:
        record_event(obj=deployment, event_model=DeploymentEvent, from_state=deployment.state,
                     to_state=deployment.state, reason=f"revision {deployment.revision}: {why}", actor=actor,
                     data=data)
    audit_record(actor=actor, team=deployment.team_id, action="deployment.update", target=deployment, data=data)
    from inference.tasks import apply_deployment_revision

    dispatch_on_commit(apply_deployment_revision, deployment.pk)
    return deployment


def deployment_scale(*, actor, deployment: Deployment, replicas_min: int, replicas_max: int) -> Deployment:
    """New replica bounds: a revision like any other change of the spec."""
    return deployment_update(actor=actor, deployment=deployment,
                             changes={"replicas_min": replicas_min, "replicas_max": replicas_max},
                             reason=f"scaled to {replicas_min}-{replicas_max} replica(s)")


def _validated_changes(deployment: Deployment, changes: dict) -> dict:
    values = dict(changes)
    if "source_job" in values:
        job = values["source_job"]
        if job is not None and (not isinstance(job, TrainingJob) or job.team_id != deployment.team_id):
            raise ValidationFailed("training job not found in this team", field="source_job")
    if "model_uri" in values:
        values["model_uri"] = validate_model_uri(values["model_uri"] or "")
    if "engine" in values:
        values["engine"] = validate_engine(values["engine"])
    if "router" in values:
        values["router"] = validate_router(values["router"])
    if "accelerator_types" in values:
        values["accelerator_types"] = list(values["accelerator_types"] or [])
        check_workload_request(local_queue=deployment.local_queue, accelerator_types=values["accelerator_types"])
    if "devices_per_replica" in values:
        _validate_devices_per_replica(values["devices_per_replica"])
    _validate_replicas(values.get("replicas_min", deployment.replicas_min),
                       values.get("replicas_max", deployment.replicas_max), sent=set(values))
    for name in ("sla_ttft_p95_ms", "sla_tpot_p95_ms"):
        if name in values and values[name] < 1:
            raise ValidationFailed("SLA targets must be positive milliseconds", field=name)
    return values


def _validate_devices_per_replica(devices: float) -> None:
    """A fraction of one device, or whole devices: 2.5 devices is neither (Ray reserves more than one unit only in whole
    units, and mixed load held round(2.5) = 2 per replica, so training was admitted onto devices replicas used)."""
    if not devices > 0:
        raise ValidationFailed("must be more than 0", field="devices_per_replica")
    if devices > 1 and not float(devices).is_integer():
        raise ValidationFailed(f"{devices:g} devices per replica: give a fraction of one device (up to 1) or a whole "
                               "number of devices", field="devices_per_replica")


def _check_replica_fits_a_node(accelerator_types: list[str], devices: float) -> None:
    """Refuse replicas no known node of any accepted accelerator type could hold, even empty (16 devices where every
    H100 node has 8): Ray would never place one, and mixed load could not count the ones that were running."""
    from controlplane.cluster.models import Node

    largest: dict[str, float] = {}
    for slug, capacity in Node.objects.filter(pool__accelerator_type__slug__in=[t for t in accelerator_types
                                                                                if t != "cpu"]) \
            .values_list("pool__accelerator_type__slug", "capacity_devices"):
        largest[slug] = max(largest.get(slug, 0.0), float(capacity))
    types = [t for t in accelerator_types if t != "cpu"]
    if not types or devices <= 1 or any(slug not in largest or devices <= largest[slug] + 1e-9 for slug in types):
        return  # a CPU replica, a share of one device, a type with no known nodes yet, or one that holds it
    sizes = "; ".join(f"the largest {slug} node has {largest[slug]:g} devices" for slug in types)
    raise ValidationFailed(f"{devices:g} devices per replica: no node of an accepted type could hold one replica "
                           f"({sizes})", field="devices_per_replica")


def _check_quota_for_more(deployment: Deployment, before: dict, changed: dict) -> None:
    """A change that raises what the deployment must always run (replicas_min, or devices per replica) is refused when
    its cluster queue's quota cannot take that many (training and other deployments counted as the deploy check
    counts them); before, a scale to 2-2 on a quota of one replica was applied and ran 16 devices on a quota of 8."""
    raised = [name for name in ("replicas_min", "devices_per_replica")
              if name in changed and changed[name] > before[name]]
    if not raised or not deployment.devices_per_replica:
        return
    from inference.selectors import serving_quota_refusal

    types = [deployment.accelerator_type] if deployment.accelerator_type else list(deployment.accelerator_types)
    refusals = [serving_quota_refusal(deployment=deployment, accelerator_type=slug, replicas=deployment.replicas_min)
                for slug in types if slug and slug != "cpu"]
    if refusals and all(refusals):
        raise ValidationFailed(f"{deployment.replicas_min} replica(s) of {deployment.devices_per_replica:g} device(s) "
                               f"at all times: {refusals[0]}", field=raised[0])


def _current(deployment: Deployment, name: str):
    return deployment.source_job_id if name == "source_job" else getattr(deployment, name)


def _differs(deployment: Deployment, name: str, value) -> bool:
    if name == "engine":  # {} and {"slots": 4} are the same settings
        return EngineConfig.from_dict(deployment.engine).to_dict() != EngineConfig.from_dict(value).to_dict()
    return _current(deployment, name) != (value.pk if isinstance(value, TrainingJob) else value)


def deployment_create_from_body(*, actor, team: Team, values: dict, spec_yaml: str = "") -> Deployment:
    """A deployment from the validated create body of the API (DeploymentCreateSerializer, without `team`):
    resolves the queue, priority and source job in the team, then deployment_create."""
    values = dict(values)
    sla = values.pop("sla")
    source_job = None
    if values.get("source_job"):
        source_job = TrainingJob.objects.filter(pk=values["source_job"], team=team).first()
        if source_job is None:
            raise ValidationFailed(f"training job {values['source_job']} not found in team {team.name}",
                                   field="source_job")
    values.pop("source_job", None)
    deployment = deployment_create(
        actor=actor, team=team, source_job=source_job,
        local_queue=references.resolve_local_queue(team=team, name=values.pop("queue")),
        priority_class=references.resolve_priority_class(name=values.pop("priority", "")),
        sla_ttft_p95_ms=sla["ttft_p95_ms"], sla_tpot_p95_ms=sla["tpot_p95_ms"],
        sla_min_throughput_tps=sla.get("min_throughput_tps"), **values)
    if spec_yaml:
        Deployment.objects.filter(pk=deployment.pk).update(spec_yaml=spec_yaml)
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
    if deployment.replicas_limit is not None or deployment.capacity_held:
        # no quota limits what no longer runs (the API showed the last one), and nothing is held for it
        deployment.replicas_limit, deployment.capacity_held = None, []
        Deployment.objects.filter(pk=deployment.pk).update(replicas_limit=None, capacity_held=[])
    if was_placed:
        from inference.tasks import tear_down_deployment

        dispatch_on_commit(tear_down_deployment, deployment.pk)
    return deployment
