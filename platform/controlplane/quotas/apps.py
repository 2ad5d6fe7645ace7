from django.apps import AppConfig


class QuotasConfig(AppConfig):
    name = "controlplane.quotas"
    label = "quotas"
    verbose_name = "Queues and quotas"
