"""Django admin for operators: the task delivery ledger, dead letters first (read-only)."""

from django.contrib import admin

from controlplane.common.models import TaskDelivery


@admin.register(TaskDelivery)
class TaskDeliveryAdmin(admin.ModelAdmin):
    list_display = ["last_delivered_at", "task_name", "state", "deliveries", "worker_losses", "worker", "reason"]
    list_filter = ["state", "task_name"]
    search_fields = ["task_id", "task_name", "reason"]
    readonly_fields = [field.name for field in TaskDelivery._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
