from django.apps import AppConfig


class ClusterConfig(AppConfig):
    name = "controlplane.cluster"
    label = "cluster"
    verbose_name = "Cluster inventory"
