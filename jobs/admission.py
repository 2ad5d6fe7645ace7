"""The scheduling cycle for training jobs: load a snapshot, ask the core, apply its decisions.

Entry points: the Celery task `jobs.run_scheduling_cycle` (beat, and after every submit, cancel and
finish). One cycle is one transaction that first locks every ClusterQueue row (in id order), so two
cycles never decide on the same state; quota usage is derived from the admitted jobs themselves,
so it changes in the same transaction as the state change that causes it.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import replace

from django.db import transaction
from django.db.models import OuterRef, Q, Subquery
from django.utils import timezone

from controlplane.cluster.models import AcceleratorType, Node, NodeHealth
from controlplane.common.bulk import write_fields
from controlplane.common.lifecycle import record_event, record_events_many, transition_many
from controlplane.common.tasks import dispatch_many_on_commit
from controlplane.quotas.models import ClusterQueue
from controlplane.quotas.services import lock_cluster_queues
from controlplane.scheduling.efficiency import (
    EfficiencyMatrix,
    chip_facts_from_accelerator_facts,
    rank_accelerator_types,
)
from controlplane.scheduling.mixed_load import (
    SERVING_PREFIX,
    ServingDemand,
    gives_back_quota,
    hold_in_place,
    loans,
    non_preemptible_caps,
    plan_mixed_load,
    replicas_fit,
    taken_by_others,
    training_usage_after,
)
from controlplane.scheduling.model import (
    ClusterQueueSpec,
    CycleResult,
    NodeSpec,
    Quota,
    Running,
    Shrink,
    Snapshot,
    Workload,
)
from controlplane.scheduling.placement import WorkerPlacement, without_workers
from controlplane.scheduling.scheduler import place_additional_workers, schedule
from jobs.efficiency import job_workload_class
from jobs.models import TrainingJob, TrainingJobEvent
from jobs.states import HOLDING_STATES, PREEMPTIBLE_STATES, JobState

log = logging.getLogger(__name__)


def _workload(job: TrainingJob, accelerator_type: str | None = None) -> Workload:
    types = tuple(job.accelerator_types)
    preemptible = job.priority_class.preemptible if job.priority_class else True
    size = _units(job, accelerator_type or types[0])
    # A pending job that accepts the CPU pool and an accelerator is cores on the one, devices on the other (before,
    # its first type's size was used on every type: 4 cores became 4 H100s).
    sizes = () if accelerator_type else tuple(
        (slug, units) for slug, units in ((slug, _units(job, slug)) for slug in types) if units != size)
    return Workload(
        id=str(job.pk), cluster_queue=job.local_queue.cluster_queue.name, accepted_types=types,
        devices_per_worker=size, sizes=sizes, workers_min=job.workers_min,
        workers_max=job.workers_max, priority=job.priority_class.value if job.priority_class else 0,
        arrival=job.created_at.timestamp(), workload_class=job_workload_class(job),
        # Of its priority class: a job STARTING or RECOVERING cannot be preempted now (its Running is `settled`), yet
        # it is no non-preemptible workload (whose usage must stay within nominal quota): counted as one, it held a
        # non-preemptible job back for quota it did not use.
        preemptible=preemptible,
    )


def _units(job: TrainingJob, accelerator_type: str) -> float:
    return job.placed_units_per_worker(accelerator_type)


def _placement_to_json(workers) -> list[dict]:
    return [{"node": w.node, "taken": [[index, share] for index, share in w.taken]} for w in workers]


def _placement_from_json(data) -> tuple[WorkerPlacement, ...]:
    return tuple(WorkerPlacement(item["node"], tuple((int(i), float(s)) for i, s in item["taken"])) for item in data)


def cluster_queue_specs() -> list[ClusterQueueSpec]:
    """Every ClusterQueue with its quotas, cohort and preemption policies, as the scheduling core reads them."""
    queues = []
    for queue in ClusterQueue.objects.prefetch_related("quotas__accelerator_type").order_by("name"):
        quotas = {q.accelerator_type.slug: Quota(q.nominal_quota, q.borrowing_limit, q.lending_limit)
                  for q in queue.quotas.all()}
        queues.append(ClusterQueueSpec(queue.name, quotas, queue.cohort or None,
                                       preemption_within_queue=queue.preemption_within_queue,
                                       reclaim_within_cohort=queue.reclaim_within_cohort))
    return queues


# JSON fields of a job the cycle never reads (loaded on access, one query each): decoding them for every waiting job
# was a fifth of loading the snapshot (8,000 jobs, 11 JSON fields each).
CYCLE_UNUSED_FIELDS = ("envs", "secret_envs", "parallelism", "parallel_plan", "recovery_exclude", "observed_nodes",
                       "goodput")


def load_snapshot() -> tuple[Snapshot, dict[str, TrainingJob]]:
    """The scheduler's view of the database (call inside the cycle's transaction)."""
    nodes = node_specs()
    queues = cluster_queue_specs()
    # The jobs are locked too (in id order; only their own rows: PostgreSQL cannot lock the nullable side of
    # an outer join). Without this a job cancelled, launched or finished while the cycle computed was acted on
    # from a stale state and the whole cycle failed (found by the quota soak, tests/reliability).
    jobs = {str(job.pk): job for job in TrainingJob.objects.select_related(
        "local_queue__cluster_queue", "priority_class").filter(state__in=[JobState.QUEUED, *HOLDING_STATES])
        .defer(*CYCLE_UNUSED_FIELDS).select_for_update(of=("self",)).order_by("id")}
    now = timezone.now()
    running = tuple(
        Running(_workload(job, job.admitted_accelerator_type), job.admitted_accelerator_type,
                _placement_from_json(job.placement), work_since_checkpoint_s=work_since_checkpoint_s(job, now),
                settled=job.state not in PREEMPTIBLE_STATES)  # STARTING or RECOVERING: left alone until it settles
        for job in jobs.values() if job.state in HOLDING_STATES and job.admitted_accelerator_type
    )
    pending = tuple(_workload(job) for job in jobs.values() if job.state == JobState.QUEUED)
    matrix = efficiency_matrix()
    preference = {
        workload.id: tuple(choice.accelerator_type for choice in rank_accelerator_types(
            workload_class=workload.workload_class, accepted=workload.accepted_types, matrix=matrix))
        for workload in pending
    }
    return Snapshot(tuple(nodes), tuple(queues), running, pending, preference), jobs


def work_since_checkpoint_s(job: TrainingJob, now) -> float:
    """What preempting the job now would throw away, in seconds: the steps since its last checkpoint times its
    average time per step since it first started (restarts included, so an estimate; no extra query). A job that
    has not trained yet loses nothing."""
    if job.started_at is None or job.current_step < 0:
        return 0.0
    steps_done = job.current_step + 1
    per_step = max(0.0, (now - job.started_at).total_seconds()) / steps_done
    return round(max(0, job.current_step - job.last_checkpoint_step) * per_step, 1)


def efficiency_matrix() -> EfficiencyMatrix:
    """The matrix the scheduling cycle ranks accepted types with: chip facts and prices from the database, refined
    by the throughputs jobs measured on real (not simulated) nodes (jobs/efficiency.py)."""
    from jobs.efficiency import cached_measured_throughputs

    matrix = EfficiencyMatrix(chips=chip_facts_from_accelerator_facts(_facts()))
    for observation in cached_measured_throughputs():
        matrix.observe(observation.workload_class, observation.accelerator_type, observation.units_per_second)
    return matrix


def type_preference(*, workload_class: str, accepted: list[str]) -> list:
    """The accepted types in the order the scheduling cycle tries them (cheapest per unit of work first),
    each with its reason (controlplane.scheduling.efficiency.TypeChoice)."""
    return rank_accelerator_types(workload_class=workload_class, accepted=accepted, matrix=efficiency_matrix())


def _facts() -> list[dict]:
    return [{"slug": a.slug, "bf16_dense_tflops": a.bf16_dense_tflops, "memory_gb": a.memory_gb,
             "price_per_hour_usd": float(a.price_per_hour_usd) if a.price_per_hour_usd is not None else None}
            for a in AcceleratorType.objects.all()]


def node_specs() -> list[NodeSpec]:
    """Every node as the scheduling core sees it: its devices, or its cores on the CPU pool; schedulable when healthy
    and not cordoned."""
    nodes = []
    # (plain values, not model instances: 12,500 nodes took 0.57 s as instances, 0.03 s as values)
    rows = Node.objects.order_by("name").values_list("name", "pool__name", "pool__accelerator_type__slug",
                                                     "capacity_cpus", "capacity_devices", "leaf_group", "health",
                                                     "cordoned")
    for name, pool, slug, cpus, devices, leaf_group, health, cordoned in rows:
        capacity = cpus if slug == "cpu" else devices
        nodes.append(NodeSpec(name=name, pool=pool, accelerator_type=slug, leaf_group=leaf_group or pool,
                              devices=int(capacity), schedulable=health == NodeHealth.HEALTHY and not cordoned))
    return nodes


def non_preemptible_caps_now() -> dict[str, float]:
    """Per type deployments reserve, the devices (cores on the CPU pool) non-preemptible training may hold, as the
    next cycle's mixed load sets them (mixed_load.non_preemptible_caps): for a spec's dry run."""
    return non_preemptible_caps(Snapshot(tuple(node_specs()), ()), load_serving())


def load_serving() -> list[ServingDemand]:
    """Every deployment mixed load counts: the live ones (`live_serving`), then those PENDING for capacity
    (`pending_serving`)."""
    return live_serving() + pending_serving()


def live_serving() -> list[ServingDemand]:
    """Live deployments, as mixed load sees them: what they reserve (replicas_max), what their autoscaler wants now,
    where their replicas run, and the ClusterQueue whose quota they count against. A CPU deployment's replicas are
    cores of the CPU pool (the cycle's slots there), counted against no quota (as the deploy check and the dry run
    count them); before, the cycle left them out, so CPU training was admitted onto cores replicas used and a CPU
    deployment waiting for cores got none back (QA)."""
    from inference.models import Deployment
    from inference.workflows import LIVE_STATES

    demands = []
    for deployment in Deployment.objects.filter(state__in=list(LIVE_STATES)).exclude(accelerator_type="") \
            .filter(Q(devices_per_replica__gt=0) | Q(accelerator_type="cpu")) \
            .select_related("local_queue__cluster_queue").order_by("id"):
        observed = deployment.observed or {}
        nodes = tuple(str(n) for n in observed.get("node_names") or ())[:deployment.replicas_ready]
        wanted = max(deployment.replicas_min, deployment.replicas_target, deployment.replicas_ready)
        # replicas being deployed run nowhere yet: held where the backend started them, else where the last cycle
        # held them, until they run and are counted from the observed nodes above
        starting = tuple(str(n) for n in observed.get("starting_node_names") or ())
        held_nodes = tuple(str(node) for node, _ in deployment.capacity_held or [])
        on_cpu = deployment.accelerator_type == "cpu"
        demands.append(ServingDemand(id=str(deployment.pk), accelerator_type=deployment.accelerator_type,
                                     devices_per_replica=_serving_units(deployment, deployment.accelerator_type),
                                     replicas_max=deployment.replicas_max, replicas_wanted=wanted,
                                     replica_nodes=nodes, pool=deployment.pool or None,
                                     replicas_running=deployment.replicas_ready,
                                     cluster_queue=None if on_cpu else deployment.local_queue.cluster_queue.name,
                                     replicas_min=deployment.replicas_min,
                                     replicas_limit=deployment.replicas_limit,
                                     starting_nodes=starting, held_nodes=held_nodes))
    return demands


def pending_serving() -> list[ServingDemand]:
    """Deployments PENDING because their replicas fit on no free devices, as demands for `replicas_min` replicas on
    the first accepted accelerator type whose quota takes them: mixed load then holds those devices, or has training
    give them back, so a new deployment is not starved by training that uses capacity it may reclaim (the sync
    deploys it once the devices are free). A deployment whose model is not ready yet (its source job has no
    checkpoint), or which waits for quota, makes nobody give anything back."""
    from inference import selectors
    from inference.models import Deployment
    from inference.states import DeploymentState
    from inference.workflows import ModelNotFound, resolve_model_dir

    demands = []
    reads: dict = {}  # per-type reads (_type_reads), made once per pass
    for deployment in Deployment.objects.filter(state=DeploymentState.PENDING,
                                                state_reason__startswith="waiting for capacity") \
            .select_related("local_queue__cluster_queue", "source_job").order_by("id"):
        replicas = max(1, deployment.replicas_min)
        # (a CPU replica takes cores of the CPU pool, counted against no quota)
        candidates = [slug for slug in deployment.accelerator_types
                      if _serving_units(deployment, slug) > 0
                      and _nodes_could_hold(slug, _serving_units(deployment, slug), replicas, reads)
                      and (slug == "cpu" or not selectors.serving_quota_refusal(
                          deployment=deployment, accelerator_type=slug, replicas=replicas))]
        # The first type where free devices and what training may give back could hold it (before, always the first
        # type: a deployment accepting A100 and H100 waited for good for A100s non-preemptible training held while
        # preemptible training filled the H100s, found by QA); else the first, which says why it waits.
        slug = next((slug for slug in candidates
                     if _could_be_freed(slug, _serving_units(deployment, slug), replicas, reads)),
                    candidates[0] if candidates else None)
        if slug is None:
            continue
        try:
            resolve_model_dir(deployment)
        except ModelNotFound:  # not ready yet (or never will be): nothing to give capacity to
            continue
        demands.append(ServingDemand(id=str(deployment.pk), accelerator_type=slug,
                                     devices_per_replica=_serving_units(deployment, slug),
                                     replicas_max=deployment.replicas_max, replicas_wanted=replicas,
                                     replicas_running=0, all_or_none=True,
                                     held_nodes=tuple(str(node) for node, _ in deployment.capacity_held or []),
                                     cluster_queue=None if slug == "cpu" else
                                     deployment.local_queue.cluster_queue.name))
    return demands


def _serving_units(deployment, slug: str) -> float:
    """What one replica of the deployment takes of `slug` in the cycle: its devices, or on the CPU pool the cores
    its server reserves (inference.workflows.replica_cpus)."""
    from inference.workflows import replica_cpus

    if slug == "cpu":
        return replica_cpus(accelerator_type="cpu", devices_per_replica=0.0)
    return float(deployment.devices_per_replica)


def _could_be_freed(slug: str, devices_per_replica: float, replicas: int, reads: dict) -> bool:
    """Whether the type's live, uncordoned nodes could hold the replicas once the training that may be preempted now
    gave its devices back: devices of non-preemptible training, of jobs STARTING or RECOVERING, and of running
    serving replicas stay where they are."""
    capacity, held = _type_reads(slug, reads)
    room = 0
    for node, devices in capacity.items():
        room += replicas_fit(max(0.0, float(devices) - held[node]), devices_per_replica)
    return room >= replicas


def _nodes_could_hold(slug: str, devices_per_replica: float, replicas: int, reads: dict) -> bool:
    """Whether the type's live, uncordoned nodes could hold the replicas once training gave their devices back (cores
    on the CPU pool)."""
    capacity, _ = _type_reads(slug, reads)
    return sum(replicas_fit(float(devices), devices_per_replica) for devices in capacity.values()) >= replicas


def _type_reads(slug: str, reads: dict) -> tuple[dict[str, float], Counter]:
    """(capacity of each live, uncordoned node of the type, what stays held on it: non-preemptible training, jobs
    STARTING or RECOVERING, running replicas), read once per pass of `pending_serving` (`reads`; before, every
    pending deployment read them all again: 45 pending took a cycle to 347 queries; a review)."""
    if slug in reads:
        return reads[slug]
    from inference.models import Deployment
    from inference.workflows import LIVE_STATES

    capacity = dict(Node.objects.filter(pool__accelerator_type__slug=slug, health=NodeHealth.HEALTHY, cordoned=False)
                    .values_list("name", "capacity_cpus" if slug == "cpu" else "capacity_devices"))
    held: Counter = Counter()
    for placement, state, preemptible in TrainingJob.objects.filter(
            state__in=HOLDING_STATES, admitted_accelerator_type=slug).values_list(
            "placement", "state", "priority_class__preemptible"):
        if state in PREEMPTIBLE_STATES and preemptible is not False:
            continue  # it may give its devices back
        for worker in placement or []:
            held[worker["node"]] += sum(float(share) for _, share in worker.get("taken", []))
    for deployment in Deployment.objects.filter(state__in=list(LIVE_STATES), accelerator_type=slug) \
            .only("observed", "devices_per_replica"):
        for node in (deployment.observed or {}).get("node_names") or ():
            held[str(node)] += _serving_units(deployment, slug)
    reads[slug] = (capacity, held)
    return reads[slug]


def _schedule_with_serving(snapshot: Snapshot) -> CycleResult:
    """Mixed load first (replicas hold their devices; wanted replicas take free ones or what training gives back),
    then the training cycle on what is left; the give-back decisions are applied like the cycle's own."""
    serving = load_serving()
    plan = plan_mixed_load(snapshot, serving)
    result = schedule(plan.snapshot)
    # before the give-back decisions join the result: the plan's snapshot has already applied them
    lent = {t: d for t, d in loans(snapshot, serving, training_usage_after(plan.snapshot, result)).items() if d > 0}
    result.preempted[:0] = plan.preempted
    result.shrunk[:0] = plan.shrunk
    _limit_replicas(plan.limits)  # (first: a note repeated from the last cycle is then still the latest event)
    _store_holds(plan.held_for_wanted)
    _note_on_deployments(plan)
    # (preemptible ones only: a non-preemptible job is kept off reserved capacity, and could not give it back; before,
    # every admission on a type with a loan promised to give it back; found by QA)
    preemptible = {w.id for w in snapshot.pending if w.preemptible}
    for index, admit in enumerate(result.admitted):
        if lent.get(admit.accelerator_type) and admit.workload_id in preemptible:
            result.admitted[index] = replace(admit, reason=(
                f"{admit.reason}; on loan: training now uses {lent[admit.accelerator_type]:g} "
                f"{admit.accelerator_type} of the capacity deployments reserved, given back when they scale out"))
    return result


def _note_on_deployments(plan) -> None:
    """A deployment's timeline says which jobs give capacity back for it, and why wanted replicas still wait
    (the same reason is not recorded again until something else happened to the deployment)."""
    from inference.models import Deployment, DeploymentEvent

    notes: dict[str, list[str]] = {}
    for decision in [*plan.preempted, *plan.shrunk]:
        how = "shrinks" if isinstance(decision, Shrink) else "stops"
        what = "quota this deployment needs" if gives_back_quota(decision) else "capacity this deployment needs"
        notes.setdefault(decision.for_workload.removeprefix(SERVING_PREFIX), []).append(
            f"job {decision.workload_id} checkpoints and {how} to give back {what}")
    for deployment_id, why in plan.waiting.items():
        notes.setdefault(deployment_id, []).append(why)
    # (one query for all of them and their latest reasons: two per deployment made a cycle's cost grow with the
    # deployments waiting; a review)
    latest = DeploymentEvent.objects.filter(subject=OuterRef("pk")).order_by("-id").values("reason")[:1]
    found = {str(d.pk): d for d in Deployment.objects.filter(pk__in=[int(i) for i in notes])
             .annotate(latest_reason=Subquery(latest))}
    for deployment_id, reasons in notes.items():
        deployment = found.get(deployment_id)
        if deployment is None:
            continue
        last = deployment.latest_reason
        for reason in reasons:
            if reason != last:
                record_event(obj=deployment, event_model=DeploymentEvent, from_state=deployment.state,
                             to_state=deployment.state, reason=reason, system="scheduler")
                last = reason


def _store_holds(held: dict[str, tuple]) -> None:
    """Store the devices the cycle holds for each deployment's wanted replicas that do not run yet, as [node, devices]
    pairs, and clear the rest: the deploy check of another deployment leaves them out (before, a deployment created
    while training gave a node back for another one's replica could take that node)."""
    from inference.models import Deployment

    wanted = {int(i): sorted([w.node, round(sum(share for _, share in w.taken), 6)] for w in workers)
              for i, workers in held.items()}
    changed = [d for d in Deployment.objects.filter(Q(pk__in=list(wanted)) | ~Q(capacity_held=[])).order_by("id")
               if d.capacity_held != wanted.get(d.pk, [])]
    for deployment in changed:
        deployment.capacity_held = wanted.get(deployment.pk, [])
    write_fields(changed, ["capacity_held"])


def _limit_replicas(limits: dict[str, tuple[int, str]]) -> None:
    """Store each live deployment's replica limit (None when its quota takes all of replicas_max) where it changed,
    with an event saying why; the deployment's sync caps Ray Serve's autoscaler there (inference.workflows)."""
    from inference.models import Deployment, DeploymentEvent
    from inference.workflows import LIVE_STATES

    changed = []
    # ... and no limit for a live deployment the cycle no longer counts (moved to the CPU pool, say): a limit left
    # behind would cap it for good
    for deployment in Deployment.objects.filter(Q(pk__in=[int(i) for i in limits]) | Q(
            state__in=list(LIVE_STATES), replicas_limit__isnull=False)).order_by("id"):
        limit, why = limits.get(str(deployment.pk), (deployment.replicas_max, ""))
        new = limit if limit < deployment.replicas_max else None
        if new == deployment.replicas_limit:
            continue
        deployment.replicas_limit = new
        reason = (f"quota: at most {new} of its {deployment.replicas_max} replicas now ({why})" if new is not None
                  else f"quota: all {deployment.replicas_max} replicas allowed again")
        changed.append((deployment, reason, {"replicas_limit": new}))
    write_fields([deployment for deployment, _, _ in changed], ["replicas_limit"])
    record_events_many(changed, event_model=DeploymentEvent, system="scheduler")


def _withdraw_admissions_off_unschedulable_nodes() -> None:
    """ADMITTED -> QUEUED for every job admitted onto a node that has since been cordoned or become unhealthy and that
    has not launched yet (a preemptor holding its admission while its victims stop, or a launch not run yet): its
    admission is withdrawn before the cycle loads its snapshot, so the cycle places it again in the same pass. Before,
    it stayed admitted there, and once its victims had stopped it was launched onto the cordoned node (new work where
    none may go), only to be moved off it after a checkpoint, or to wait on it for good (found by QA)."""
    admitted = list(TrainingJob.objects.filter(state=JobState.ADMITTED).select_for_update(of=("self",))
                    .order_by("id"))
    if not admitted:
        return
    schedulable = set(Node.objects.filter(health=NodeHealth.HEALTHY, cordoned=False).values_list("name", flat=True))
    changes = []
    for job in admitted:
        off = sorted({worker["node"] for worker in job.placement or []} - schedulable)
        if not off:
            continue
        job.admitted_accelerator_type, job.placement, job.waits_for = "", [], []
        verb = "is" if len(off) == 1 else "are"
        changes.append((job, f"admission withdrawn before it launched: {', '.join(off)} {verb} cordoned or not "
                             "healthy; waiting to be admitted again", {"nodes": off}))
    transition_many(changes, machine=TrainingJob.machine, event_model=TrainingJobEvent, to=JobState.QUEUED,
                    system="scheduler", fields=["admitted_accelerator_type", "placement", "waits_for"])


@transaction.atomic
def run_cycle() -> CycleResult:
    lock_cluster_queues()
    _withdraw_admissions_off_unschedulable_nodes()
    snapshot, jobs = load_snapshot()
    result = _schedule_with_serving(snapshot)
    from jobs.tasks import launch_training_job, stop_training_run

    # Devices a preempted run still holds while it checkpoints and stops (it keeps its placement until then), and
    # those a running elastic victim gives back once it has checkpointed and shrunk: whoever is admitted onto them
    # launches once that run is gone or smaller, and elastic growth does not take them. A victim admitted but not
    # started yet leaves at once.
    def started(job_id: str) -> bool:
        return jobs[job_id].state != JobState.ADMITTED and bool(jobs[job_id].compute_handle)

    busy = _devices_still_in_use(
        [jobs[p.workload_id] for p in result.preempted if started(p.workload_id)],
        [(jobs[s.workload_id], s.released) for s in result.shrunk if started(s.workload_id)])
    result.grown[:] = _growth_off(result.grown, busy)
    # Every decision of a kind is written together (a few statements for hundreds of jobs; one job's rows, event,
    # audit record and outbox record each took about 7 statements per decision): the jobs are locked and fresh.
    admissions = [(jobs[admit.workload_id], admit) for admit in result.admitted]
    # a preemptor: admitted now, so nothing admitted later takes what it freed
    admissions += [(jobs[wait.workload_id], wait.held) for wait in result.waiting if wait.held is not None]
    victims_of: dict[str, list[str]] = {}
    for decision in [*result.preempted, *result.shrunk]:
        victims_of.setdefault(decision.for_workload, []).append(decision.workload_id)
    shrinking = {s.workload_id for s in result.shrunk}
    # a run shrunk in an earlier cycle that still has its extra workers is waited for too: it shrinks, not stops
    preempted_now = {p.workload_id for p in result.preempted}
    waited = {str(pk) for _, admit in admissions for pk in _overlap(admit, busy)}
    shrinking |= {pk for pk in waited - preempted_now if pk in jobs and jobs[pk].state in HOLDING_STATES}
    _admit_all([(job, admit, _overlap(admit, busy)) for job, admit in admissions], victims_of,
               started={v for victims in victims_of.values() for v in victims if started(v)}, shrinking=shrinking)
    admitted_now = {str(job.pk) for job, _ in admissions}
    # An admitted job that has not started gives its admission back; a running one is asked to checkpoint and stop
    # by the training runtime, which moves it on to QUEUED (and clears its placement).
    requeued = [(jobs[p.workload_id], p) for p in result.preempted if jobs[p.workload_id].state == JobState.ADMITTED]
    stopped = [(jobs[p.workload_id], p) for p in result.preempted if jobs[p.workload_id].state != JobState.ADMITTED]
    for job, _ in requeued + stopped:
        job.admitted_accelerator_type, job.waits_for = "", []
    for job, _ in requeued:
        job.placement = []
    for pairs, target, fields in ((requeued, JobState.QUEUED, ["admitted_accelerator_type", "placement", "waits_for"]),
                                  (stopped, JobState.PREEMPTED, ["admitted_accelerator_type", "waits_for"])):
        transition_many([(job, _for_job(p), {"for": p.for_workload}) for job, p in pairs], machine=TrainingJob.machine,
                        event_model=TrainingJobEvent, to=target, system="scheduler", fields=fields)
    dispatch_many_on_commit(stop_training_run, [((job.pk,), {"checkpoint": True, "reason": "preempted"})
                                                for job, _ in stopped if job.compute_handle])
    resized = []
    for change in [*result.shrunk, *result.grown]:
        job = jobs[change.workload_id]
        kept = _placement_from_json(job.placement)
        if hasattr(change, "released"):
            workers = without_workers(kept, change.released)
        else:
            workers = kept + change.added
        job.placement = _placement_to_json(workers)
        resized.append((job, _for_job(change), {"workers": len(workers)}))
    write_fields([job for job, _, _ in resized], ["placement"])
    record_events_many(resized, event_model=TrainingJobEvent, system="scheduler")
    # Waiting jobs whose position or reason changed, written together: one admission at the head of 10,000 waiting
    # jobs changes every position behind it (one UPDATE each took a query per waiting job).
    moved_up = []
    for job, position, why in _positions(result, jobs, requeued):
        reason = f"position {position} in cluster queue {job.local_queue.cluster_queue.name}: {why}"
        if job.queue_position != position or job.state_reason != reason:
            job.queue_position, job.state_reason = position, reason
            moved_up.append(job)
    write_fields(moved_up, ["queue_position", "state_reason"])
    # A preemptor admitted in an earlier cycle starts once its victims are gone (requeued or ended; both
    # kick a cycle). The launch checks again under its own lock.
    moved = {p.workload_id for p in result.preempted}
    holding = [job for job_id, job in jobs.items() if job.state == JobState.ADMITTED and job.waits_for
               and job_id not in moved and job_id not in admitted_now]
    stopping = set(victims_still_stopping([victim for job in holding for victim in job.waits_for]))  # two queries
    dispatch_many_on_commit(launch_training_job, [((job.pk,), {}) for job in holding
                                                  if not stopping.intersection(job.waits_for)])
    return result


def _for_job(decision) -> str:
    """The core's reason with the preemptor named as a job: "preempted for job 6 (...)", "shrunk to 1 workers for
    job 5 (...)" (the core names workloads by id, and "preempted for 6" read as a count; QA). Growth and the
    give-backs to deployments (which name the deployment) are left as they are."""
    reason, preemptor = decision.reason, getattr(decision, "for_workload", "")
    if preemptor.isdigit():
        return reason.replace(f" for {preemptor} (", f" for job {preemptor} (", 1)
    return reason


def _positions(result: CycleResult, jobs: dict[str, TrainingJob], requeued: list[tuple[TrainingJob, object]]):
    """(job, position, reason) of every job waiting after the cycle: the core's waits (not the preemptors holding
    their admission) and the victims it sent back to the queue from ADMITTED (before, those had no position until the
    next cycle), each cluster queue in the core's order (priority, then arrival, then id)."""
    by_queue: dict[str, list] = {}
    rows = [(jobs[w.workload_id], w.position, w.reason) for w in result.waiting if w.held is None]
    if not requeued:
        return rows
    rows += [(job, 0, f"requeued: {_for_job(decision)}") for job, decision in requeued]
    for job, _, why in rows:
        priority = job.priority_class.value if job.priority_class else 0
        key = (-priority, job.created_at.timestamp(), str(job.pk))  # as the core orders the waiting workloads
        by_queue.setdefault(job.local_queue.cluster_queue.name, []).append((key, job, why))
    ordered = []
    for queue_rows in by_queue.values():
        queue_rows.sort(key=lambda row: row[0])
        ordered += [(job, position, why) for position, (_, job, why) in enumerate(queue_rows, start=1)]
    return ordered


def _devices_still_in_use(preempted_now: list[TrainingJob], shrunk_now: list[tuple[TrainingJob, tuple]]
                          ) -> dict[tuple[str, int], int]:
    """(node, device index) -> id of the job whose run still holds it although the scheduler gave it away: runs
    preempted (now or before) that have not stopped, the workers a running elastic job releases now, and every
    device (outside its own placement) of a node where a run shrunk before still has more workers than its
    placement (which devices it still uses there is not known, so none of the node's others is taken)."""
    stopping = list(_runs_still_stopping(TrainingJob.objects.all()).values_list("pk", "placement"))
    busy: dict[tuple[str, int], int] = {}
    for job_id, placement in [*stopping, *((job.pk, job.placement) for job in preempted_now)]:
        for worker in placement or []:
            for index, _share in worker.get("taken", []):
                busy[(worker["node"], int(index))] = job_id
    for job, released in shrunk_now:
        for worker in released:
            for index, _share in worker.taken:
                busy[(worker.node, int(index))] = job.pk
    # (a run shrunk now may still be leaving nodes from an earlier shrink: its placement here is the one before)
    shrinking = _still_shrinking(TrainingJob.objects.filter(state__in=HOLDING_STATES).exclude(compute_handle="")
                                 .values_list("pk", "placement", "observed_nodes"))
    if shrinking:
        # a CPU node's slots are its CPUs, as load_snapshot counts them
        capacity = {name: cpus if slug == "cpu" else devices for name, slug, cpus, devices in Node.objects.filter(
            name__in={node for nodes, _ in shrinking.values() for node in nodes}).values_list(
            "name", "pool__accelerator_type__slug", "capacity_cpus", "capacity_devices")}
        for job_id, (nodes, own) in shrinking.items():
            for node in nodes:
                for index in range(int(capacity.get(node, 0))):
                    if (node, index) not in own:
                        busy.setdefault((node, index), job_id)
    return busy


def _still_shrinking(rows) -> dict[int, tuple[set[str], set[tuple[str, int]]]]:
    """Of (id, placement, observed nodes) rows: the runs with more workers on a node than their placement has there,
    as id -> (those nodes, the (node, device) pairs of their own placement)."""
    shrinking = {}
    for job_id, placement, observed in rows:
        extra = Counter(observed or []) - Counter(worker["node"] for worker in placement or [])
        if extra:
            # only devices (cores) the kept workers take whole are theirs alone: the shed worker may share the rest
            own = {(worker["node"], int(index)) for worker in placement or []
                   for index, share in worker.get("taken", []) if float(share) >= 1.0 - 1e-9}
            shrinking[job_id] = (set(extra), own)
    return shrinking


def _growth_off(grown: list, busy: dict[tuple[str, int], int]) -> list:
    """The growth decisions less the workers they would add onto devices a run still holds (busy): growth only takes
    what is free now (the core counted those devices free; a later cycle grows onto them once they are)."""
    kept = []
    for grow in grown:
        added = tuple(w for w in grow.added if not any((w.node, index) in busy for index, _ in w.taken))
        if len(added) == len(grow.added):
            kept.append(grow)
        elif added:  # (the reason said the size before the trim: "grown to 4 workers" for a job grown to 3)
            to = grow.to_workers - (len(grow.added) - len(added))
            reason = grow.reason.replace(f"grown to {grow.to_workers} workers", f"grown to {to} workers", 1)
            kept.append(replace(grow, to_workers=to, added=added,
                                reason=f"{reason} (more once a run stopping or shrinking gives its devices back)"))
    return kept


def _overlap(admit, busy: dict[tuple[str, int], int]) -> list[int]:
    return sorted({busy[(w.node, index)] for w in admit.workers for index, _ in w.taken if (w.node, index) in busy})


def waits_on(ids: list[str], verb: str) -> str:
    """What a held admission waits for, in words: "job 12 checkpoints and stops", "jobs 12, 14 checkpoint and shrink"
    (it read "12 checkpoint(s) and stop", the job id looking like a count; found by QA)."""
    if len(ids) == 1:
        return f"job {ids[0]} checkpoints and {verb}s"
    return f"jobs {', '.join(ids)} checkpoint and {verb}"


# The runtime state a cancelled job's run gets once training_job_stop_run has stopped and released it: until then its
# devices count as in use (a cycle gave them away at once, before the stop had run; noticed at stop 30).
RUN_RELEASED = "stopped"


def _runs_still_stopping(jobs):
    """Of `jobs`, those whose run still holds its devices although the scheduler gave them away: preempted runs that
    have not stopped (the stop clears the handle as the job is requeued), and runs of cancelled jobs not yet stopped
    and released."""
    return jobs.exclude(compute_handle="").filter(
        Q(state=JobState.PREEMPTED) | (Q(state=JobState.CANCELLED) & ~Q(runtime_state=RUN_RELEASED)))


def victims_still_stopping(victim_ids: list[int]) -> list[int]:
    """The jobs among `victim_ids` that were preempted (or cancelled) while running and have not stopped yet, or shrunk
    while running and still have more workers on a node than their placement."""
    stopping = set(_runs_still_stopping(TrainingJob.objects.filter(pk__in=victim_ids)).values_list("pk", flat=True))
    stopping |= set(_still_shrinking(TrainingJob.objects.filter(pk__in=victim_ids, state__in=HOLDING_STATES)
                                     .exclude(compute_handle="").values_list("pk", "placement", "observed_nodes")))
    return sorted(stopping)


def held_reason(job: TrainingJob, stopping: list[int]) -> str:
    """A held admission's reason while the victims `stopping` (victims_still_stopping) are still going: "admitted (1 x 8
    nvidia-h100 held); launches once job 12 checkpoints and shrinks". A victim preempted while running stops; one that
    still holds its admission was shrunk and keeps running smaller."""
    shrinking = {str(pk) for pk in TrainingJob.objects.filter(pk__in=stopping, state__in=HOLDING_STATES)
                 .values_list("pk", flat=True)}
    return _held_text(job, stopping, shrinking, _cancelled(stopping))


def _cancelled(job_ids) -> set[str]:
    """The ids (as strings) of the cancelled jobs among `job_ids`."""
    return {str(pk) for pk in TrainingJob.objects.filter(pk__in=job_ids, state=JobState.CANCELLED)
            .values_list("pk", flat=True)} if job_ids else set()


def _held_text(job: TrainingJob, waits_for: list[int], shrinking: set[str], cancelled: set[str] = frozenset()) -> str:
    """The reason of `job`, admitted (placement and type set) and waiting for `waits_for`, those in `shrinking` (ids
    as strings) shrinking, those in `cancelled` stopping without a checkpoint, the others checkpointing and stopping."""
    stop = [str(v) for v in waits_for if str(v) not in shrinking and str(v) not in cancelled]
    shrink = [str(v) for v in waits_for if str(v) in shrinking]
    ended = [str(v) for v in waits_for if str(v) in cancelled and str(v) not in shrinking]
    waits = [waits_on(ids, verb) for ids, verb in ((stop, "stop"), (shrink, "shrink")) if ids]
    if ended:
        waits.append(f"job {ended[0]} (cancelled) has stopped" if len(ended) == 1
                     else f"jobs {', '.join(ended)} (cancelled) have stopped")
    # (the size too: "1 x nvidia-h100 held" read as one device for a worker of 8; QA)
    size = job.cpus_per_worker if job.admitted_accelerator_type == "cpu" else job.devices_per_worker
    return (f"admitted ({len(job.placement or [])} x {size:g} {job.admitted_accelerator_type} held); launches once "
            f"{' and '.join(waits)}")


def _admit_all(admissions: list[tuple[TrainingJob, object, list[int]]], victims_of: dict[str, list[str]],
               started: set[str] = frozenset(), shrinking: set[str] = frozenset()) -> None:
    """QUEUED -> ADMITTED on the devices the core chose, for every (job, admit, waits_for) of the cycle at once. A
    preemptor whose victims are still stopping (or shrinking) holds them (quota and devices count for it from now on)
    and launches once the victims are gone (or smaller); the others launch now. `started`: the victims whose runs had
    started; `shrinking`: the victims shrunk rather than stopped."""
    from jobs.tasks import launch_training_job

    changes = []
    cancelled = _cancelled({pk for _, _, waits_for in admissions for pk in waits_for})
    for job, admit, waits_for in admissions:
        job.admitted_accelerator_type, job.placement = admit.accelerator_type, _placement_to_json(admit.workers)
        job.queue_position, job.waits_for = None, waits_for
        reason = f"admitted: {admit.reason}"
        victims = victims_of.get(str(job.pk))
        if victims and not waits_for:
            if started.intersection(victims):  # they checkpoint and give back quota; its devices were free
                reason = (f"admitted: {admit.reason}; {', '.join(victims)} preempted or shrunk for it (they checkpoint "
                          "first; the devices it runs on were free)")
            else:  # a preemptor whose victims had not started: nothing to wait for
                reason = (f"admitted onto the devices of {', '.join(victims)}, preempted for it before they started "
                          "(nothing to checkpoint)")
        if waits_for:
            reason = _held_text(job, waits_for, shrinking, cancelled)
        changes.append((job, reason, {"accelerator_type": admit.accelerator_type, "workers": len(admit.workers),
                                      "nodes": sorted({w.node for w in admit.workers}), "borrowed": admit.borrowed,
                                      "waits_for": waits_for}))
    transition_many(changes, machine=TrainingJob.machine, event_model=TrainingJobEvent, to=JobState.ADMITTED,
                    system="scheduler", fields=["admitted_accelerator_type", "placement", "queue_position",
                                                "waits_for"])
    dispatch_many_on_commit(launch_training_job, [((job.pk,), {}) for job, _, waits_for in admissions
                                                  if not waits_for])


def _with_others_held(snapshot: Snapshot, job_id: int) -> Snapshot:
    """The snapshot with what the cycle keeps training off held: running serving replicas, the devices runs that are
    stopping or shrinking still use (`_devices_still_in_use`, but the job's own), and the capacity the cycle holds for
    deployments' wanted replicas (`Deployment.capacity_held`, as the deploy check reads it)."""
    from inference.selectors import held_for_wanted_replicas

    busy = [device for device, holder in _devices_still_in_use([], []).items() if holder != job_id]
    held = sorted(held_for_wanted_replicas(exclude=None).items())
    return hold_in_place(snapshot, live_serving(), held=held, devices=busy)


def _holder_in_words(holder: str) -> str:
    if holder == "unschedulable":
        return "cordoned or not healthy"
    if holder.startswith(SERVING_PREFIX):
        return f"deployment {holder.removeprefix(SERVING_PREFIX)}'s replica"
    if holder.startswith("held:"):
        return "held for a deployment's replica being deployed"
    if holder.startswith("stopping:"):
        return "a run still stopping or shrinking"
    return f"job {holder}"


@transaction.atomic
def placement_taken(*, job_id: int) -> dict[str, str]:
    """node -> why, for each node of the job's placement whose devices others hold as the cycle counts them (running
    replicas, replicas being deployed, runs still stopping or shrinking, other jobs) or that takes no new work: the
    nodes a run given this placement cannot reserve. Empty when the control plane sees the whole placement free."""
    lock_cluster_queues()
    job = TrainingJob.objects.filter(pk=job_id).first()
    if job is None or job.state not in HOLDING_STATES or not job.admitted_accelerator_type:
        return {}
    snapshot, _ = load_snapshot()
    snapshot = replace(snapshot, running=tuple(r for r in snapshot.running if r.workload.id != str(job.pk)))
    snapshot = _with_others_held(snapshot, job.pk)
    taken = taken_by_others(snapshot, _placement_from_json(job.placement), str(job.pk))
    return {node: ", ".join(_holder_in_words(h) for h in holders) for node, holders in sorted(taken.items())}


@transaction.atomic
def replace_workers(*, job_id: int, exclude: list[str], require_all: bool = False,
                    because: str = "") -> TrainingJob | None:
    """Give a running gang new nodes for the workers it has on `exclude` (lost or cordoned nodes).

    Same lock and snapshot as the cycle. The gang keeps its quota; its workers on other nodes stay
    where they are. If the lost workers cannot all be placed, the gang shrinks to the workers it kept
    when `workers_min` allows; otherwise the placement is left as it is and the next pass retries.
    Returns the job with its new placement (and `recovery_exclude` cleared), or None when it waits.
    `require_all`: move only if every worker finds a new node (a slow node: a gang that keeps running
    slowly is better than a smaller one), and record nothing otherwise. `because`: why it leaves those nodes,
    for the reasons it records.
    """
    lock_cluster_queues()
    job = TrainingJob.objects.select_for_update().filter(pk=job_id).first()
    if job is None or job.state not in HOLDING_STATES or not job.admitted_accelerator_type:
        return None
    excluded = set(exclude)
    current = _placement_from_json(job.placement)
    kept = tuple(w for w in current if w.node not in excluded)
    missing = len(current) - len(kept)
    if missing == 0:
        TrainingJob.objects.filter(pk=job.pk).update(recovery_exclude=[])
        return TrainingJob.objects.get(pk=job.pk)
    snapshot, _ = load_snapshot()
    snapshot = replace(
        snapshot,
        nodes=tuple(replace(n, schedulable=n.schedulable and n.name not in excluded) for n in snapshot.nodes),
        running=tuple(Running(r.workload, r.accelerator_type, kept) if r.workload.id == str(job.pk) else r
                      for r in snapshot.running))
    snapshot = _with_others_held(snapshot, job.pk)
    accelerator_type = job.admitted_accelerator_type
    added = place_additional_workers(snapshot, accelerator_type=accelerator_type, workers=missing,
                                     devices=_units(job, accelerator_type))
    if added is None and require_all:
        return None
    if added is None and (len(kept) < job.workers_min or not kept):
        why = f" ({because})" if because else ""
        reason = f"waiting for capacity to re-place {missing} worker(s)" + (
            f" off {', '.join(sorted(excluded))}{why}" if because else "")
        if job.state_reason != reason:
            record_event(obj=job, event_model=TrainingJobEvent, from_state=job.state, to_state=job.state,
                         reason=f"waiting for capacity: {missing} worker(s) to re-place off "
                                f"{', '.join(sorted(excluded))}{why}; at least {job.workers_min} needed",
                         system="scheduler")
            TrainingJob.objects.filter(pk=job.pk).update(state_reason=reason)
        return None
    workers = kept + (added or ())
    how = (f"re-placed {missing} worker(s) on {', '.join(sorted({w.node for w in added}))}" if added
           else f"shrunk to the {len(kept)} worker(s) still placeable (min {job.workers_min})")
    TrainingJob.objects.filter(pk=job.pk).update(placement=_placement_to_json(workers), recovery_exclude=[])
    why = f" ({because})" if because else ""
    record_event(obj=job, event_model=TrainingJobEvent, from_state=job.state, to_state=job.state,
                 reason=f"{how}; leaving {', '.join(sorted(excluded))}{why}", system="scheduler",
                 data={"workers": len(workers), "excluded": sorted(excluded)})
    return TrainingJob.objects.get(pk=job.pk)
