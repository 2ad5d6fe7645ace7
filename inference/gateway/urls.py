"""OpenAI-compatible routes, mounted at /v1/ (no trailing slashes, as OpenAI clients call them)."""

from __future__ import annotations

from django.urls import path, re_path

from inference.gateway import views

app_name = "gateway"

urlpatterns = [
    path("models", views.ModelsView.as_view(), name="models"),
    path("models/<str:model>", views.ModelView.as_view(), name="model"),
    path("completions", views.CompletionsView.as_view(), name="completions"),
    path("chat/completions", views.ChatCompletionsView.as_view(), name="chat-completions"),
    # last: any other URL under /v1/ (`/v1/completions/`, `/v1/embeddings`) is an OpenAI-shaped 404, not an HTML page
    re_path(r"^(?P<rest>.*)$", views.UnknownEndpointView.as_view(), name="unknown"),
]
