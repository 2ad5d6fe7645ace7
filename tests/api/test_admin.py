"""Django admin works for operators on every registered model, and is closed to everyone else."""

from __future__ import annotations

import pytest
from django.contrib import admin
from django.test import Client
from django.urls import reverse

from tests.api.test_isolation import beta_objects  # noqa: F401 - fixture: one of every team object


@pytest.fixture
def operator_client(world):
    ops = world["ops"]
    ops.is_superuser = True
    ops.save()
    client = Client()
    client.force_login(ops)
    return client


def test_every_model_changelist_and_change_page_renders(operator_client, beta_objects):  # noqa: F811
    for model in admin.site._registry:
        meta = model._meta
        url = reverse(f"admin:{meta.app_label}_{meta.model_name}_changelist")
        assert operator_client.get(url).status_code == 200, url
        first = model.objects.first()
        if first is not None:
            url = reverse(f"admin:{meta.app_label}_{meta.model_name}_change", args=[first.pk])
            assert operator_client.get(url).status_code == 200, url


def test_admin_is_closed_to_team_members(world):
    client = Client()
    client.force_login(world["alpha"]["admin"])
    response = client.get(reverse("admin:jobs_trainingjob_changelist"))
    assert response.status_code == 302 and "/admin/login/" in response["Location"]
