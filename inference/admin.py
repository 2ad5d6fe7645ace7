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
    readonly_fields = ["state", "state_reason", "state_changed_at", "compute_handle", "replicas_ready",
                       "finished_at"]
    inlines = [DeploymentRevisionInline, DeploymentEventInline]
