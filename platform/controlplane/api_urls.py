"""The REST API's routes under /api/v1/ (plural kebab-case, as NetBox does)."""

from __future__ import annotations

from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView
from rest_framework.routers import DefaultRouter

from controlplane.cluster.api.views import AcceleratorTypeViewSet, NodePoolViewSet, NodeViewSet, PlanView
from controlplane.datasets.api.views import DatasetViewSet
from controlplane.quotas.api.views import ClusterQueueViewSet, LocalQueueViewSet, PriorityClassViewSet
from controlplane.specs.api.views import SpecApplyView
from controlplane.tenancy.api.views import ApiTokenViewSet, AuditEventViewSet, MembershipViewSet, MeView, TeamViewSet
from inference.api.views import DeploymentViewSet
from jobs.api.views import TrainingJobViewSet

router = DefaultRouter()
router.register("teams", TeamViewSet, basename="team")
router.register("memberships", MembershipViewSet, basename="membership")
router.register("api-tokens", ApiTokenViewSet, basename="api-token")
router.register("audit-events", AuditEventViewSet, basename="audit-event")
router.register("accelerator-types", AcceleratorTypeViewSet, basename="accelerator-type")
router.register("node-pools", NodePoolViewSet, basename="node-pool")
router.register("nodes", NodeViewSet, basename="node")
router.register("cluster-queues", ClusterQueueViewSet, basename="cluster-queue")
router.register("local-queues", LocalQueueViewSet, basename="local-queue")
router.register("priority-classes", PriorityClassViewSet, basename="priority-class")
router.register("datasets", DatasetViewSet, basename="dataset")
router.register("training-jobs", TrainingJobViewSet, basename="training-job")
router.register("deployments", DeploymentViewSet, basename="deployment")

urlpatterns = [
    path("me/", MeView.as_view(), name="me"),
    path("plans/", PlanView.as_view(), name="plan"),
    path("specs/apply/", SpecApplyView.as_view(), name="spec-apply"),
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="swagger-ui"),
    path("redoc/", SpectacularRedocView.as_view(url_name="schema"), name="redoc"),
    path("", include(router.urls)),
]
