"""Django admin for queues, quotas and priority classes."""

from django.contrib import admin

from controlplane.quotas.models import ClusterQueue, LocalQueue, PriorityClass, ResourceQuota
from controlplane.tenancy.admin import AuditedAdmin


class ResourceQuotaInline(admin.TabularInline):
    model = ResourceQuota
    extra = 0


@admin.register(ClusterQueue)
class ClusterQueueAdmin(AuditedAdmin):
    list_display = ["name", "cohort", "preemption_within_queue", "reclaim_within_cohort", "open_to_all_teams"]
    filter_horizontal = ["teams"]
    inlines = [ResourceQuotaInline]
    # Derived from the teams, as the API's services set it (quotas.services.cluster_queue_create/_update): an editable
    # box left ticked kept a queue given teams here open to every team (review, 2026-11-29).
    readonly_fields = ["open_to_all_teams"]

    def save_related(self, request, form, formsets, change):
        super().save_related(request, form, formsets, change)
        if change and "teams" not in form.changed_data:
            return
        queue = form.instance
        open_now = not queue.teams.exists()
        if queue.open_to_all_teams != open_now:
            queue.open_to_all_teams = open_now
            ClusterQueue.objects.filter(pk=queue.pk).update(open_to_all_teams=open_now)


@admin.register(LocalQueue)
class LocalQueueAdmin(AuditedAdmin):
    list_display = ["name", "team", "cluster_queue"]
    list_filter = ["team", "cluster_queue"]


@admin.register(PriorityClass)
class PriorityClassAdmin(AuditedAdmin):
    list_display = ["name", "value", "preemptible"]
