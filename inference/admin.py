"""Django admin for deployments (status is written by workflows, so it is read-only here)."""

from django.contrib import admin

from inference.models import Deployment, DeploymentEvent, DeploymentRevision


class DeploymentRevisionInline(admin.TabularInline):
    model = DeploymentRevision
    extra = 0
    can_delete = False
    readonly_fields = ["number", "spec", "reason", "created_at"]


class DeploymentEventInline(admin.TabularInline):
    model = DeploymentEvent
    extra = 0
    can_delete = False
    readonly_fields = ["from_state", "to_state", "reason", "actor_label", "created_at"]


@admin.register(Deployment)
class DeploymentAdmin(admin.ModelAdmin):
    list_display = ["id", "name", "team", "state", "replicas_min", "replicas_max", "created_at"]
    list_filter = ["state", "team"]
    # Where it was placed, what the scheduler holds or allows for it and what the sync observed are theirs (as a
    # training job's, jobs/admin.py).
    readonly_fields = ["state", "state_reason", "state_changed_at", "compute_handle", "replicas_ready",
                       "finished_at", "replicas_target", "replicas_limit", "capacity_held", "applied_revision",
                       "accelerator_type", "pool", "model_dir", "autoscaling", "observed", "revision"]
    inlines = [DeploymentRevisionInline, DeploymentEventInline]
