"""Team scoping for viewsets: what the caller may see, and with which role they may write.

Every team-owned object is looked up through `visible_team_ids`, so another team's object is a 404
and never appears in a list; a write additionally needs `member` (or `admin`) in the object's team.
"""

from __future__ import annotations

from django.utils.functional import cached_property
from rest_framework import permissions

from controlplane.common.errors import PermissionDeniedError, ValidationFailed
from controlplane.tenancy.models import ApiToken, Role, Team
from controlplane.tenancy.selectors import has_role, is_operator, visible_team_ids


class TeamScopedMixin:
    """For viewsets over team-owned objects."""

    @cached_property
    def token(self) -> ApiToken | None:
        auth = getattr(self.request, "auth", None)
        return auth if isinstance(auth, ApiToken) else None

    @cached_property
    def team_ids(self) -> list[int]:
        return visible_team_ids(user=self.request.user, token=self.token)

    @cached_property
    def operator(self) -> bool:
        """Whether the caller acts as an operator (a staff session; a team token narrows staff too)."""
        return is_operator(user=self.request.user, token=self.token)

    def require_role(self, team_id: int, minimum: Role) -> None:
        if not has_role(user=self.request.user, team_id=team_id, minimum=minimum, token=self.token):
            raise PermissionDeniedError(f"this needs the {minimum.value} role in the team")

    def resolve_team(self, name: str | None, *, minimum: Role = Role.MEMBER) -> Team:
        """The team named in a request body (or the caller's only team), checked for the role."""
        teams = Team.objects.filter(id__in=self.team_ids)
        if not name:
            if len(self.team_ids) == 1:
                team = teams.get()
            else:
                raise ValidationFailed("name the team (you belong to several)", field="team")
        else:
            team = teams.filter(name=name).first()
            if team is None:
                raise ValidationFailed(f"no team named {name!r} among your teams", field="team")
        self.require_role(team.pk, minimum)
        return team


class IsStaffOrReadOnly(permissions.BasePermission):
    """Cluster-wide objects (accelerators, pools, cluster queues) are read by all, written by operators: staff signed in
    with a session, not with a team API token (is_operator)."""

    def has_permission(self, request, view):
        if not request.user or not request.user.is_authenticated:
            return False
        auth = getattr(request, "auth", None)
        return (request.method in permissions.SAFE_METHODS
                or is_operator(user=request.user, token=auth if isinstance(auth, ApiToken) else None))
