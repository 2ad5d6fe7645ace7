"""Reads about training jobs."""

from __future__ import annotations

import re
from datetime import UTC, datetime

from django.db.models import Count, Q, QuerySet
from django.utils import timezone

from jobs.models import TrainingFault, TrainingJob, TrainingJobEvent, TrainingLogLine, TrainingMetric
from jobs.runtime.goodput import GoodputLedger, GoodputSummary, cluster_ettr
from jobs.states import HOLDING_STATES, PREEMPTIBLE_STATES


def training_job_list(*, team_ids: list[int]) -> QuerySet[TrainingJob]:
    return TrainingJob.objects.filter(team_id__in=team_ids).select_related(
        "team", "local_queue", "priority_class", "dataset_version__dataset"
    )


def training_job_events(*, job: TrainingJob) -> QuerySet[TrainingJobEvent]:
    return job.events.all()


def quota_usage(*, preemptible_only: bool = False, non_preemptible_only: bool = False
                ) -> dict[tuple[str, str], float]:
    """Devices (CPU cores for `cpu`) held by admitted jobs, per (cluster queue, accelerator type). With
    `preemptible_only`, only jobs the scheduler may preempt now (a preemptible priority class, ADMITTED or RUNNING);
    with `non_preemptible_only`, only jobs of a non-preemptible priority class, in any holding state (the queue's
    non-preemptible usage, as the scheduling core counts it for its rule that such usage stays within nominal)."""
    usage: dict[tuple[str, str], float] = {}
    jobs = TrainingJob.objects.filter(state__in=HOLDING_STATES).exclude(admitted_accelerator_type="")
    if preemptible_only:
        jobs = jobs.filter(state__in=list(PREEMPTIBLE_STATES)).filter(
            Q(priority_class__isnull=True) | Q(priority_class__preemptible=True))
    if non_preemptible_only:
        jobs = jobs.filter(priority_class__preemptible=False)
    jobs = jobs.only("local_queue__cluster_queue__name", "admitted_accelerator_type", "placement",
                     "devices_per_worker", "cpus_per_worker").select_related("local_queue__cluster_queue")
    for job in jobs:
        key = (job.local_queue.cluster_queue.name, job.admitted_accelerator_type)
        units = job.placed_units_per_worker(job.admitted_accelerator_type)  # as the scheduling cycle counts it
        usage[key] = usage.get(key, 0.0) + len(job.placement) * units
    return usage


def training_job_trainer_layout(*, job: TrainingJob) -> dict | None:
    """How the built-in trainer splits this job's gang (tensor x pipeline x data parallel, micro-batches, and where
    the degrees come from), as its workers will compute it; None for a user entrypoint."""
    from jobs.models import Trainer
    from jobs.runtime.lm_config import TrainHyperparameters, trainer_layout

    if job.trainer != Trainer.BUILTIN_LM:
        return None
    try:
        hp = TrainHyperparameters.from_dict(job.hyperparameters or {})
        accelerator_type = job.admitted_accelerator_type or (job.accelerator_types or [""])[0]
        plan = (job.parallel_plan or {}).get("by_type", {}).get(accelerator_type)
        layout = trainer_layout(hp, world_size=len(job.placement or []) or job.workers_max, plan=plan,
                                devices_per_worker=job.devices_per_worker)
    except ValueError:
        return None
    return {"tp": layout.tp, "pp": layout.pp, "dp": layout.dp, "micro_batches": layout.micro_batches,
            "source": layout.source}


def waiting_jobs(*, team_ids: list[int]) -> QuerySet[TrainingJob]:
    return training_job_list(team_ids=team_ids).filter(state="QUEUED").order_by(
        "local_queue__cluster_queue__name", "queue_position", "created_at")


def quota_usage_by_local_queue(*, team_ids: list[int]) -> dict[tuple[int, str], float]:
    """What quota_usage counts, split per local queue (team): {(local queue id, type): units}, for the
    local queues of `team_ids` only."""
    usage: dict[tuple[int, str], float] = {}
    jobs = TrainingJob.objects.filter(team_id__in=team_ids, state__in=HOLDING_STATES).exclude(
        admitted_accelerator_type="").only("local_queue_id", "admitted_accelerator_type", "placement",
                                           "devices_per_worker", "cpus_per_worker")
    for job in jobs:
        key = (job.local_queue_id, job.admitted_accelerator_type)
        units = job.placed_units_per_worker(job.admitted_accelerator_type)  # as the scheduling cycle counts it
        usage[key] = usage.get(key, 0.0) + len(job.placement) * units
    return usage


def held_units_by_node() -> dict[str, float]:
    """Units (devices; CPU cores on `cpu`) that admitted training gangs hold on each node, all teams
    together, from the scheduler's placements: {node name: units}."""
    return training_held_by_node()[0]


def training_held_by_node() -> tuple[dict[str, float], dict[str, float]]:
    """What admitted training gangs hold on each node, from the scheduler's placements, in one query:
    ({node: units (devices; CPU cores on `cpu`)}, {node: CPU cores their workers reserve on accelerator nodes,
    with their devices, when their run starts}; on the CPU pool the cores are the units)."""
    from controlplane.cluster.selectors import capped_cores, cpus_per_device

    units: dict[str, float] = {}
    cpus: dict[str, float] = {}
    ratios: dict[str, float | None] = {}
    for placement, slug, cpus_per_worker, devices_per_worker in TrainingJob.objects.filter(
            state__in=HOLDING_STATES).exclude(admitted_accelerator_type="").values_list(
            "placement", "admitted_accelerator_type", "cpus_per_worker", "devices_per_worker"):
        if slug != "cpu":  # what its workers reserve there (cores_on, with the ratio looked up once per type)
            if slug not in ratios:
                ratios[slug] = cpus_per_device(accelerator_type=slug)
            cpus_per_worker = capped_cores(cpus_per_worker, ratios[slug], devices_per_worker)
        for worker in placement or []:
            node = worker["node"]
            units[node] = units.get(node, 0.0) + sum(float(share) for _, share in worker["taken"])
            if slug != "cpu":
                cpus[node] = cpus.get(node, 0.0) + float(cpus_per_worker)
    return units, cpus


def cores_on(*, accelerator_type: str, devices_per_worker: int, cpus_per_worker: float) -> float:
    """The cores a worker reserves on `accelerator_type`: its cores, but on an accelerator at most the cores its
    devices come with (a job that also accepts the CPU pool keeps its size there; jobs.services.worker_cpus refuses
    more for the others at submit)."""
    from controlplane.cluster.selectors import capped_cores, cpus_per_device

    if accelerator_type == "cpu":
        return cpus_per_worker
    return capped_cores(cpus_per_worker, cpus_per_device(accelerator_type=accelerator_type), devices_per_worker)


def queue_depth() -> dict[str, int]:
    """Training jobs waiting for admission per cluster queue name, all teams together (a count only)."""
    rows = (TrainingJob.objects.filter(state="QUEUED").order_by()
            .values_list("local_queue__cluster_queue__name").annotate(n=Count("id")))
    return dict(rows)


def job_counts_by_local_queue(*, team_ids: list[int]) -> dict[int, dict[str, int]]:
    """{local queue id: {"waiting": n, "holding": n}} for the local queues of `team_ids`."""
    counts: dict[int, dict[str, int]] = {}
    rows = (TrainingJob.objects.filter(team_id__in=team_ids, state__in=["QUEUED", *HOLDING_STATES]).order_by()
            .values_list("local_queue_id", "state").annotate(n=Count("id")))
    for queue_id, state, n in rows:
        entry = counts.setdefault(queue_id, {"waiting": 0, "holding": 0})
        entry["waiting" if state == "QUEUED" else "holding"] += n
    return counts


# ------------------------------------------------------------------------------ runs: metrics, logs, ETTR

def training_job_metrics(*, job: TrainingJob, since_step: int | None = None, worker: int | None = None,
                         after_id: int | None = None) -> QuerySet[TrainingMetric]:
    rows = job.metrics.all()
    if since_step is not None:
        rows = rows.filter(step__gte=since_step)
    if worker is not None:
        rows = rows.filter(worker=worker)
    if after_id is not None:
        rows = rows.filter(id__gt=after_id)
    return rows.order_by("id")


def training_job_logs(*, job: TrainingJob, after_id: int | None = None,
                      worker: int | None = None) -> QuerySet[TrainingLogLine]:
    rows = job.log_lines.all()
    if after_id is not None:
        rows = rows.filter(id__gt=after_id)
    if worker is not None:
        rows = rows.filter(worker=worker)
    return rows.order_by("id")


def training_job_faults(*, job: TrainingJob) -> QuerySet[TrainingFault]:
    return job.faults.all().order_by("id")


def training_job_checkpoints(*, job: TrainingJob) -> list[dict]:
    """The job's complete checkpoints, read from where they live (a partial one is never listed)."""
    from jobs.runtime.checkpoints import list_checkpoints
    from jobs.workflows import checkpoint_dir

    return [{"step": info.step, "name": info.name, "size_bytes": info.size_bytes,
             "created_at": datetime.fromtimestamp(info.created_at, tz=UTC), "files": sorted(info.files),
             "metadata": info.metadata}
            for info in list_checkpoints(checkpoint_dir(job))]


# Kept in `TrainingJob.goodput` beside the ledger: the start and kind of a pause still open (preempted).
PAUSE_KEYS = ("paused_since", "pause_kind")
# Kept there too: a recovery still open (a fault, or a re-placement: resize or move), {"kind", "occurred_at",
# "detected_at"} and, once the run reported running again but not yet its first new step, "until". The run's
# "recovery" event replaces it with the exact interval (jobs/workflows.py).
RECOVERY_KEY = "recovering"
OPEN_KEYS = (*PAUSE_KEYS, RECOVERY_KEY)


def goodput_ledger(*, job: TrainingJob) -> GoodputLedger | None:
    """The job's effective-training-time ledger as stored (an open pause or recovery is not in it yet); an empty
    one from its first start when nothing was recorded; None before the first start."""
    data = {k: v for k, v in (job.goodput or {}).items() if k not in OPEN_KEYS}
    if data:
        return GoodputLedger.from_dict(data)
    return GoodputLedger(first_started_at=job.started_at.timestamp()) if job.started_at else None


def record_open_recovery(ledger: GoodputLedger, recovering: dict, end: float) -> None:
    """Put an open recovery into the ledger as an interruption that lasted until `end` (or its "until")."""
    first = ledger.first_started_at
    occurred = max(min(recovering["occurred_at"], recovering["detected_at"]), first)
    detected = max(recovering["detected_at"], occurred)
    resumed = max(min(end, recovering.get("until", end)), detected)
    ledger.record_interruption(kind=recovering.get("kind") or "restart", occurred_at=occurred, detected_at=detected,
                               resumed_at=resumed)


def training_job_goodput(*, job: TrainingJob) -> GoodputSummary | None:
    """Effective training time since the first start (to now, or to the end for a finished job). A pause or a
    recovery still open counts until then: a job cancelled while queued after a preemption, or while waiting for
    nodes, lost that time (before, it counted as productive once the job ended)."""
    if job.started_at is None:
        return None
    ledger = goodput_ledger(job=job)
    end = (job.finished_at or timezone.now()).timestamp()
    goodput = job.goodput or {}
    paused_since = goodput.get("paused_since")
    if paused_since:
        ledger.record_pause(kind=goodput.get("pause_kind", "preempted"),
                            start=max(paused_since, ledger.first_started_at), end=max(end, paused_since))
    if goodput.get(RECOVERY_KEY):
        record_open_recovery(ledger, goodput[RECOVERY_KEY], end)
    return ledger.summary(max(end, ledger.first_started_at))


def goodput_overview(*, team_ids: list[int]) -> dict:
    """ETTR per job and for all of them together (sum of productive time / sum of wall time)."""
    jobs = training_job_list(team_ids=team_ids).exclude(started_at=None)
    per_job = []
    summaries = []
    for job in jobs:
        summary = training_job_goodput(job=job)
        if summary is None:
            continue
        summaries.append(summary)
        per_job.append({"id": job.pk, "name": job.name, "team": job.team.name, "state": job.state,
                        **summary.to_dict()})
    totals = {key: sum(getattr(s, key) for s in summaries)
              for key in ("wall_s", "productive_s", "detection_s", "restart_s", "recompute_s", "paused_s")}
    return {"jobs": len(summaries), "ettr": cluster_ettr(summaries) if summaries else None, **totals,
            "per_job": per_job}


def training_job_run_view(*, job: TrainingJob, log_lines: int = 40) -> dict:
    """What the console's job page shows about a run: ETTR, the latest metric (worker 0), faults, checkpoints,
    the last log lines (the page's charts and log follow read the API's metrics and logs themselves)."""
    goodput = training_job_goodput(job=job)
    recent = (job.metrics.filter(worker=0, loss__isnull=False).order_by("-id")
              .values_list("step", "loss", "tokens_per_s").first())
    logs = list(job.log_lines.order_by("-id")[:log_lines])[::-1]
    return {"goodput": goodput.to_dict() if goodput else None,
            "latest_metric": {"step": recent[0], "loss": recent[1], "tokens_per_s": recent[2]} if recent else None,
            "faults": list(training_job_faults(job=job)), "checkpoints": training_job_checkpoints(job=job),
            "log_lines": logs}


# Workload ids in the scheduler's reasons (README, Scheduling): "job 12", "jobs 12, 14", "deployment 3", the core's
# "serving:3", and the core's bare id lists ("waiting for 12, 14 (shrunk) to checkpoint", "admitted onto the devices
# of 12, preempted ...", "; 12 preempted or shrunk for it", "set aside for 12, which waits ahead of it", "preempted
# for 12 (").
_IDS = r"\d+(?: \(shrunk\))?(?:, \d+(?: \(shrunk\))?)*"
_NAMED_JOBS = re.compile(r"\b(?P<noun>jobs?) (?P<ids>\d+(?:, \d+)*)\b")
_NAMED_DEPLOYMENTS = re.compile(r"\b(?:deployment |serving:)(?P<id>\d+)\b")
_BARE_JOBS = [re.compile(rf"(?P<before>{before})(?P<ids>{_IDS})(?P<after>{after})") for before, after in (
    (r"waiting for ", r" to checkpoint"), (r"devices of ", r", preempted"), (r"; ", r" preempted or shrunk for it"),
    (r"set aside for ", r", which waits ahead"), (r"\bpreempted for ", r" \("), (r" workers for ", r" \("),
    (r"\blower-priority ", r" (?:and \d+ more )?\("))]


def _others(count: int, noun: str) -> str:
    return f"another team's {noun}" if count == 1 else f"{count} {noun}s of other teams"


def reason_shown_for_team(*, text: str, team_id: int | None) -> str:
    """A reason of a workload of team `team_id` as its team's members read it (API and console): the ids of other
    teams' jobs and deployments are replaced by "another team's job" ("2 jobs of other teams", "another team's
    deployment"), so that a member learns no id of another team's workload ("launches once another team's job
    checkpoints and stops", "preempted for another team's job (...)"). Ids of the team's own workloads stay. The
    stored reason is unchanged (operators read it in the Django admin). Before 2026-12 the reasons named them."""
    if not text or not any(ch.isdigit() for ch in text):
        return text
    job_ids = {int(n) for m in _NAMED_JOBS.finditer(text) for n in re.findall(r"\d+", m["ids"])}
    job_ids |= {int(n) for pattern in _BARE_JOBS for m in pattern.finditer(text) for n in re.findall(r"\d+", m["ids"])}
    deployment_ids = {int(m["id"]) for m in _NAMED_DEPLOYMENTS.finditer(text)}
    if not job_ids and not deployment_ids:
        return text
    from inference.models import Deployment

    own_jobs = {str(pk) for pk in TrainingJob.objects.filter(pk__in=job_ids, team_id=team_id)
                .values_list("pk", flat=True)} if job_ids else set()
    own_deployments = {str(pk) for pk in Deployment.objects.filter(pk__in=deployment_ids, team_id=team_id)
                       .values_list("pk", flat=True)} if deployment_ids else set()

    def named_jobs(match) -> str:
        ids = match["ids"].split(", ")
        mine = [i for i in ids if i in own_jobs]
        if len(mine) == len(ids):
            return match[0]
        others = _others(len(ids) - len(mine), "job")
        if not mine:
            return others
        return f"{'job' if len(mine) == 1 else 'jobs'} {', '.join(mine)} and {others}"

    def bare_jobs(match) -> str:
        items = match["ids"].split(", ")
        mine = [i for i in items if i.split(" ")[0] in own_jobs]
        if len(mine) == len(items):
            return match[0]
        return f"{match['before']}{', '.join([*mine, _others(len(items) - len(mine), 'job')])}{match['after']}"

    def named_deployment(match) -> str:
        return match[0] if match["id"] in own_deployments else _others(1, "deployment")

    text = _NAMED_JOBS.sub(named_jobs, text)
    for pattern in _BARE_JOBS:
        text = pattern.sub(bare_jobs, text)
    return _NAMED_DEPLOYMENTS.sub(named_deployment, text)


def event_data_shown_for_team(*, data: dict, team_id: int | None) -> dict:
    """A job event's data as its team reads it: the scheduler's `for` (the preemptor) and `waits_for` (the victims) are
    null where they name another team's workload (see reason_shown_for_team)."""
    if not data or ("for" not in data and "waits_for" not in data):
        return data
    from inference.models import Deployment

    data = dict(data)
    preemptor = str(data.get("for") or "")
    served = preemptor.removeprefix("serving:")
    if preemptor.isdigit():
        own = TrainingJob.objects.filter(pk=int(preemptor), team_id=team_id).exists()
    elif preemptor.startswith("serving:"):
        own = served.isdigit() and Deployment.objects.filter(pk=int(served), team_id=team_id).exists()
    else:
        own = True
    if not own:
        data["for"] = None
    if isinstance(data.get("waits_for"), list) and data["waits_for"]:
        ids = [int(i) for i in data["waits_for"] if str(i).isdigit()]
        own = set(TrainingJob.objects.filter(pk__in=ids, team_id=team_id).values_list("pk", flat=True))
        data["waits_for"] = [i if str(i).isdigit() and int(i) in own else None for i in data["waits_for"]]
    return data
