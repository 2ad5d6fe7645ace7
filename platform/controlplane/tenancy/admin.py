"""Django admin for operators: teams, memberships, tokens (read-mostly) and the audit log (read-only)."""

from django.contrib import admin
from django.db import models, transaction

from controlplane.tenancy.models import ApiToken, AuditEvent, Membership, Team
from controlplane.tenancy.services import audit_record


def _plain(value):
    """A form value as the audit record's JSON holds it."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, models.Model):
        return str(value)
    if isinstance(value, list | tuple | set | frozenset | models.QuerySet):
        return sorted(str(item) for item in value)
    return str(value)


class AuditedAdmin(admin.ModelAdmin):
    """Operators' writes in the admin append an audit event, as the API's do: `<model>.admin_create`,
    `.admin_change` (the fields changed, with their new values) and `.admin_delete`, and one per inline row
    (QA, 2026-11-29: quotas, priority classes, cordons, memberships and tokens changed in the admin left no audit
    event, though the README has one for every write). Cluster-wide objects are recorded with no team, a team's
    objects under their team (a deleted team under none, so that the record outlives it)."""

    def _audit(self, request, obj, verb: str, data: dict) -> None:
        if isinstance(obj, Team):
            team = None if verb == "delete" else obj.pk
        else:
            team = getattr(obj, "team_id", None)
        audit_record(actor=request.user, team=team, action=f"{obj._meta.model_name}.admin_{verb}", target=obj,
                     data=data)

    def save_model(self, request, obj, form, change):
        with transaction.atomic():
            super().save_model(request, obj, form, change)
            fields = {name: _plain(form.cleaned_data.get(name)) for name in form.changed_data}
            if fields or not change:  # (a save that changed only inline rows records those rows)
                self._audit(request, obj, "change" if change else "create", {"fields": fields})

    def save_formset(self, request, form, formset, change):
        with transaction.atomic():
            for obj in [inline.instance for inline in formset.deleted_forms if inline.instance.pk is not None]:
                self._audit(request, obj, "delete", {"object": str(obj), "of": str(form.instance)})
            super().save_formset(request, form, formset, change)
            for obj in formset.new_objects:
                self._audit(request, obj, "create", {"object": str(obj), "of": str(form.instance)})
            for obj, names in formset.changed_objects:
                fields = {name: _plain(getattr(obj, name, None)) for name in names}
                self._audit(request, obj, "change", {"fields": fields, "of": str(form.instance)})

    def delete_model(self, request, obj):
        with transaction.atomic():
            self._audit(request, obj, "delete", {"object": str(obj)})
            super().delete_model(request, obj)

    def delete_queryset(self, request, queryset):
        with transaction.atomic():
            for obj in queryset:
                self._audit(request, obj, "delete", {"object": str(obj)})
            super().delete_queryset(request, queryset)


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ["user"]


@admin.register(Team)
class TeamAdmin(AuditedAdmin):
    list_display = ["name", "display_name", "created_at"]
    search_fields = ["name", "display_name"]
    inlines = [MembershipInline]


@admin.register(Membership)
class MembershipAdmin(AuditedAdmin):
    list_display = ["team", "user", "role", "created_at"]
    list_filter = ["role", "team"]


@admin.register(ApiToken)
class ApiTokenAdmin(AuditedAdmin):
    list_display = ["name", "prefix", "team", "user", "created_at", "expires_at", "revoked_at", "last_used_at"]
    list_filter = ["team"]
    readonly_fields = ["prefix", "token_hash", "created_at", "last_used_at"]


@admin.register(AuditEvent)
class AuditEventAdmin(admin.ModelAdmin):
    # team_name: still there once the team is deleted (its events are kept under no team)
    list_display = ["created_at", "actor_label", "action", "target_type", "target_id", "team_name"]
    list_filter = ["action", "team"]
    search_fields = ["actor_label", "action", "target_id", "team_name"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
