"""Top-level routes: the console, the REST API, Django admin and a health check."""

from __future__ import annotations

from django.contrib import admin
from django.db import connection
from django.http import JsonResponse
from django.urls import include, path

from frontend.forms import AdminLoginForm

admin.site.login_form = AdminLoginForm  # the admin's sign-in locks out repeated failures like the console's


def healthz(request):
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return JsonResponse({"status": "ok"})


handler404 = "controlplane.common.api.not_found"

urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("admin/", admin.site.urls),
    path("api/v1/", include("controlplane.api_urls")),
    path("v1/", include("inference.gateway.urls")),
    path("", include("frontend.urls")),
]
