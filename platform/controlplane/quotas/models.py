"""ClusterQueues, their per-accelerator quotas, LocalQueues and priority classes (Kueue's vocabulary).

- ClusterQueue: a pool of quota, cluster-wide, managed by operators; queues in the same `cohort`
  lend each other idle quota within `borrowing_limit` / `lending_limit`. Its `teams` (Kueue's namespaceSelector)
  say whose local queues may point at it; none: every team's.
- ResourceQuota: one ClusterQueue's `nominal_quota` of one accelerator type (in devices; for the
  "cpu" type, in CPU cores).
- LocalQueue: a team's entry point into a ClusterQueue; workloads are submitted to LocalQueues.
- PriorityClass: a named integer priority; higher values may preempt lower ones.
"""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone

from controlplane.cluster.models import AcceleratorType
from controlplane.tenancy.models import SLUG_VALIDATOR, Team


class PreemptionPolicy(models.TextChoices):
    """May a workload take lower-priority workloads of its own ClusterQueue (Kueue's withinClusterQueue)."""

    NEVER = "Never", "Never"
    LOWER_PRIORITY = "LowerPriority", "Lower priority"


class ReclaimPolicy(models.TextChoices):
    """May a workload take workloads of other ClusterQueues of its cohort that use more than their nominal quota
    (Kueue's reclaimWithinCohort): of any priority while its own queue reclaims quota within its nominal, only
    lower-priority ones, or none."""

    NEVER = "Never", "Never"
    LOWER_PRIORITY = "LowerPriority", "Lower priority"
    ANY = "Any", "Any priority"


class ClusterQueue(models.Model):
    name = models.SlugField(max_length=63, unique=True, validators=[SLUG_VALIDATOR])
    # Named as every other name (before 2026-11-29 "ALL" and "all" were two cohorts, and "a_b" was accepted: QA).
    cohort = models.SlugField(max_length=63, blank=True, validators=[SLUG_VALIDATOR],
                              help_text="queues in one cohort lend idle quota")
    preemption_within_queue = models.CharField(max_length=16, choices=PreemptionPolicy.choices,
                                               default=PreemptionPolicy.LOWER_PRIORITY)
    reclaim_within_cohort = models.CharField(max_length=16, choices=ReclaimPolicy.choices, default=ReclaimPolicy.ANY)
    teams = models.ManyToManyField(Team, blank=True, related_name="cluster_queues",
                                   help_text="the teams whose local queues may use it (when not open to all teams)")
    # Set when it is created or its teams are changed (named none: open). Its own field, not "names no teams": a
    # queue for one team whose team is deleted must not open to every team (found by review, 2026-11-29).
    open_to_all_teams = models.BooleanField(default=True, help_text="every team's local queues may use it; when "
                                                                     "false, only those of its teams")
    description = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def quotas_needing_cohort(self, quotas=None) -> list[ResourceQuota]:
        """Of `quotas` (by default its stored ones), those that set a borrowing or lending limit while this queue is
        in no cohort: as Kueue, such a limit needs a cohort (QA, 2026-11-29: accepted, and silently did nothing; a
        queue of nominal 0 + borrowing 8 then refused every job as "no quota"). The one rule of the API's services
        (a PATCH that leaves the cohort, quotas sent in no cohort) and of the Django admin (ResourceQuota.clean)."""
        if self.cohort:
            return []
        if quotas is None:
            quotas = self.quotas.select_related("accelerator_type") if self.pk is not None else []
        return [quota for quota in quotas if quota.limits_set()]


QUOTA_LIMITS = ("borrowing_limit", "lending_limit")


class ResourceQuota(models.Model):
    cluster_queue = models.ForeignKey(ClusterQueue, on_delete=models.CASCADE, related_name="quotas")
    accelerator_type = models.ForeignKey(AcceleratorType, on_delete=models.PROTECT, related_name="quotas")
    nominal_quota = models.FloatField(validators=[MinValueValidator(0)])
    borrowing_limit = models.FloatField(null=True, blank=True, validators=[MinValueValidator(0)],
                                        help_text="most it may borrow from the cohort; empty = unlimited")
    lending_limit = models.FloatField(null=True, blank=True, validators=[MinValueValidator(0)],
                                      help_text="most of its nominal quota it lends; empty = all of it")

    class Meta:
        ordering = ["cluster_queue__name", "accelerator_type__slug"]
        constraints = [
            models.UniqueConstraint(fields=["cluster_queue", "accelerator_type"], name="quota_unique_per_type"),
        ]

    def __str__(self) -> str:
        return f"{self.cluster_queue}: {self.nominal_quota} x {self.accelerator_type}"

    def limits_set(self) -> list[str]:
        """The limits (borrowing_limit, lending_limit) this quota sets."""
        return [limit for limit in QUOTA_LIMITS if getattr(self, limit) is not None]

    def clean(self):
        errors: dict[str, list[ValidationError]] = {}
        if self.lending_limit is not None and self.nominal_quota is not None \
                and self.lending_limit > self.nominal_quota:
            errors["lending_limit"] = [ValidationError("cannot lend more than the nominal quota")]
        # Its queue as it is about to be saved (the services set it, the admin's inline gives the queue's form
        # instance, with the cohort just entered): a limit needs a cohort.
        try:
            queue = self.cluster_queue
        except ClusterQueue.DoesNotExist:
            queue = None
        if queue is not None and queue.quotas_needing_cohort([self]):
            for limit in self.limits_set():
                errors.setdefault(limit, []).append(ValidationError(
                    f"a {limit} needs a cohort to borrow from or lend to, and cluster queue {queue.name or '(new)'} is "
                    f"in none (set cohort, or leave {limit} out)", code="needs_cohort"))
        if errors:
            raise ValidationError(errors)


class LocalQueue(models.Model):
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="local_queues")
    name = models.SlugField(max_length=63, validators=[SLUG_VALIDATOR])
    cluster_queue = models.ForeignKey(ClusterQueue, on_delete=models.PROTECT, related_name="local_queues")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["team__name", "name"]
        constraints = [models.UniqueConstraint(fields=["team", "name"], name="local_queue_unique_per_team")]

    def __str__(self) -> str:
        return f"{self.team}/{self.name}"


class PriorityClass(models.Model):
    name = models.SlugField(max_length=63, unique=True, validators=[SLUG_VALIDATOR])
    # A 32-bit integer, as Kueue's WorkloadPriorityClass and as the PostgreSQL column holds: before 2026-11-29 SQLite
    # stored 2**62 (201) where PostgreSQL refused it (QA).
    value = models.IntegerField(validators=[MinValueValidator(-2**31), MaxValueValidator(2**31 - 1)])
    description = models.TextField(blank=True)
    preemptible = models.BooleanField(default=True)

    class Meta:
        ordering = ["-value", "name"]
        verbose_name_plural = "priority classes"

    def __str__(self) -> str:
        return f"{self.name} ({self.value})"
