"""Writes about training jobs: create, cancel, delete, and state transitions made by workflows."""

from __future__ import annotations

import re

from django.db import transaction

from controlplane.common.errors import ConflictError, ValidationFailed
from controlplane.common.lifecycle import record_event, transition
from controlplane.common.limits import job_size_check, lock_team_submissions, submission_rate_check
from controlplane.common.tasks import dispatch_on_commit
from controlplane.datasets.models import DatasetVersion
from controlplane.quotas.models import LocalQueue, PriorityClass
from controlplane.quotas.selectors import check_workload_request
from controlplane.tenancy.models import Team
from controlplane.tenancy.services import audit_record
from jobs.models import Trainer, TrainingJob, TrainingJobEvent
from jobs.runtime.lm_config import TrainHyperparameters, trainer_layout
from jobs.states import JobState


def builtin_layout_check(*, hyperparameters: dict, workers_min: int, workers_max: int) -> None:
    """A built-in job that asks for tensor or pipeline parallelism needs a fixed gang that its degrees divide: every
    rank holds a different part of the model, so the gang cannot grow or shrink one worker at a time."""
    hp = TrainHyperparameters.from_dict(hyperparameters)
    if (hp.tensor_parallel or 1) * (hp.pipeline_parallel or 1) == 1:
        return
    if workers_min != workers_max:
        raise ValidationFailed(f"a tensor- or pipeline-parallel job is not elastic: set workers_min = workers_max "
                               f"(got {workers_min}..{workers_max})", field="workers_min")
    try:
        trainer_layout(hp, world_size=workers_max)
    except ValueError as exc:  # the message starts with the hyperparameter's name
        raise ValidationFailed(str(exc), field="hyperparameters") from None


# The smallest worker on the CPU pool, in cores: its size there. Ray reserves CPU in steps of 0.0001 core; a worker of
# 0 cores would count nothing against quota and fit anywhere (and one of 0 stopped every scheduling cycle: the
# scheduler divides by a worker's size).
MIN_CPU_WORKER_CORES = 0.01
# An environment variable's name as the workers' processes get it (and as fleetyard.spec accepts it): letters,
# digits and _, not starting with a digit. The OS refuses "=" or NUL in a name (the worker failed to start the
# run on the node, long after a 201), and the shell cannot read most other names.
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# The longest `NAME=value` (in bytes, its terminating NUL not counted) Linux passes to a process (MAX_ARG_STRLEN, 32
# pages): a longer one made starting the workers' command fail with E2BIG on every restart, long after a 201.
MAX_ENV_ENTRY_BYTES = 131071
# Variables of a job, envs and secrets together: every one also costs the process a pointer against the OS's limit on
# arguments plus environment (about 2 MiB), so some 100,000 short ones, under the request size limit, could make every
# start fail with E2BIG (QA, 2026-11-29).
MAX_ENV_VARIABLES = 1000


def worker_cpus(*, accelerator_types: list[str], devices_per_worker: int, cpus_per_worker: float | None) -> float:
    """The CPU cores each worker reserves with its devices. On accelerator nodes at most the nodes' cores per
    device times the worker's devices (`cpus_per_device`): the scheduler places workers by devices, so a worker
    asking for more could be put where Ray cannot reserve its cores, and its gang would never start (2 workers of
    4 devices at 1 core each on one 8-device node with 1 core). Unset: 1 core, or that share if smaller. A job that
    also accepts the CPU pool: the cores are its workers' size there (1 unless set); on an accelerator it reserves
    at most that share (`jobs.selectors.cores_on`)."""
    if "cpu" in accelerator_types:  # the cores are its size on the CPU pool; on accelerators, see cores_on
        if cpus_per_worker is not None and cpus_per_worker < MIN_CPU_WORKER_CORES:
            raise ValidationFailed(
                f"{cpus_per_worker:g} cores per worker: a worker on the CPU pool reserves at least "
                f"{MIN_CPU_WORKER_CORES:g} core (its cores are its size there, counted against quota)",
                field="cpus_per_worker")
        return 1.0 if cpus_per_worker is None else cpus_per_worker
    limits = _worker_cpu_limits(accelerator_types=accelerator_types, devices_per_worker=devices_per_worker)
    if cpus_per_worker is None:
        return min([1.0, *limits.values()])
    for slug, most in sorted(limits.items()):
        if cpus_per_worker > most + 1e-9:
            raise ValidationFailed(
                f"{cpus_per_worker:g} cores per worker: the {slug} nodes have {most / devices_per_worker:g} core(s) "
                f"per device, so a worker of {devices_per_worker} device(s) may reserve at most {most:g} (more could "
                "not be reserved beside the other workers on its node)", field="cpus_per_worker")
    return cpus_per_worker


def worker_shape_check(*, accelerator_types: list[str], devices_per_worker: int, cpus_per_worker: float) -> None:
    """Refuse a worker no node of any accepted type could hold, even empty (9 devices where every H100 node has 8):
    such a job would wait for ever. A type with no known nodes yet may get bigger ones, so it passes."""
    from controlplane.cluster.models import Node

    largest: dict[str, float] = {}
    for slug, devices, cpus in Node.objects.filter(pool__accelerator_type__slug__in=list(accelerator_types)) \
            .values_list("pool__accelerator_type__slug", "capacity_devices", "capacity_cpus"):
        largest[slug] = max(largest.get(slug, 0.0), float(int(cpus)) if slug == "cpu" else devices)
    too_small = []
    for slug in accelerator_types:
        size, unit = (cpus_per_worker, "cores") if slug == "cpu" else (devices_per_worker, "devices")
        if slug not in largest or size <= largest[slug] + 1e-9:
            return
        too_small.append(f"the largest {slug} node has {largest[slug]:g} {unit}, a worker asks for {size:g}")
    if too_small:
        field = "devices_per_worker" if any(slug != "cpu" for slug in accelerator_types) else "cpus_per_worker"
        raise ValidationFailed("no node of an accepted type could hold one worker, even empty "
                               f"({'; '.join(too_small)})", field=field)


def _worker_cpu_limits(*, accelerator_types: list[str], devices_per_worker: int) -> dict[str, float]:
    """{accepted accelerator type: the most cores a worker of `devices_per_worker` devices may reserve there}, for
    the types with known nodes."""
    from controlplane.cluster.selectors import cores_share, cpus_per_device

    return {slug: cores_share(ratio, devices_per_worker) for slug in accelerator_types if slug != "cpu"
            for ratio in [cpus_per_device(accelerator_type=slug)] if ratio is not None}


def env_vars_check(*, field: str, variables: dict) -> None:
    """Names a worker's process can be given (ENV_NAME) mapped to text without NUL, or a 400 naming the variable."""
    for name, value in variables.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise ValidationFailed("environment variables must map names to strings", field=field)
        if not ENV_NAME.fullmatch(name):
            raise ValidationFailed(f"{name!r} is not a valid environment variable name: letters, digits and _, "
                                   "not starting with a digit", field=field)
        if "\x00" in value:
            raise ValidationFailed(f"{name}: the value holds a NUL character", field=field)
        size = len(f"{name}={value}".encode())
        if size > MAX_ENV_ENTRY_BYTES:
            raise ValidationFailed(f"{name}: {name}=<value> is {size:,} bytes; a process is given at most "
                                   f"{MAX_ENV_ENTRY_BYTES:,} bytes per variable (the OS's limit)", field=field)


def _nul_path(value, path: str = "") -> str | None:
    """Where a NUL character sits in a JSON value (a key or a string, at any depth), e.g. `a.b[2]`; None if nowhere."""
    if isinstance(value, str):
        return path if "\x00" in value else None
    if isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            if "\x00" in str(key):
                return where
            found = _nul_path(item, where)
            if found is not None:
                return found
    if isinstance(value, list):
        for index, item in enumerate(value):
            found = _nul_path(item, f"{path}[{index}]")
            if found is not None:
                return found
    return None


def json_text_check(*, field: str, value) -> None:
    """A 400 naming the field when a JSON value holds a NUL character: PostgreSQL's jsonb refuses one
    ("unsupported Unicode escape sequence"), which made an entrypoint job's hyperparameters a 500 (QA)."""
    where = _nul_path(value)
    if where is not None:
        raise ValidationFailed(f"{where!r} holds a NUL character", field=field)


@transaction.atomic
def training_job_create(*, actor, team: Team, name: str, local_queue: LocalQueue,
                        accelerator_types: list[str], workers_min: int = 1, workers_max: int | None = None,
                        devices_per_worker: int = 1, cpus_per_worker: float | None = None,
                        priority_class: PriorityClass | None = None, trainer: str = Trainer.BUILTIN_LM,
                        entrypoint: str = "", working_dir: str = "", hyperparameters: dict | None = None,
                        envs: dict | None = None, dataset_version: DatasetVersion | None = None,
                        checkpoint_interval_steps: int = 100, checkpoint_keep_last: int = 3,
                        max_restarts: int = 3, max_duration_seconds: int | None = None,
                        parallelism: dict | None = None, secret_envs: dict | None = None,
                        submitted_reason: str = "submitted") -> TrainingJob:
    if local_queue.team_id != team.pk:
        raise ValidationFailed(f"queue {local_queue.name} does not belong to team {team.name}",
                               field="local_queue")
    if dataset_version is not None and dataset_version.dataset.team_id != team.pk:
        raise ValidationFailed("dataset not found in this team", field="dataset")
    workers_max = workers_min if workers_max is None else workers_max
    if workers_min < 1:
        raise ValidationFailed("must be at least 1", field="workers_min")
    if workers_max < workers_min:
        raise ValidationFailed(f"must be at least workers_min ({workers_min})", field="workers_max")
    job_size_check(workers_min=workers_min, workers_max=workers_max, devices_per_worker=devices_per_worker)
    if trainer == Trainer.ENTRYPOINT and not entrypoint.strip():
        raise ValidationFailed("an entrypoint trainer needs a command to run", field="entrypoint")
    if trainer not in Trainer.values:
        raise ValidationFailed(f"{trainer!r} is not a trainer (choose {', '.join(Trainer.values)})",
                               field="trainer")
    for field, value in (("hyperparameters", hyperparameters), ("parallelism", parallelism)):
        json_text_check(field=field, value=value or {})
    if trainer == Trainer.ENTRYPOINT and hyperparameters:
        # Nothing passes them to a command (they were stored and ignored; the spec already refused them; QA).
        raise ValidationFailed("hyperparameters are for the built-in trainer; a command reads its own settings "
                               "(give them as envs or in its arguments)", field="hyperparameters")
    if trainer == Trainer.BUILTIN_LM:
        try:
            TrainHyperparameters.from_dict(hyperparameters or {})
        except ValueError as exc:  # the message starts with the hyperparameter's name
            raise ValidationFailed(str(exc), field="hyperparameters") from None
    check_workload_request(local_queue=local_queue, accelerator_types=accelerator_types)
    if any(slug != "cpu" for slug in accelerator_types) and devices_per_worker < 1:
        raise ValidationFailed("accelerator workers need at least 1 device each", field="devices_per_worker")
    cpus_per_worker = worker_cpus(accelerator_types=accelerator_types, devices_per_worker=devices_per_worker,
                                  cpus_per_worker=cpus_per_worker)
    worker_shape_check(accelerator_types=accelerator_types, devices_per_worker=devices_per_worker,
                       cpus_per_worker=cpus_per_worker)
    parallel_plan: dict = {}
    if parallelism:
        from jobs.planning import plan_job_gang

        # Only the types that can run the model stay accepted; a model-parallel layout needs all its
        # devices, so the gang is not elastic.
        parallel_plan, accelerator_types, workers_min, workers_max = plan_job_gang(
            parallelism=parallelism, accelerator_types=list(accelerator_types), workers_min=workers_min,
            workers_max=workers_max, devices_per_worker=devices_per_worker)
    if trainer == Trainer.BUILTIN_LM:
        builtin_layout_check(hyperparameters=hyperparameters or {}, workers_min=workers_min, workers_max=workers_max)
    for field, variables in (("envs", envs), ("secrets", secret_envs)):
        env_vars_check(field=field, variables=variables or {})
    if len(envs or {}) + len(secret_envs or {}) > MAX_ENV_VARIABLES:
        raise ValidationFailed(f"{len(envs or {}) + len(secret_envs or {}):,} environment variables (envs and secrets "
                               f"together); a job takes at most {MAX_ENV_VARIABLES:,}", field="envs")
    clash = sorted(set(envs or {}) & set(secret_envs or {}))
    if clash:
        raise ValidationFailed(f"{', '.join(clash)} set both as an env and as a secret", field="secrets")
    job = TrainingJob(
        team=team, name=name, local_queue=local_queue, priority_class=priority_class,
        accelerator_types=list(accelerator_types), workers_min=workers_min, workers_max=workers_max,
        devices_per_worker=devices_per_worker, cpus_per_worker=cpus_per_worker, trainer=trainer,
        entrypoint=entrypoint, working_dir=working_dir, hyperparameters=hyperparameters or {},
        envs=envs or {}, secret_envs=dict(secret_envs or {}), dataset_version=dataset_version,
        checkpoint_interval_steps=checkpoint_interval_steps, checkpoint_keep_last=checkpoint_keep_last,
        max_restarts=max_restarts, max_duration_seconds=max_duration_seconds, created_by=actor,
        parallelism=dict(parallelism or {}), parallel_plan=parallel_plan,
        state=JobState.PENDING, state_reason="submitted",
    )
    job.full_clean()  # the model's own rules (a name of lowercase letters, digits and dashes), before the rate check
    # last: a request refused for its content takes no slot, and is told what is wrong with it, not to come back later
    # (a name the model refuses, "Bad_Name", was a 429 "retry in 60 s" at the limit, then a 400; QA)
    submission_rate_check(team=team)
    job.save()
    record_event(obj=job, event_model=TrainingJobEvent, from_state="", to_state=JobState.PENDING,
                 reason=submitted_reason, actor=actor)
    audit_record(actor=actor, team=team, action="training_job.create", target=job,
                 data={"name": name, "queue": local_queue.name, "accelerator_types": accelerator_types,
                       "workers": [workers_min, workers_max], "devices_per_worker": devices_per_worker})
    from jobs.tasks import enqueue_training_job

    dispatch_on_commit(enqueue_training_job, job.pk)
    return job


RETRY_SUFFIX = "-retry-"


def _retry_name(*, job: TrainingJob) -> str:
    """`<name>-retry-<n>` with the first n not yet used in the team; a retry of a retry counts on from the
    original name (`lm-retry-1` -> `lm-retry-2`). Trimmed to the 63 characters a name may have."""
    base = job.name
    head, sep, tail = base.rpartition(RETRY_SUFFIX)
    if sep and head and tail.isdigit():
        base = head
    # Every candidate starts with base[:40] less its trailing dashes: a name is trimmed to at least 40 characters before
    # its dashes are stripped (before, `name__startswith=base[:40]` missed the retries of a name whose 40th character
    # was a dash, and a second retry took the first one's name; QA).
    taken = set(TrainingJob.objects.filter(team_id=job.team_id, name__startswith=base[:40].rstrip("-"))
                .values_list("name", flat=True))
    n = 1
    while True:
        suffix = f"{RETRY_SUFFIX}{n}"
        name = f"{base[:63 - len(suffix)].rstrip('-')}{suffix}"
        if name not in taken:
            return name
        n += 1


@transaction.atomic
def training_job_retry(*, actor, job: TrainingJob) -> TrainingJob:
    """A new job with the ended job's spec (queue, priority, accepted types, sizes, dataset version,
    hyperparameters, checkpointing, envs and secret values, copied here so they never travel through the
    client), named `<name>-retry-<n>`. Only an ended job (SUCCEEDED, FAILED, CANCELLED) is retried: a live
    one is still running or waiting, and a preempted one is requeued by itself."""
    # Lock only the job's row: PostgreSQL cannot lock the nullable side of the outer joins (priority, dataset).
    job = TrainingJob.objects.select_for_update(of=("self",)).select_related(
        "team", "local_queue", "priority_class", "dataset_version").get(pk=job.pk)
    if not job.is_terminal:
        raise ConflictError(f"job {job.pk} is {job.state}; only a job that ended (SUCCEEDED, FAILED or "
                            f"CANCELLED) can be retried (cancel it first)", field="state")
    # Retries of one family (`lm`, `lm-retry-1`) lock different job rows: the team's submission lock makes them pick
    # their names one after the other (before, two at once could both take `lm-retry-2`).
    lock_team_submissions(team=job.team)
    cpus, note = job.cpus_per_worker, ""
    most = min(_worker_cpu_limits(accelerator_types=list(job.accelerator_types),
                                  devices_per_worker=job.devices_per_worker).values(), default=None)
    # a job from before the rule (or nodes that changed since); one that also accepts the CPU pool keeps its size
    # there (cores_on caps what it reserves on an accelerator)
    if most is not None and cpus > most + 1e-9 and "cpu" not in job.accelerator_types:
        cpus, note = most, f"; {job.cpus_per_worker:g} cores per worker lowered to {most:g}, what its devices come with"
    retry = training_job_create(
        actor=actor, team=job.team, name=_retry_name(job=job), local_queue=job.local_queue,
        accelerator_types=list(job.accelerator_types), workers_min=job.workers_min, workers_max=job.workers_max,
        devices_per_worker=job.devices_per_worker, cpus_per_worker=cpus,
        priority_class=job.priority_class, trainer=job.trainer, entrypoint=job.entrypoint,
        working_dir=job.working_dir, envs=dict(job.envs or {}),
        # (a command's job stored before they were refused: they never reached it)
        hyperparameters={} if job.trainer == Trainer.ENTRYPOINT else dict(job.hyperparameters or {}),
        dataset_version=job.dataset_version, checkpoint_interval_steps=job.checkpoint_interval_steps,
        checkpoint_keep_last=job.checkpoint_keep_last, max_restarts=job.max_restarts,
        max_duration_seconds=job.max_duration_seconds, parallelism=dict(job.parallelism or {}),
        secret_envs=dict(job.secret_envs or {}),
        submitted_reason=f"submitted as a retry of job {job.pk} ({job.name}, {job.state}){note}",
    )
    audit_record(actor=actor, team=job.team, action="training_job.retry", target=retry,
                 data={"retry_of": job.pk, "name": retry.name, "original_state": job.state})
    return retry


@transaction.atomic
def training_job_enqueue(*, job_id: int) -> TrainingJob | None:
    """PENDING -> QUEUED: the job now waits in its LocalQueue. Idempotent: other states are left alone."""
    job = TrainingJob.objects.select_for_update().select_related("local_queue").filter(pk=job_id).first()
    if job is None or job.state != JobState.PENDING:
        return job
    return transition(obj=job, machine=TrainingJob.machine, event_model=TrainingJobEvent, to=JobState.QUEUED,
                      reason=f"waiting in queue {job.local_queue.name} for admission", system="queue")


@transaction.atomic
def training_job_cancel(*, actor, job: TrainingJob, reason: str = "") -> TrainingJob:
    job = TrainingJob.objects.select_for_update().get(pk=job.pk)
    if job.is_terminal:
        raise ConflictError(f"job {job.pk} already ended ({job.state}); nothing to cancel", field="state")
    job = transition(obj=job, machine=TrainingJob.machine, event_model=TrainingJobEvent,
                     to=JobState.CANCELLED, reason=reason or f"cancelled by {actor.get_username()}",
                     actor=actor)
    TrainingJob.objects.filter(pk=job.pk).update(queue_position=None)
    from jobs.tasks import run_scheduling_cycle, stop_training_run

    if job.compute_handle:
        dispatch_on_commit(stop_training_run, job.pk, checkpoint=False, reason="cancelled")
    dispatch_on_commit(run_scheduling_cycle)  # its quota and devices are free for others
    return job


@transaction.atomic
def training_job_delete(*, actor, job: TrainingJob) -> None:
    job = TrainingJob.objects.select_for_update().get(pk=job.pk)
    if not job.is_terminal:
        raise ConflictError(f"job {job.pk} is {job.state}; cancel it before deleting it", field="state")
    # A deployment keeps serving the checkpoint it loaded, but without its job it could no longer be scaled or updated
    # ("give a model_uri or a source_job"; found by QA): it goes first.
    serving = sorted(job.deployments.exclude(state="DELETED").values_list("name", flat=True))
    if serving:
        raise ConflictError(f"deployment{'s' if len(serving) > 1 else ''} {', '.join(serving)} of job {job.pk}'s "
                            f"checkpoint {'are' if len(serving) > 1 else 'is'} not deleted; delete "
                            f"{'them' if len(serving) > 1 else 'it'} before the job", field="deployments")
    audit_record(actor=actor, team=job.team_id, action="training_job.delete", target=job,
                 data={"name": job.name, "state": job.state})
    job.delete()
