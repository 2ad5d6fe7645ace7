"""Training jobs (desired spec + observed status) and their state timeline."""

from __future__ import annotations

import math

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models
from django.utils import timezone

from controlplane.common.lifecycle import LifecycleEvent
from controlplane.datasets.models import DatasetVersion
from controlplane.quotas.models import LocalQueue, PriorityClass
from controlplane.tenancy.models import SLUG_VALIDATOR, Team
from jobs.states import JOB_MACHINE, JobState

# Bounds of the submitted spec (jobs/api/serializers.py); without them the column's own range (the database's
# integer) was the limit, refused by the model's validation under the column's name, not the field sent.
MAX_DURATION_SECONDS = 366 * 86400  # a year
MAX_CHECKPOINT_INTERVAL_STEPS = 1_000_000_000


class Trainer(models.TextChoices):
    BUILTIN_LM = "builtin-transformer-lm", "Built-in transformer language model"
    ENTRYPOINT = "entrypoint", "User entrypoint"


class TrainingJob(models.Model):
    # --- spec (desired) ---
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="training_jobs")
    name = models.SlugField(max_length=63, validators=[SLUG_VALIDATOR])
    local_queue = models.ForeignKey(LocalQueue, on_delete=models.PROTECT, related_name="training_jobs")
    priority_class = models.ForeignKey(PriorityClass, on_delete=models.PROTECT, null=True, blank=True,
                                       related_name="training_jobs")
    accelerator_types = models.JSONField(help_text="accepted accelerator type slugs, in preference order")
    workers_min = models.PositiveIntegerField(default=1, validators=[MinValueValidator(1)])
    workers_max = models.PositiveIntegerField(default=1, validators=[MinValueValidator(1)])
    devices_per_worker = models.PositiveIntegerField(default=1)
    cpus_per_worker = models.FloatField(default=1.0, validators=[MinValueValidator(0)])
    trainer = models.CharField(max_length=32, choices=Trainer.choices, default=Trainer.BUILTIN_LM)
    entrypoint = models.CharField(max_length=2000, blank=True)
    working_dir = models.CharField(max_length=1000, blank=True)
    hyperparameters = models.JSONField(default=dict, blank=True)
    envs = models.JSONField(default=dict, blank=True)
    secret_envs = models.JSONField(default=dict, blank=True,
                                   help_text="values of the secrets the spec names: given to the workers' "
                                             "environment, never returned by the API (only their names)")
    dataset_version = models.ForeignKey(DatasetVersion, on_delete=models.PROTECT, null=True, blank=True,
                                        related_name="training_jobs")
    checkpoint_interval_steps = models.PositiveIntegerField(default=100)
    checkpoint_keep_last = models.PositiveIntegerField(default=3, validators=[MinValueValidator(1)])
    max_restarts = models.PositiveIntegerField(default=3)
    max_duration_seconds = models.PositiveIntegerField(null=True, blank=True)
    parallelism = models.JSONField(default=dict, blank=True,
                                   help_text='{"mode": "auto", "model": ..., "global_batch_size": ...} or empty')
    parallel_plan = models.JSONField(default=dict, blank=True,
                                     help_text="the planner's layout per accepted accelerator type (parallelism: auto)")
    spec_yaml = models.TextField(blank=True, help_text="the YAML spec it was submitted with (fleetyard CLI/SDK)")
    # --- status (observed) ---
    state = models.CharField(max_length=16, choices=[(s.value, s.value) for s in JobState],
                             default=JobState.PENDING, db_index=True)
    state_reason = models.TextField(blank=True)
    state_changed_at = models.DateTimeField(default=timezone.now)
    compute_handle = models.CharField(max_length=128, blank=True,
                                      help_text="the compute backend's id for this job's gang")
    restarts = models.PositiveIntegerField(default=0)
    # Set by the scheduling cycle (jobs/admission.py):
    queue_position = models.PositiveIntegerField(null=True, blank=True,
                                                 help_text="place among the waiting workloads of its ClusterQueue")
    admitted_accelerator_type = models.CharField(max_length=63, blank=True)
    waits_for = models.JSONField(default=list, blank=True,
                                 help_text="ids of preempted, shrunk or cancelled jobs whose runs still hold "
                                           "devices this admission was given (checkpointing, stopping): it "
                                           "launches once they are gone")
    placement = models.JSONField(default=list, blank=True,
                                 help_text="one entry per worker: node and the device shares it holds")
    # Set by the run workflow (jobs/workflows.py) from what the run reports:
    attempt = models.PositiveIntegerField(default=0, help_text="launches so far; the handle names the attempt")
    runtime_state = models.CharField(max_length=32, blank=True, help_text="the run's own state, as reported")
    events_cursor = models.BigIntegerField(default=0, help_text="last run event applied (exactly once)")
    current_step = models.IntegerField(default=-1)
    last_checkpoint_step = models.IntegerField(default=-1)
    observed_nodes = models.JSONField(default=list, blank=True, help_text="one node per running worker")
    recovery_exclude = models.JSONField(default=list, blank=True,
                                        help_text="nodes the run must leave (lost, cordoned) until re-placed")
    goodput = models.JSONField(default=dict, blank=True, help_text="the effective-training-time ledger")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True,
                                   blank=True, related_name="+")
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    started_at = models.DateTimeField(null=True, blank=True, help_text="first start; ETTR counts from here")
    finished_at = models.DateTimeField(null=True, blank=True)

    machine = JOB_MACHINE

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.CheckConstraint(condition=models.Q(workers_max__gte=models.F("workers_min")),
                                   name="job_workers_max_gte_min"),
        ]

    def __str__(self) -> str:
        return f"{self.team}/{self.name} #{self.pk}"

    @staticmethod
    def terminal_state_values() -> list[str]:
        return [state.value for state in JOB_MACHINE.terminal_states()]

    @property
    def is_terminal(self) -> bool:
        return JOB_MACHINE.is_terminal(self.state)

    def units_per_worker(self, accelerator_type: str) -> float:
        """What one worker asks for: CPU cores on the `cpu` type (as Ray reserves them), devices otherwise."""
        return self.cpus_per_worker if accelerator_type == "cpu" else float(self.devices_per_worker)

    def placed_units_per_worker(self, accelerator_type: str) -> float:
        """What one worker takes and counts against quota as the scheduling core places it: on the CPU pool, more
        than one core is whole cores, rounded up (the core places sizes from 1 up as whole units; Ray reserves the
        exact cores: 4 x 2.5 cores were placed on 8 cores and reserved 10, a review found)."""
        return placed_units(accelerator_type, self.units_per_worker(accelerator_type))


def placed_units(accelerator_type: str, units: float) -> float:
    """`units` of one worker as the scheduling core places and counts them (TrainingJob.placed_units_per_worker)."""
    if accelerator_type == "cpu" and units > 1 and not float(units).is_integer():
        return float(math.ceil(units))
    return units


class TrainingJobEvent(LifecycleEvent):
    subject = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="events")

    class Meta(LifecycleEvent.Meta):
        pass


class TrainingMetric(models.Model):
    """One worker's step: loss, step time (wall), compute time (without the all-reduce wait), throughput."""

    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="metrics")
    attempt = models.PositiveIntegerField(default=0)
    step = models.IntegerField()
    worker = models.PositiveIntegerField()
    loss = models.FloatField(null=True)
    step_time_s = models.FloatField(null=True)
    compute_time_s = models.FloatField(null=True)
    tokens_per_s = models.FloatField(null=True)
    recorded_at = models.DateTimeField()

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["job", "step"])]

    def __str__(self) -> str:
        return f"job {self.job_id} step {self.step} worker {self.worker}: loss {self.loss}"


class TrainingLogLine(models.Model):
    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="log_lines")
    attempt = models.PositiveIntegerField(default=0)
    worker = models.PositiveIntegerField(null=True)
    line = models.TextField()
    recorded_at = models.DateTimeField()

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"job {self.job_id} worker {self.worker}: {self.line[:80]}"


class FaultKind(models.TextChoices):
    WORKER_CRASH = "worker_crash", "Worker crash"
    NODE_LOST = "node_lost", "Node lost"
    HANG = "hang", "Hang"
    SLOW_NODE = "slow_node", "Slow node"
    BAD_LOSS = "bad_loss", "NaN or inf loss"


class TrainingFault(models.Model):
    """A detected fault with its evidence, and how the run recovered from it."""

    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="faults")
    attempt = models.PositiveIntegerField(default=0)
    kind = models.CharField(max_length=16, choices=FaultKind.choices)
    node = models.CharField(max_length=128, blank=True, db_index=True)
    worker = models.PositiveIntegerField(null=True)
    step = models.IntegerField(default=-1)
    evidence = models.TextField()
    data = models.JSONField(default=dict, blank=True)
    advisory = models.BooleanField(default=False, help_text="reported, the run kept going (a slow node)")
    occurred_at = models.DateTimeField()
    detected_at = models.DateTimeField()
    resumed_at = models.DateTimeField(null=True, blank=True)
    recomputed_steps = models.PositiveIntegerField(default=0)
    recomputed_s = models.FloatField(default=0.0)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.kind} on {self.node or '?'} (job {self.job_id}, worker {self.worker})"

    @property
    def detection_s(self) -> float:
        return (self.detected_at - self.occurred_at).total_seconds()

    @property
    def restart_s(self) -> float | None:
        return (self.resumed_at - self.detected_at).total_seconds() if self.resumed_at else None
