"""Training jobs (desired spec + observed status) and their state timeline."""

from __future__ import annotations

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models
from django.utils import timezone

from controlplane.common.lifecycle import LifecycleEvent
from controlplane.datasets.models import DatasetVersion
from controlplane.quotas.models import LocalQueue, PriorityClass
from controlplane.tenancy.models import SLUG_VALIDATOR, Team
from jobs.states import JOB_MACHINE, JobState


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
    dataset_version = models.ForeignKey(DatasetVersion, on_delete=models.PROTECT, null=True, blank=True,
                                        related_name="training_jobs")
    checkpoint_interval_steps = models.PositiveIntegerField(default=100)
    checkpoint_keep_last = models.PositiveIntegerField(default=3, validators=[MinValueValidator(1)])
    max_restarts = models.PositiveIntegerField(default=3)
    max_duration_seconds = models.PositiveIntegerField(null=True, blank=True)
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
    placement = models.JSONField(default=list, blank=True,
                                 help_text="one entry per worker: node and the device shares it holds")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True,
                                   blank=True, related_name="+")
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    started_at = models.DateTimeField(null=True, blank=True)
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
        """What one worker counts against quota: CPU cores on the `cpu` type, devices otherwise."""
        return self.cpus_per_worker if accelerator_type == "cpu" else float(self.devices_per_worker)


class TrainingJobEvent(LifecycleEvent):
    subject = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="events")

    class Meta(LifecycleEvent.Meta):
        pass
