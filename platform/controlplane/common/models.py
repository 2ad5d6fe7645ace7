"""The task delivery ledger: one row per lifecycle task message (task id and retry number) that a worker
took and that is still running, had trouble (redelivered, failed) or was dead-lettered.

A message that succeeded on its first delivery leaves no row (the beat tasks alone send tens of
thousands a day); the object the task works on (job, deployment, node) stays the truth of the operation.
"""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class DeliveryState(models.TextChoices):
    RUNNING = "RUNNING", "running (or its worker was lost)"
    DONE = "DONE", "done after a redelivery"
    RETRIED = "RETRIED", "retried after a redelivery"
    FAILED = "FAILED", "failed"
    DEAD_LETTERED = "DEAD_LETTERED", "dead-lettered"


class TaskDelivery(models.Model):
    task_id = models.CharField(max_length=255)
    attempt = models.PositiveIntegerField(default=0, help_text="Celery's retry number of this message.")
    task_name = models.CharField(max_length=200, db_index=True)
    args = models.JSONField(default=list, blank=True)
    kwargs = models.JSONField(default=dict, blank=True)
    state = models.CharField(max_length=16, choices=DeliveryState.choices, default=DeliveryState.RUNNING,
                             db_index=True)
    deliveries = models.PositiveIntegerField(default=0, help_text="Times a worker started this message.")
    worker_losses = models.PositiveIntegerField(
        default=0, help_text="Deliveries in a row that ended without the task finishing (the worker died).")
    worker = models.CharField(max_length=255, blank=True, help_text="The worker of the latest delivery.")
    reason = models.TextField(blank=True)
    first_delivered_at = models.DateTimeField(default=timezone.now)
    last_delivered_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["task_id", "attempt"], name="task_delivery_once")]
        ordering = ["-last_delivered_at", "-id"]
        verbose_name_plural = "task deliveries"

    def __str__(self) -> str:
        return f"{self.task_name}[{self.task_id}#{self.attempt}] {self.state} x{self.deliveries}"


class TaskOutbox(models.Model):
    """A task message a service sent and no worker has taken yet (transactional outbox, issue 8 C1/C2).

    Written in the sender's transaction; the delivery ledger deletes it when a worker takes the message; the beat's
    `common.resend_undelivered` sends again, with the same task id, what no worker took within
    FLEETYARD_OUTBOX_RESEND_SECONDS: a message the broker lost (Redis hands a message to BRPOP before the worker
    records it as unacknowledged, so a worker killed in between loses it) or one sent while the broker was down.
    """

    task_id = models.CharField(max_length=255, unique=True)
    task_name = models.CharField(max_length=200)
    args = models.JSONField(default=list, blank=True)
    kwargs = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    sent_at = models.DateTimeField(null=True, blank=True, help_text="The latest send to the broker.")
    sends = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["created_at", "id"]
        verbose_name_plural = "task outbox"

    def __str__(self) -> str:
        return f"{self.task_name}[{self.task_id}] sent x{self.sends}"
