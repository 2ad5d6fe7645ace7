"""The Celery application: lifecycle workflows and the beat reconcilers (DESIGN.md, layer 1)."""

from __future__ import annotations

import os
from pathlib import Path

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

app = Celery("fleetyard")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


def ensure_broker_folders(options: dict) -> None:
    """The embedded file-system broker needs its folders before a worker or producer touches them."""
    for key in ("data_folder_in", "data_folder_out", "processed_folder", "control_folder"):
        if options.get(key):
            Path(options[key]).mkdir(parents=True, exist_ok=True)


@app.on_after_configure.connect
def _prepare_broker(sender, **kwargs):
    if str(sender.conf.broker_url).startswith("filesystem"):
        ensure_broker_folders(sender.conf.broker_transport_options or {})
