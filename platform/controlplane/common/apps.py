"""The `common` app: only the task delivery ledger lives in its tables (see common/deliveries.py)."""

from django.apps import AppConfig


class CommonConfig(AppConfig):
    name = "controlplane.common"
    label = "common"
    verbose_name = "Task deliveries"
