"""The serving workflow of a deployment: deploy, apply a revision (rolling update), sync, repair drift.

Called by the Celery tasks in inference/tasks.py (and by tests directly). The deployment row is the
desired state (its spec and `revision`) and the record of the observed one (replicas, the revision the
backend runs, the measured window, the autoscaling settings in force); the service itself lives in the
compute backend (a Ray Serve application named `fy-serve-<id>`). Every function is idempotent and safe
to run twice or after a crash:

- `deployment_deploy`: PENDING -> DEPLOYING: place it (the first accepted accelerator type whose live,
  uncordoned nodes have room for `replicas_min` replicas), resolve the model directory, and deploy.
  Without room it stays PENDING with the reason (the sync retries); without a model it FAILS.
- `deployment_apply_revision`: a rolling update to the spec's revision (SERVING/DEGRADED were moved to
  UPDATING by the service that bumped the revision).
- `deployment_sync`: observe the service; DEPLOYING/UPDATING -> SERVING once it runs the current revision
  with enough replicas; SERVING <-> DEGRADED on an SLA breach (measured from the request log) or missing
  replicas; steer the Serve autoscaling target (inference/autoscaling.py); redeploy a service that vanished.
- `reconcile_orphan_services`: delete services no live deployment owns.
"""

from __future__ import annotations

import dataclasses
import logging
from datetime import timedelta
from pathlib import Path
from urllib.parse import unquote, urlparse

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from controlplane.cluster.selectors import never_hold_reason
from controlplane.common.lifecycle import record_event, transition
from controlplane.compute.base import ServiceSpec, ServiceStatus
from controlplane.quotas.services import lock_cluster_queues
from inference import selectors
from inference.autoscaling import (
    MIN_REQUESTS,
    AutoscalingDecision,
    Sla,
    adjust_autoscaling,
    initial_autoscaling,
)
from inference.models import Deployment, DeploymentEvent
from inference.runtime.engine_config import EngineConfig
from inference.states import DeploymentState
from jobs.runtime.checkpoints import latest_checkpoint
from jobs.runtime.lm_config import CONFIG_FILE, MODEL_FILE
from jobs.workflows import checkpoint_dir

log = logging.getLogger(__name__)

SERVICE_PREFIX = "fy-serve-"
CPUS_PER_REPLICA = 0.25


def replica_cpus(*, accelerator_type: str, devices_per_replica: float) -> float:
    """The cores a replica's server reserves: CPUS_PER_REPLICA, but on an accelerator at most the cores its devices
    come with (as a training worker, jobs.services.worker_cpus), so that replicas never take the cores of devices
    training was admitted to."""
    if accelerator_type == "cpu":
        return CPUS_PER_REPLICA
    from controlplane.cluster.selectors import capped_cores, cpus_per_device

    return capped_cores(CPUS_PER_REPLICA, cpus_per_device(accelerator_type=accelerator_type), devices_per_replica)
S = DeploymentState
# States whose service exists (or should) in the backend.
LIVE_STATES = (S.DEPLOYING, S.SERVING, S.UPDATING, S.DEGRADED)
SYSTEM = "serving"
# A revision the backend still does not run after this long is applied again by the sync (a lost task).
APPLY_GRACE = timedelta(seconds=60)
DEPLOY_TRIES = 5  # failed deploys of a deployment that never served before it fails and frees its quota


class ModelNotFound(Exception):
    """The deployment names no servable model directory."""


class ModelNotReady(ModelNotFound):
    """The source job is still live and has not written a complete checkpoint yet: wait, do not fail."""


class ModelRefused(ModelNotFound):
    """The model is there but cannot be served with these settings (model_refusal): fail, whether or not there is
    room for it."""


CONFIG_READ_LIMIT = 1024 * 1024  # bytes of a model's config.json the control plane reads at most


def model_refusal(model_dir: Path, engine: dict | None) -> tuple[str, str] | None:
    """(field, why) when the built-in LM in `model_dir` cannot be served with these engine settings, else None:
    its shape must be valid ("model_uri"), and a replica's keys and values must fit FLEETYARD_REPLICA_KV_LIMIT_GIB
    ("engine"). A config.json that is not there yet, or not a built-in LM's that the control plane can read, is left
    to the replica, which says what is wrong when it loads it. Read without torch (the weights are never loaded
    here)."""
    import json

    from inference.runtime.engine_config import EngineConfig, kv_memory_refusal, replica_kv_limit_bytes
    from jobs.runtime.lm_config import STATE_FORMAT, LMConfig

    path = model_dir / CONFIG_FILE
    if not path.is_file():
        return None
    try:
        with open(path, "rb") as fh:
            raw = fh.read(CONFIG_READ_LIMIT + 1)
        if len(raw) > CONFIG_READ_LIMIT:  # no built-in LM's config is this big; read no more of it
            return None
        config = json.loads(raw.decode("utf-8"))
    except (OSError, ValueError):  # (json and UnicodeDecodeError are ValueErrors)
        return None
    if not isinstance(config, dict) or config.get("format") != STATE_FORMAT or not isinstance(config.get("model"),
                                                                                               dict):
        return None
    try:
        model = LMConfig.from_dict(config["model"]).to_dict()
    except (ValueError, TypeError) as exc:
        return "model_uri", f"{path}: model {exc}"
    why = kv_memory_refusal(model, EngineConfig.from_dict(engine), replica_kv_limit_bytes())
    return ("engine", why) if why else None


def service_handle(deployment: Deployment) -> str:
    return f"{SERVICE_PREFIX}{deployment.pk}"


def window_seconds() -> int:
    return int(getattr(settings, "FLEETYARD_SERVING_WINDOW_SECONDS", 60))


def sla_of(deployment: Deployment) -> Sla:
    return Sla(ttft_p95_ms=deployment.sla_ttft_p95_ms, tpot_p95_ms=deployment.sla_tpot_p95_ms,
               min_throughput_tps=deployment.sla_min_throughput_tps)


# ------------------------------------------------------------------------------------------ placement

@dataclasses.dataclass(frozen=True)
class Placement:
    accelerator_type: str
    pool: str | None


def choose_placement(deployment: Deployment) -> tuple[Placement | None, str]:
    """The first accepted type (in preference order) with room for replicas_min replicas within the deployment's
    ClusterQueue quota (accelerator replicas count against it like training), or the reason why not.

    A single pool that holds them all is pinned; otherwise the replicas may spread over the type's pools."""
    needed = max(1, deployment.replicas_min)
    missing = []
    never = []  # (why each accepted type could never hold them: its nodes, or its queue's quota ceiling)
    first = deployment.accelerator_types[0]
    per_replica = f"{CPUS_PER_REPLICA:g} CPU" if first == "cpu" else f"{deployment.devices_per_replica:g} device(s)"
    for slug in deployment.accelerator_types:
        devices = 0.0 if slug == "cpu" else float(deployment.devices_per_replica)
        if devices > 0:
            why_never = (never_hold_reason(accelerator_type=slug, units=devices, members=needed)
                         or selectors.serving_quota_never(deployment=deployment, accelerator_type=slug,
                                                          replicas=needed))
            if why_never:
                never.append(why_never)
                missing.append(f"{slug}: {why_never}")
                continue
            refusal = selectors.serving_quota_refusal(deployment=deployment, accelerator_type=slug, replicas=needed)
            if refusal:
                missing.append(f"{slug}: quota: {refusal}")
                continue
        fits = selectors.replica_capacity(accelerator_type=slug, devices_per_replica=devices,
                                          cpus_per_replica=replica_cpus(accelerator_type=slug,
                                                                        devices_per_replica=devices),
                                          for_deployment=deployment.pk)
        pool = next((name for name, count in sorted(fits.items()) if count >= needed), None)
        if pool is not None:
            return Placement(slug, pool), ""
        if sum(fits.values()) >= needed:
            return Placement(slug, None), ""
        where = f"room for {sum(fits.values())} replica(s)" if fits else "no live, uncordoned nodes"
        missing.append(f"{slug}: {where}")
    if len(never) == len(deployment.accelerator_types):  # as the dry run and the scheduler say it of a gang
        return None, (f"it can never run as asked: {needed} replica(s) of {per_replica} each ({'; '.join(never)}); "
                      "it would wait for good: ask for fewer replicas or devices per replica, or an operator for "
                      "more quota or nodes")
    waits_for = "quota" if all(": quota: " in line for line in missing) else "capacity"
    return None, (f"waiting for {waits_for}: {needed} replica(s) of {per_replica} each fit on no accepted "
                  f"accelerator type ({'; '.join(missing)})")


# ------------------------------------------------------------------------------------------ model

def resolve_model_dir(deployment: Deployment) -> str:
    """The directory to serve: the source job's latest complete checkpoint, or the model_uri's directory."""
    if deployment.source_job_id and not deployment.model_uri:
        job = deployment.source_job
        root = checkpoint_dir(job)
        info = latest_checkpoint(root)
        if info is None:
            if not job.is_terminal:
                raise ModelNotReady(f"waiting for the first complete checkpoint of training job {job.pk} "
                                    f"({job.name}, {job.state})")
            raise ModelNotFound(f"training job {job.pk} ({job.name}) has no complete checkpoint under {root}")
        missing = [name for name in (CONFIG_FILE, MODEL_FILE) if name not in info.files]
        if missing:
            raise ModelNotFound(f"checkpoint {info.path} of training job {job.pk} has no {', '.join(missing)} "
                                f"(only built-in LM checkpoints can be served)")
        refused = model_refusal(Path(info.path), deployment.engine)
        if refused:
            raise ModelRefused(refused[1])
        return str(info.path)
    path = model_uri_path(deployment.model_uri)
    if path is None:
        raise ModelNotFound(f"model_uri {deployment.model_uri!r} is not an absolute path or file:// URI")
    refusal = model_dir_refusal(path)
    if refusal:
        raise ModelNotFound(refusal)
    if not path.is_dir():
        raise ModelNotFound(f"model directory {path} does not exist")
    missing = [name for name in (CONFIG_FILE, MODEL_FILE) if not (path / name).is_file()]
    if missing:
        raise ModelNotFound(f"model directory {path} has no {', '.join(missing)}")
    refused = model_refusal(path, deployment.engine)
    if refused:
        raise ModelRefused(refused[1])
    return str(path)


def model_dir_refusal(path: Path) -> str | None:
    """Why a team may not serve this directory (outside FLEETYARD_MODEL_DIRS), or None when it may."""
    resolved = path.resolve()
    roots = [Path(root).resolve() for root in settings.FLEETYARD_MODEL_DIRS]
    if any(resolved == root or root in resolved.parents for root in roots):
        return None
    return (f"{path} is outside the model folders this platform serves from ({', '.join(map(str, roots))}); "
            f"put the model there, or deploy a training job's checkpoint by naming the job")


def model_uri_path(uri: str) -> Path | None:
    """The local path a model_uri names (an absolute path or a file:// URI), or None for any other form."""
    if not uri:
        return None
    if uri.startswith("/"):
        return Path(uri)
    parsed = urlparse(uri)
    if parsed.scheme == "file" and parsed.netloc in ("", "localhost") and parsed.path.startswith("/"):
        return Path(unquote(parsed.path))
    return None


# ------------------------------------------------------------------------------------------ spec

def replicas_allowed(deployment: Deployment) -> int:
    """replicas_max, or fewer while its ClusterQueue's quota takes fewer (`replicas_limit`, set by the scheduling
    cycle; never below replicas_min)."""
    if deployment.replicas_limit is None:
        return deployment.replicas_max
    return max(deployment.replicas_min, min(deployment.replicas_max, deployment.replicas_limit))


def autoscaling_for(deployment: Deployment) -> AutoscalingDecision:
    """The settings for the deployment's current spec: the SLA's initial ones, keeping a learned target
    (capped at the slot count) when the engine's slots did not change. Serve's replica maximum is what the quota
    allows now (`replicas_allowed`)."""
    engine = EngineConfig.from_dict(deployment.engine)
    initial = initial_autoscaling(sla_of(deployment), engine.slots, deployment.replicas_min,
                                  replicas_allowed(deployment))
    current = AutoscalingDecision.from_dict(deployment.autoscaling)
    if current is None or current.slots != initial.slots:
        return initial
    return dataclasses.replace(current, min_replicas=initial.min_replicas, max_replicas=initial.max_replicas,
                               upscale_delay_s=initial.upscale_delay_s, downscale_delay_s=initial.downscale_delay_s,
                               target_ongoing_requests=min(current.target_ongoing_requests, initial.slots),
                               changed=False)


def build_spec(deployment: Deployment, decision: AutoscalingDecision) -> ServiceSpec:
    engine = EngineConfig.from_dict(deployment.engine)
    accelerator_type = deployment.accelerator_type
    return ServiceSpec(
        handle=deployment.compute_handle, deployment_id=deployment.pk, revision=deployment.revision,
        model_dir=deployment.model_dir, accelerator_type=accelerator_type,
        devices_per_replica=0.0 if accelerator_type == "cpu" else float(deployment.devices_per_replica),
        replicas_min=deployment.replicas_min, replicas_max=decision.max_replicas,
        target_ongoing_requests=float(decision.target_ongoing_requests),
        # A replica takes its slots plus its own waiting line. Each caller process has one router (created once,
        # compute/ray_backend.py), which may queue as many as the replicas can take: Ray Serve's router refuses a
        # burst of simultaneous arrivals before it has assigned the first ones, so a smaller line answered 429
        # with idle slots (found by the R4 fault test when a killed gateway worker's callers moved to another).
        max_ongoing_requests=engine.slots + engine.max_waiting,
        max_queued_requests=max(1, engine.slots + engine.max_waiting) * max(1, decision.max_replicas),
        pool=deployment.pool or None, engine=engine.to_dict(),
        cpus_per_replica=replica_cpus(accelerator_type=accelerator_type,
                                      devices_per_replica=float(deployment.devices_per_replica)),
        router=deployment.router,
        # as the decision says (before, Serve ran a fixed 3 s / 30 s while the API showed the decision's delays)
        upscale_delay_s=float(decision.upscale_delay_s), downscale_delay_s=float(decision.downscale_delay_s),
    )


# ------------------------------------------------------------------------------------------ deploy

def deployment_deploy(*, deployment_id: int, backend) -> Deployment | None:
    """PENDING -> DEPLOYING and deploy; stays PENDING (with why) without room, FAILED without a model."""
    with transaction.atomic():
        lock_cluster_queues()  # placed against quotas: not while a scheduling cycle (or another deploy) decides
        deployment = Deployment.objects.select_for_update(of=("self",)).select_related("source_job").filter(
            pk=deployment_id).first()
        if deployment is None or deployment.state != S.PENDING:
            return deployment
        placement, why = choose_placement(deployment)
        if placement is None:
            try:
                resolve_model_dir(deployment)
            except ModelRefused as exc:  # no room would ever make it servable
                return transition(obj=deployment, machine=Deployment.machine, event_model=DeploymentEvent,
                                  to=S.FAILED, reason=f"cannot serve: {exc}", system=SYSTEM)
            except ModelNotFound:
                pass  # missing or not ready yet: said once there is room
            if deployment.state_reason != why:
                Deployment.objects.filter(pk=deployment.pk).update(state_reason=why)
                record_event(obj=deployment, event_model=DeploymentEvent, from_state=S.PENDING, to_state=S.PENDING,
                             reason=why, system="placement")
                deployment.state_reason = why
            return deployment
        try:
            model_dir = resolve_model_dir(deployment)
        except ModelNotReady as exc:
            if deployment.state_reason != str(exc):
                Deployment.objects.filter(pk=deployment.pk).update(state_reason=str(exc))
                record_event(obj=deployment, event_model=DeploymentEvent, from_state=S.PENDING, to_state=S.PENDING,
                             reason=str(exc), system="placement")
                deployment.state_reason = str(exc)
            return deployment
        except ModelNotFound as exc:
            return transition(obj=deployment, machine=Deployment.machine, event_model=DeploymentEvent, to=S.FAILED,
                              reason=f"cannot serve: {exc}", system=SYSTEM)
        deployment.accelerator_type = placement.accelerator_type
        deployment.pool = placement.pool or ""
        deployment.model_dir = model_dir
        deployment.compute_handle = service_handle(deployment)
        quota_note = _limit_to_quota(deployment)
        decision = autoscaling_for(deployment)
        deployment.autoscaling = decision.to_dict()
        deployment.replicas_target = max(1, deployment.replicas_min)
        deployment.save(update_fields=["accelerator_type", "pool", "model_dir", "compute_handle", "autoscaling",
                                       "replicas_target", "replicas_limit"])
        where = f"pool {placement.pool}" if placement.pool else f"the {placement.accelerator_type} pools"
        deployment = transition(
            obj=deployment, machine=Deployment.machine, event_model=DeploymentEvent, to=S.DEPLOYING,
            reason=f"deploying revision {deployment.revision} on {placement.accelerator_type} ({where}), "
                   f"{deployment.replicas_min}-{deployment.replicas_max} replica(s){quota_note}, model {model_dir}",
            system=SYSTEM, data={"handle": deployment.compute_handle, "accelerator_type": placement.accelerator_type,
                                 "pool": placement.pool, "model_dir": model_dir,
                                 "autoscaling": decision.serve_config()})
    # After the commit: a failure here is retried by the task, and the sync redeploys a missing service.
    return _deploy_service(deployment, build_spec(deployment, decision), backend)


def deployment_apply_revision(*, deployment_id: int, backend) -> Deployment | None:
    """Roll the service to the spec's revision. PENDING deployments are deployed instead."""
    deployment = Deployment.objects.filter(pk=deployment_id).first()
    if deployment is None:
        return None
    if deployment.state == S.PENDING:
        return deployment_deploy(deployment_id=deployment_id, backend=backend)
    if deployment.state not in LIVE_STATES:
        return deployment
    with transaction.atomic():
        lock_cluster_queues()  # its replica limit is decided against quotas (as deployment_deploy)
        deployment = Deployment.objects.select_for_update(of=("self",)).select_related("source_job").get(
            pk=deployment_id)
        if deployment.state not in LIVE_STATES or deployment.applied_revision == deployment.revision:
            return deployment
        fields = ["model_dir", "autoscaling", "replicas_target", "replicas_limit"]
        if deployment.accelerator_type not in deployment.accelerator_types:
            placement, why = choose_placement(deployment)
            if placement is None:
                _note(deployment, f"revision {deployment.revision}: {why}; still running revision "
                                  f"{deployment.applied_revision or '-'}")
                return deployment
            deployment.accelerator_type, deployment.pool = placement.accelerator_type, placement.pool or ""
            fields += ["accelerator_type", "pool"]
        # The revision may change the type, replicas_max or the devices per replica: the quota's limit follows now.
        quota_note = _limit_to_quota(deployment)
        try:
            deployment.model_dir = resolve_model_dir(deployment)
        except ModelNotFound as exc:
            reason = (f"revision {deployment.revision} cannot be applied: {exc}; still running revision "
                      f"{deployment.applied_revision or '-'}")
            if deployment.state == S.DEGRADED:
                _note(deployment, reason)
                return deployment
            if deployment.state == S.DEPLOYING:
                return transition(obj=deployment, machine=Deployment.machine, event_model=DeploymentEvent,
                                  to=S.FAILED, reason=f"cannot serve: {exc}", system=SYSTEM)
            return transition(obj=deployment, machine=Deployment.machine, event_model=DeploymentEvent,
                              to=S.DEGRADED, reason=reason, system=SYSTEM)
        decision = autoscaling_for(deployment)
        deployment.autoscaling = decision.to_dict()
        deployment.replicas_target = min(max(deployment.replicas_target, deployment.replicas_min, 1),
                                         deployment.replicas_max)
        deployment.save(update_fields=fields)
        record_event(obj=deployment, event_model=DeploymentEvent, from_state=deployment.state,
                     to_state=deployment.state, system=SYSTEM,
                     reason=f"rolling update to revision {deployment.revision} on {deployment.accelerator_type}"
                            f"{quota_note}",
                     data={"revision": deployment.revision, "model_dir": deployment.model_dir,
                           "autoscaling": decision.serve_config()})
    return _deploy_service(deployment, build_spec(deployment, decision), backend)


def _limit_to_quota(deployment: Deployment) -> str:
    """Set `replicas_limit` to what the ClusterQueue's quota takes on the type the deployment was just placed on, so
    Serve's autoscaler is capped from the first deploy (the scheduling cycle keeps it up to date from then on: before,
    a new deployment could scale to replicas_max past its quota until the next cycle); CPU replicas are not counted.
    Returns a note for the deploy event ("" when the quota takes all of replicas_max)."""
    allowed = deployment.replicas_max
    if deployment.accelerator_type != "cpu" and float(deployment.devices_per_replica) > 0:
        allowed = selectors.serving_quota_replicas(deployment=deployment,
                                                   accelerator_type=deployment.accelerator_type)
    deployment.replicas_limit = allowed if allowed < deployment.replicas_max else None
    if deployment.replicas_limit is None:
        return ""
    return f" (its cluster queue's quota takes {replicas_allowed(deployment)} now)"


def _note(deployment: Deployment, reason: str, data: dict | None = None) -> None:
    """A new reason without a state change (recorded once, not on every pass)."""
    if deployment.state_reason == reason:
        return
    Deployment.objects.filter(pk=deployment.pk).update(state_reason=reason)
    deployment.state_reason = reason
    record_event(obj=deployment, event_model=DeploymentEvent, from_state=deployment.state, to_state=deployment.state,
                 reason=reason, system=SYSTEM, data=data)


# ------------------------------------------------------------------------------------------ sync

def deployment_sync(*, deployment_id: int, backend, now=None) -> Deployment | None:
    """Apply what the backend and the request log show; move the service toward the spec."""
    deployment = Deployment.objects.select_related("source_job").filter(pk=deployment_id).first()
    if deployment is None or deployment.state not in LIVE_STATES or not deployment.compute_handle:
        return deployment
    status = backend.observe_service(deployment.compute_handle)
    if status.state == "not_found":
        return _redeploy_missing(deployment, backend)
    now = now or timezone.now()
    if deployment.state in (S.DEPLOYING, S.UPDATING) and status.state == "running" \
            and status.revision < deployment.revision and _apply_overdue(deployment, now):
        return deployment_apply_revision(deployment_id=deployment.pk, backend=backend)  # the apply was lost
    window = selectors.observed_window(deployment=deployment, window_s=window_seconds(),
                                       replicas_running=status.replicas_running, now=now)
    redeploy = None
    with transaction.atomic():
        deployment = Deployment.objects.select_for_update().get(pk=deployment_id)
        if deployment.state not in LIVE_STATES:
            return deployment
        current = autoscaling_for(deployment)  # under the lock: two passes at once do not both steer
        decision = adjust_autoscaling(current, window, sla_of(deployment))
        applied = AutoscalingDecision.from_dict(deployment.autoscaling)
        if applied is not None and applied.max_replicas != current.max_replicas and not decision.changed:
            # the quota's limit moved (the scheduling cycle): Serve's maximum follows it
            decision = dataclasses.replace(decision, changed=True, reason=(
                f"replicas {current.min_replicas}-{current.max_replicas}: " + (
                    f"its cluster queue's quota takes {current.max_replicas} of {deployment.replicas_max} now"
                    if current.max_replicas < deployment.replicas_max else "the quota takes all of them again")))
        deployment.replicas_ready = status.replicas_running
        deployment.replicas_target = status.replicas_target
        if status.state == "running":
            deployment.applied_revision = status.revision
        deployment.observed = {**dataclasses.asdict(window), "at": now.isoformat(), "service_state": status.state,
                               "replicas_target": status.replicas_target, "revision": status.revision,
                               "message": status.message, "breach": decision.breach,
                               "node_names": list(status.node_names),  # where replicas run: mixed load reads it
                               # where replicas being deployed start (held there by the cycle until they run)
                               "starting_node_names": list(status.starting_node_names)}
        steer = deployment.state in (S.SERVING, S.DEGRADED) and deployment.applied_revision == deployment.revision
        if not steer:  # mid-rollout (or a revision not in force): keep the settings, note the breach only
            decision = dataclasses.replace(current, breach=decision.breach, changed=False)
            if applied is not None:  # (a limit that moved meanwhile is applied once the rollout is done)
                decision = dataclasses.replace(decision, max_replicas=applied.max_replicas)
        deployment.autoscaling = decision.to_dict()
        deployment.save(update_fields=["replicas_ready", "replicas_target", "applied_revision", "observed",
                                       "autoscaling"])
        if decision.changed:
            record_event(obj=deployment, event_model=DeploymentEvent, from_state=deployment.state,
                         to_state=deployment.state, reason=f"autoscaling: {decision.reason}", system="autoscaler",
                         data={"autoscaling": decision.serve_config(), "window": dataclasses.asdict(window)})
            redeploy = decision
        breach = decision.breach
        if breach and current.max_replicas < deployment.replicas_max:  # say so when Serve may not add replicas
            breach += (f"; its cluster queue's quota lets it run {current.max_replicas} of its "
                       f"{deployment.replicas_max} replicas now")
        deployment = _apply_health(deployment, status, breach)
    if redeploy is not None:
        backend.deploy_service(build_spec(deployment, redeploy))
    return deployment


def _apply_overdue(deployment: Deployment, now) -> bool:
    """The spec's revision is older than APPLY_GRACE and the backend still runs an older one."""
    created = deployment.revisions.filter(number=deployment.revision).values_list("created_at", flat=True).first()
    return created is None or now - created > APPLY_GRACE


def _apply_health(deployment: Deployment, status: ServiceStatus, breach: str | None) -> Deployment:
    needed = max(1, deployment.replicas_min)
    running = status.state == "running"
    current = running and status.revision == deployment.revision
    enough = status.replicas_running >= needed
    replicas = f"{status.replicas_running} replica(s) running revision {status.revision}"
    state = deployment.state

    def move(to, reason, **data):
        return transition(obj=deployment, machine=Deployment.machine, event_model=DeploymentEvent, to=to,
                          reason=reason, system=SYSTEM, data={"revision": status.revision,
                                                               "replicas": status.replicas_running, **data})

    note = f" ({status.message})" if status.message else ""  # e.g. the in-memory backend's: no calls from the web
    if state == S.DEPLOYING:
        if current and enough:
            return move(S.SERVING, f"serving: {replicas}{note}")
        if status.state == "unhealthy":  # Serve's DEPLOY_FAILED: its replicas cannot start
            return _unhealthy_first_deploy(deployment, status)
        _note(deployment, f"deploying revision {deployment.revision}: {status.state}, {replicas}"
                          + (f" ({status.message})" if status.message else ""))
        return deployment
    if state == S.UPDATING:
        if current and enough:
            return move(S.SERVING, f"revision {deployment.revision} applied: {replicas}{note}")
        if status.state == "unhealthy":  # the rollout failed (Serve's DEPLOY_FAILED) or the service broke meanwhile:
            # before, it stayed UPDATING for good with the update's own reason, never saying so (QA)
            return move(S.DEGRADED, f"revision {deployment.revision} cannot be applied: service unhealthy"
                                    + (f": {status.message}" if status.message else "")
                                    + f"; still running revision {deployment.applied_revision or '-'}")
        return deployment
    problem = None
    if not running:
        problem = f"service {status.state}" + (f": {status.message}" if status.message else "")
    elif not enough:
        problem = f"only {status.replicas_running} of at least {needed} replica(s) running"
    elif breach:
        problem = f"SLA breach: {breach}"
    elif status.revision != deployment.revision:
        problem = f"running revision {status.revision}, the spec is revision {deployment.revision}"
    if state == S.SERVING and problem:
        return move(S.DEGRADED, problem, breach=breach)
    if state == S.DEGRADED:
        if problem is None:
            return move(S.SERVING, f"healthy again: {replicas}, {_sla_said(deployment)}{note}")
        if "cannot be applied" not in deployment.state_reason:  # keep the more telling reason of a failed update
            _note(deployment, problem)
    return deployment


def _sla_said(deployment: Deployment) -> str:
    """"SLA met" where the window measured it (at least MIN_REQUESTS answered requests), else how few there were:
    a window with no traffic read "SLA met" though it measured nothing (QA)."""
    observed = deployment.observed or {}
    measured = observed.get("measured")
    if measured is None:  # (a window from before `measured`: every request counted)
        measured = observed.get("requests", MIN_REQUESTS)
    if measured >= MIN_REQUESTS:
        return "SLA met"
    window = observed.get("window_s")
    return (f"SLA not measured: {measured} answered request(s) in the last "
            f"{format(window, 'g') if isinstance(window, int | float) else '?'} s, fewer than {MIN_REQUESTS}")


def _unhealthy_first_deploy(deployment: Deployment, status: ServiceStatus) -> Deployment:
    """A service that never served and that the backend reports unhealthy (Serve's DEPLOY_FAILED): said on the
    timeline once per pass, and after DEPLOY_TRIES such passes for its revision the deployment FAILS with the reason
    and gives back its quota and devices (before, it stayed DEPLOYING for good, holding them; QA)."""
    why = "service unhealthy" + (f": {status.message}" if status.message else "")
    passes = deployment.events.filter(to_state=S.DEPLOYING, data__deploy_unhealthy=True,
                                      data__revision=deployment.revision).count() + 1
    if passes >= DEPLOY_TRIES:
        return _fail_deploy(deployment, f"cannot deploy: revision {deployment.revision} does not start: {why} "
                                        f"({passes} passes); its quota and devices are released")
    _note(deployment, f"deploying revision {deployment.revision}: {why} (pass {passes} of {DEPLOY_TRIES} before it "
                      "fails)", data={"revision": deployment.revision, "deploy_unhealthy": True})
    return deployment


def _redeploy_missing(deployment: Deployment, backend) -> Deployment:
    """The row says a service exists and the backend has none: deploy it again (drift repair)."""
    spec = build_spec(deployment, autoscaling_for(deployment))
    if deployment.state == S.DEGRADED and 0 < deployment.applied_revision < deployment.revision:
        spec = dataclasses.replace(spec, revision=deployment.applied_revision)  # its update could not be applied
    latest = deployment.events.order_by("-id").values_list("data", flat=True).first() or {}
    if not ((latest.get("deploy_failed") or latest.get("redeploy_failed"))
            and latest.get("revision") == spec.revision):  # (a retry says only its failure)
        record_event(obj=deployment, event_model=DeploymentEvent, from_state=deployment.state,
                     to_state=deployment.state, system="reconciler", data={"revision": spec.revision},
                     reason=f"service {deployment.compute_handle} not found; deploying revision {spec.revision} again")
    try:
        return _deploy_service(deployment, spec, backend)
    except Exception as exc:
        if deployment.state == S.SERVING:  # it serves nothing while its service is gone (it stayed SERVING; QA)
            transition(obj=deployment, machine=Deployment.machine, event_model=DeploymentEvent, to=S.DEGRADED,
                       system=SYSTEM, data={"revision": spec.revision, "redeploy_failed": True},
                       reason=f"service {deployment.compute_handle} is not running and deploying it again failed "
                              f"({type(exc).__name__}: {exc}); it is tried again every pass")
        raise


def _deploy_service(deployment: Deployment, spec: ServiceSpec, backend) -> Deployment:
    """Send the spec to the backend. A failure is recorded on the timeline with its reason and raised (the task
    retries, and the sync deploys a missing service again); after DEPLOY_TRIES failures of a deployment that never
    served, it FAILS with the reason and gives back the quota and devices it held (before, a service the backend
    refused left it DEPLOYING for good, with a "not found; deploying again" event every pass and never the reason;
    QA)."""
    try:
        backend.deploy_service(spec)
    except Exception as exc:
        reason = f"deploying revision {spec.revision} failed: {type(exc).__name__}: {exc}"
        record_event(obj=deployment, event_model=DeploymentEvent, from_state=deployment.state,
                     to_state=deployment.state, reason=reason, system=SYSTEM,
                     data={"revision": spec.revision, "deploy_failed": True})
        if deployment.state == S.DEPLOYING:
            tries = deployment.events.filter(to_state=S.DEPLOYING, data__deploy_failed=True).count()
            if tries >= DEPLOY_TRIES:
                return _fail_deploy(deployment, f"cannot deploy: {reason} ({tries} tries); its quota and devices "
                                                f"are released")
        raise
    return deployment


def _fail_deploy(deployment: Deployment, reason: str) -> Deployment:
    with transaction.atomic():
        deployment = Deployment.objects.select_for_update().get(pk=deployment.pk)
        if deployment.state != S.DEPLOYING:
            return deployment
        deployment.replicas_limit, deployment.capacity_held = None, []  # (as a deleted one: nothing runs or waits)
        deployment.save(update_fields=["replicas_limit", "capacity_held"])
        return transition(obj=deployment, machine=Deployment.machine, event_model=DeploymentEvent, to=S.FAILED,
                          reason=reason, system=SYSTEM)


def reconcile_orphan_services(*, backend) -> list[str]:
    """Delete services whose deployment is gone, deleted or failed (a Serve app with no live row)."""
    live = set(Deployment.objects.filter(state__in=LIVE_STATES).exclude(compute_handle="")
               .values_list("compute_handle", flat=True))
    orphans = [handle for handle in backend.list_service_handles()
               if handle.startswith(SERVICE_PREFIX) and handle not in live]
    for handle in orphans:
        log.warning("deleting orphan service %s (no live deployment owns it)", handle)
        try:
            backend.delete_service(handle)
        except Exception:  # one service's trouble must not keep the others (QA); the next pass retries it
            log.exception("deleting orphan service %s failed", handle)
    return orphans


def deployment_tear_down(*, deployment_id: int, backend) -> str | None:
    """Delete the service of a deployment that is no longer live (idempotent)."""
    deployment = Deployment.objects.filter(pk=deployment_id).only("compute_handle", "state").first()
    if deployment is None or not deployment.compute_handle or deployment.state in LIVE_STATES:
        return None
    backend.delete_service(deployment.compute_handle)
    return deployment.compute_handle
