"""Django admin for queues, quotas and priority classes."""

from django import forms
from django.contrib import admin
from django.forms.models import BaseInlineFormSet

from controlplane.common.errors import ConflictError, ValidationFailed
from controlplane.quotas import services
from controlplane.quotas.models import ClusterQueue, LocalQueue, PriorityClass, ResourceQuota
from controlplane.tenancy.admin import AuditedAdmin


class ResourceQuotaFormSet(BaseInlineFormSet):
    """Each row's own clean() refuses a borrowing or lending limit while the queue (as its form now has it) is in no
    cohort, under that limit (ClusterQueue.quotas_needing_cohort, the API's rule); this says so once above the rows,
    naming the cohort (QA, 2026-12-07: the admin cleared a cohort under such limits, or set one in no cohort, both
    refused by the API)."""

    def clean(self):
        super().clean()
        rows = [form.instance for form in self.forms
                if not self._should_delete_form(form) and (form.instance.pk is not None or form.has_changed())]
        limited = self.instance.quotas_needing_cohort(rows)
        if limited:
            types = sorted(str(quota.accelerator_type) if quota.accelerator_type_id else "?" for quota in limited)
            raise forms.ValidationError(
                f"cluster queue {self.instance.name or '(new)'} is in no cohort, and its quotas for {', '.join(types)} "
                "set a borrowing or lending limit, which needs one: set cohort, or clear those limits",
                code="needs_cohort")


class ResourceQuotaInline(admin.TabularInline):
    model = ResourceQuota
    formset = ResourceQuotaFormSet
    extra = 0


class ClusterQueueAdminForm(forms.ModelForm):
    def clean_teams(self):
        """As the API's PATCH: teams that leave out a team whose local queues use the queue are refused (QA,
        2026-12-07: the admin stranded them on a queue closed to their team)."""
        teams = self.cleaned_data["teams"]
        if self.instance.pk is not None and teams:
            try:
                services.cluster_queue_teams_check(queue=self.instance, teams=teams)
            except ConflictError as exc:
                raise forms.ValidationError(exc.message, code="conflict") from exc
        return teams


@admin.register(ClusterQueue)
class ClusterQueueAdmin(AuditedAdmin):
    form = ClusterQueueAdminForm
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


class LocalQueueAdminForm(forms.ModelForm):
    def clean(self):
        """As the API's create: a cluster queue closed to the team is refused (QA, 2026-12-07: the admin pointed a
        team's queue at any cluster queue, and so let it use that queue's quota)."""
        cleaned = super().clean()
        team, cluster_queue = cleaned.get("team"), cleaned.get("cluster_queue")
        if team is not None and cluster_queue is not None:
            try:
                services.local_queue_target_check(team=team, cluster_queue=cluster_queue)
            except ValidationFailed as exc:
                self.add_error("cluster_queue", exc.message)
        return cleaned


@admin.register(LocalQueue)
class LocalQueueAdmin(AuditedAdmin):
    form = LocalQueueAdminForm
    list_display = ["name", "team", "cluster_queue"]
    list_filter = ["team", "cluster_queue"]


@admin.register(PriorityClass)
class PriorityClassAdmin(AuditedAdmin):
    list_display = ["name", "value", "preemptible"]
