"""Console page for team settings: members and roles, API tokens (created, shown once, revoked)."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.shortcuts import render

from frontend.views import _base_context


@login_required
def team_settings(request):
    _, context = _base_context(request, "team")
    return render(request, "frontend/team.html", context)
