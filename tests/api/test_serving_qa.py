"""QA of the serving workflow against the in-memory backend (SLA measurement, rollouts the backend cannot finish):
each test failed on the code before its fix."""

from __future__ import annotations

from inference.models import Deployment
from tests.api.test_deployment_lifecycle import backend, create, log_requests, sync  # noqa: F401


def test_a_p95_over_one_answer_among_refused_requests_is_no_sla_breach(api, backend, model_dir):  # noqa: F811
    """19 prompts refused as too long (400) and one slow answer marked the deployment DEGRADED with "TTFT p95 900 ms
    > SLA 500 ms over 20 requests" and halved its autoscaling target: the p95 was one measurement."""
    deployment = Deployment.objects.get(pk=create(api("alpha", "member"), model_dir)["id"])
    log_requests(deployment, 19, ttft_ms=0.0, status=400)
    log_requests(deployment, 1, ttft_ms=900.0)
    deployment = sync(deployment.pk, backend)
    assert deployment.state == "SERVING", deployment.state_reason
    assert deployment.autoscaling["target_ongoing_requests"] == 4 and deployment.observed["measured"] == 1
    log_requests(deployment, 20, ttft_ms=900.0)  # enough answers to tell: a breach, over the answered ones
    deployment = sync(deployment.pk, backend)
    assert deployment.state == "DEGRADED"
    assert deployment.state_reason == "SLA breach: TTFT p95 900 ms > SLA 500 ms over 21 requests in the last 60 s"
