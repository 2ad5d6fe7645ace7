"""Console routes. Pages are server-rendered; their actions call the REST API from the browser."""

from django.contrib.auth import views as auth_views
from django.urls import path

from frontend import deployment_views, job_views, plan_views, team_views, views
from frontend.forms import ConsoleLoginForm

app_name = "console"
urlpatterns = [
    path("login/", auth_views.LoginView.as_view(template_name="frontend/login.html",
                                                authentication_form=ConsoleLoginForm,
                                                redirect_authenticated_user=True), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", views.overview, name="overview"),
    path("cluster/", views.cluster, name="cluster"),
    path("queues/", views.queues, name="queues"),
    path("datasets/", views.datasets, name="datasets"),
    path("team/", team_views.team_settings, name="team"),
    path("jobs/", job_views.job_list, name="jobs"),
    path("jobs/new/", job_views.job_new, name="job-new"),
    path("jobs/<int:job_id>/", job_views.job_detail, name="job-detail"),
    path("plan/", plan_views.plan_page, name="plan"),
    path("deployments/", deployment_views.deployment_list_page, name="deployments"),
    path("deployments/new/", deployment_views.deployment_new, name="deployment-new"),
    path("deployments/<int:deployment_id>/", deployment_views.deployment_detail, name="deployment-detail"),
    path("deployments/<int:deployment_id>/playground/", deployment_views.deployment_playground,
         name="deployment-playground"),
]
