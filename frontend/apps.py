from django.apps import AppConfig


class FrontendConfig(AppConfig):
    name = "frontend"
    label = "frontend"
    verbose_name = "Console"
