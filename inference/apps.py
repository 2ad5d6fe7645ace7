from django.apps import AppConfig


class InferenceConfig(AppConfig):
    name = "inference"
    label = "inference"
    verbose_name = "Deployments"
