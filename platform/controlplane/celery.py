"""The Celery application: lifecycle workflows and the beat reconcilers (DESIGN.md, layer 1)."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

app = Celery("fleetyard")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
