"""Console page for team settings: members and roles, API tokens (created, shown once, revoked).

Every change is made by the browser through /api/v1/memberships/ and /api/v1/api-tokens/, so the page
offers exactly what the API allows: admins manage members; everyone may create tokens for themselves;
admins also see and may revoke every token of their team.
"""

from __future__ import annotations

from collections import defaultdict

from django.contrib.auth.decorators import login_required
from django.shortcuts import render

from controlplane.tenancy.models import Role
from controlplane.tenancy.selectors import api_tokens_visible_latest, membership_list, roles_by_team
from frontend.views import _base_context

TOKENS_SHOWN = 50  # per team, newest first; revoked tokens stay listed (the API's paged list has them all)


@login_required
def team_settings(request):
    team_ids, context = _base_context(request, "team")
    roles = roles_by_team(user=request.user, team_ids=team_ids)
    members = defaultdict(list)
    for membership in membership_list(team_ids=team_ids).order_by("user__username"):
        members[membership.team_id].append(membership)
    tokens = defaultdict(list)
    latest, token_totals = api_tokens_visible_latest(user=request.user, team_ids=team_ids, limit=TOKENS_SHOWN)
    for token in latest:
        tokens[token.team_id].append(token)
    teams = list(context["teams"])
    for team in teams:
        team.my_role = roles.get(team.pk)
        team.is_admin = team.my_role == Role.ADMIN
        team.member_rows = members.get(team.pk, [])
        team.admin_count = sum(1 for m in team.member_rows if m.role == Role.ADMIN)
        team.token_rows = tokens.get(team.pk, [])
        team.token_total = token_totals.get(team.pk, 0)
    context.update({"team_rows": teams, "roles": Role.choices})
    return render(request, "frontend/team.html", context)
