"""Console routes."""

from django.contrib.auth import views as auth_views
from django.urls import path

from frontend import views

app_name = "console"
urlpatterns = [
    path("login/", auth_views.LoginView.as_view(template_name="frontend/login.html",
                                                redirect_authenticated_user=True), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", views.overview, name="overview"),
    path("cluster/", views.cluster, name="cluster"),
    path("queues/", views.queues, name="queues"),
    path("datasets/", views.datasets, name="datasets"),
    path("jobs/", views.job_list, name="jobs"),
    path("jobs/<int:job_id>/", views.job_detail, name="job-detail"),
    path("deployments/", views.deployment_list_page, name="deployments"),
    path("deployments/<int:deployment_id>/", views.deployment_detail, name="deployment-detail"),
]
