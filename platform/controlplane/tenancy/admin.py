"""Django admin for operators: teams, memberships, tokens (read-mostly) and the audit log (read-only)."""

from django.contrib import admin

from controlplane.tenancy.models import ApiToken, AuditEvent, Membership, Team


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ["user"]


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    list_display = ["name", "display_name", "created_at"]
    search_fields = ["name", "display_name"]
    inlines = [MembershipInline]


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ["team", "user", "role", "created_at"]
    list_filter = ["role", "team"]


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ["name", "prefix", "team", "user", "created_at", "expires_at", "revoked_at", "last_used_at"]
    list_filter = ["team"]
    readonly_fields = ["prefix", "token_hash", "created_at", "last_used_at"]


@admin.register(AuditEvent)
class AuditEventAdmin(admin.ModelAdmin):
    list_display = ["created_at", "actor_label", "action", "target_type", "target_id", "team"]
    list_filter = ["action", "team"]
    search_fields = ["actor_label", "action", "target_id"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
