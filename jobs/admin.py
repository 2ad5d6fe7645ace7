"""Django admin for training jobs (status is written by workflows, so it is read-only here)."""

from django.contrib import admin

from jobs.models import TrainingJob, TrainingJobEvent


class TrainingJobEventInline(admin.TabularInline):
    model = TrainingJobEvent
    extra = 0
    can_delete = False
    readonly_fields = ["from_state", "to_state", "reason", "actor_label", "created_at"]


@admin.register(TrainingJob)
class TrainingJobAdmin(admin.ModelAdmin):
    exclude = ["secret_envs"]  # the values never leave the platform; the API shows their names
    list_display = ["id", "name", "team", "local_queue", "state", "created_at"]
    list_filter = ["state", "team"]
    search_fields = ["name"]
    # The scheduler's decisions and what the reconciler observed are theirs: an edited placement without a worker's
    # devices made every scheduling cycle fail, for every team (QA).
    readonly_fields = ["state", "state_reason", "state_changed_at", "compute_handle", "restarts", "started_at",
                       "finished_at", "queue_position", "admitted_accelerator_type", "waits_for", "placement",
                       "attempt", "runtime_state", "events_cursor", "current_step", "last_checkpoint_step",
                       "observed_nodes", "recovery_exclude", "goodput", "parallel_plan"]
    inlines = [TrainingJobEventInline]
