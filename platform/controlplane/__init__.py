"""Fleetyard control plane: the Django project and the platform core's apps.

This package lives under the `platform/` source root (never a package itself: it would shadow the
standard library's `platform`). Loading Celery here makes `@shared_task` bind to our app.
"""

from controlplane.celery import app as celery_app

__all__ = ["celery_app"]
