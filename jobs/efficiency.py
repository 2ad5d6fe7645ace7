"""Measured step times refine the scheduler's efficiency matrix (issue 3): "unknown classes get a default from chip
facts until real step times refine the matrix".

A job's workload class says which jobs do the same work per step, so their speeds on different chips compare:
the built-in trainer with one model shape and batch (`builtin_lm:<layers>x<d_model>:<context>x<batch>`), or one
user program (`entrypoint:<first 12 hex of the command's SHA-256>`). A job that ran at least `MIN_STEPS` steps
after warm-up on nodes that are not simulated gives one observation: worker-steps per second per device,
1 / (median step time x devices per worker). The scheduling cycle folds the latest observations per class and type
into the matrix (`jobs.admission.efficiency_matrix`), oldest first, so a type's measured speed replaces its prior
from chip TFLOPS and the type choice says "measured". Runs on simulated chips (host CPU step times) never count.
A read-only selector: nothing is written.
"""

from __future__ import annotations

import functools
import hashlib
import json
import time
from dataclasses import dataclass

from django.db.models import Count, Max

from jobs.calibration import MIN_STEPS, median_step_time, ran_on_simulated, simulation_flags
from jobs.models import Trainer, TrainingJob
from jobs.states import JobState

MAX_OBSERVATIONS_PER_ENTRY = 10  # the latest runs per (class, type); older ones stop counting
MAX_JOBS_READ = 500
MEASURED_STATES = (JobState.RUNNING, JobState.RECOVERING, JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


@dataclass(frozen=True)
class Observation:
    workload_class: str
    accelerator_type: str
    units_per_second: float  # worker-steps per second per device
    job_id: int
    median_step_s: float


def workload_class_of(*, trainer: str, hyperparameters: dict | None = None, entrypoint: str = "") -> str:
    """The class of a job (or of a spec not submitted yet): jobs of one class do the same work per step."""
    if trainer == Trainer.ENTRYPOINT:
        digest = hashlib.sha256((entrypoint or "").strip().encode("utf-8")).hexdigest()[:12]
        return f"entrypoint:{digest}"
    try:
        key = json.dumps(hyperparameters or {}, sort_keys=True)
    except (TypeError, ValueError):  # (not JSON: never from the database; parsed as it is)
        return _builtin_class(hyperparameters)
    return _builtin_class_of_json(key)


@functools.lru_cache(maxsize=4096)
def _builtin_class_of_json(key: str) -> str:
    """The built-in trainer's class of the hyperparameters `key` (canonical JSON): the scheduling cycle asks it of every
    waiting job in every cycle, and parsing and checking the model shape each time took a quarter of loading the
    snapshot (8,000 waiting jobs: about 0.4 s of 1.9 s under the profiler). Jobs of a team mostly share a few."""
    return _builtin_class(json.loads(key))


def _builtin_class(hyperparameters) -> str:
    from jobs.runtime.lm_config import TrainHyperparameters  # torch-free

    try:
        hp = TrainHyperparameters.from_dict(hyperparameters or {})
    except ValueError:
        return "builtin_lm"
    model = hp.model_config()
    return f"builtin_lm:{model.n_layers}x{model.d_model}:{hp.context}x{hp.batch_size}"


def job_workload_class(job: TrainingJob) -> str:
    return workload_class_of(trainer=job.trainer, hyperparameters=job.hyperparameters, entrypoint=job.entrypoint)


_cache: dict[str, tuple] = {}
CACHE_SECONDS = 60.0  # a running job's median step time moves slowly; the cycle runs every few seconds


def cached_measured_throughputs() -> list[Observation]:
    """`measured_throughputs()`, recomputed when the set of measured jobs changes or after `CACHE_SECONDS`: the
    scheduling cycle asks every few seconds, and the full read costs a query per job on real nodes."""
    key = tuple(TrainingJob.objects.filter(state__in=MEASURED_STATES).exclude(admitted_accelerator_type="")
                .aggregate(count=Count("id"), last=Max("id"), changed=Max("state_changed_at")).values())
    hit = _cache.get("observations")
    now = time.monotonic()
    if hit is not None and hit[0] == key and now - hit[1] < CACHE_SECONDS:
        return hit[2]
    observations = measured_throughputs()
    _cache["observations"] = (key, now, observations)
    return observations


def measured_throughputs() -> list[Observation]:
    """The observations the matrix folds in, oldest first (the latest `MAX_OBSERVATIONS_PER_ENTRY` per entry)."""
    simulated_nodes, simulated_types = simulation_flags()
    kept: dict[tuple[str, str], list[Observation]] = {}
    jobs = (TrainingJob.objects.filter(state__in=MEASURED_STATES).exclude(admitted_accelerator_type="")
            .order_by("-id")[:MAX_JOBS_READ])
    for job in jobs:
        slug = job.admitted_accelerator_type
        key = (job_workload_class(job), slug)
        if len(kept.get(key, ())) >= MAX_OBSERVATIONS_PER_ENTRY:
            continue
        if ran_on_simulated(job, slug, simulated_nodes, simulated_types):
            continue
        median, rows = median_step_time(job)
        devices = job.units_per_worker(slug)
        if median is None or rows < MIN_STEPS or median <= 0 or devices <= 0:
            continue
        kept.setdefault(key, []).append(Observation(key[0], slug, 1.0 / (median * devices), job.pk, median))
    return sorted((o for group in kept.values() for o in group), key=lambda o: o.job_id)
