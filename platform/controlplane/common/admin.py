"""Django admin for operators: the task delivery ledger, dead letters first, and the task outbox (read-only)."""

from django.contrib import admin

from controlplane.common.models import TaskDelivery, TaskOutbox


class _ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(TaskDelivery)
class TaskDeliveryAdmin(_ReadOnlyAdmin):
    list_display = ["last_delivered_at", "task_name", "state", "deliveries", "worker_losses", "worker", "reason"]
    list_filter = ["state", "task_name"]
    search_fields = ["task_id", "task_name", "reason"]
    readonly_fields = [field.name for field in TaskDelivery._meta.fields]


@admin.register(TaskOutbox)
class TaskOutboxAdmin(_ReadOnlyAdmin):
    list_display = ["created_at", "task_name", "task_id", "sends", "sent_at"]
    list_filter = ["task_name"]
    search_fields = ["task_id", "task_name"]
    readonly_fields = [field.name for field in TaskOutbox._meta.fields]
