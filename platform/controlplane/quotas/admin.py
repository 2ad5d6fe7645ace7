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


@admin.register(LocalQueue)
class LocalQueueAdmin(AuditedAdmin):
    list_display = ["name", "team", "cluster_queue"]
    list_filter = ["team", "cluster_queue"]


@admin.register(PriorityClass)
class PriorityClassAdmin(AuditedAdmin):
    list_display = ["name", "value", "preemptible"]
