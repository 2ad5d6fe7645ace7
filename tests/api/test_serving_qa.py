"""QA of the serving workflow against the in-memory backend (SLA measurement, rollouts the backend cannot finish):
each test failed on the code before its fix."""

from __future__ import annotations

from contextlib import contextmanager

from inference.models import Deployment
from tests.api.test_deployment_lifecycle import backend, create, log_requests, sync  # noqa: F401


@contextmanager
def deploys_failing(memory_backend):
    """Every deploy meanwhile ends as Serve's DEPLOY_FAILED: the service exists, unhealthy, running no revision."""
    deploy = memory_backend.deploy_service

    def failing(spec):
        status = deploy(spec)
        memory_backend.set_service_status(spec.handle, state="unhealthy", revision=0,
                                          message="DEPLOY_FAILED: the replica's constructor raised")
        return status

    memory_backend.deploy_service = failing
    try:
        yield
    finally:
        memory_backend.deploy_service = deploy


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


def test_an_update_the_service_cannot_roll_out_degrades_with_the_reason_and_recovers(api, backend,  # noqa: F811
                                                                                    model_dir):
    """Serve's DEPLOY_FAILED (the new revision's replicas cannot start) left the deployment UPDATING for good, its
    reason still "rolling update to revision 2", never saying the rollout failed."""
    from tests.api.test_deployment_lifecycle import patch

    client = api("alpha", "member")
    deployment = Deployment.objects.get(pk=create(client, model_dir)["id"])
    with deploys_failing(backend):
        patch(client, deployment.pk, {"engine": {"slots": 8}})
        deployment = sync(deployment.pk, backend)
    assert deployment.state == "DEGRADED"
    assert deployment.state_reason == ("revision 2 cannot be applied: service unhealthy: DEPLOY_FAILED: the replica's "
                                       "constructor raised; still running revision 1")
    assert sync(deployment.pk, backend).state_reason == deployment.state_reason  # kept on the next pass
    backend.set_service_status(deployment.compute_handle, state="running", revision=2, message="")
    deployment = sync(deployment.pk, backend)
    assert deployment.state == "SERVING" and deployment.applied_revision == 2


def test_serve_scales_with_the_delays_the_autoscaling_decision_shows(api, backend, model_dir):  # noqa: F811
    """The API showed the decision's delays (scale up after 5 s for a 500 ms SLA, down after 300 s) while every Serve
    application ran a fixed 3 s / 30 s."""
    import dataclasses

    from inference.runtime.serve_app import build_application

    deployment = Deployment.objects.get(pk=create(api("alpha", "member"), model_dir)["id"])
    shown = deployment.autoscaling
    assert (shown["upscale_delay_s"], shown["downscale_delay_s"]) == (5.0, 300.0)
    spec = backend.services[deployment.compute_handle]
    assert (spec.upscale_delay_s, spec.downscale_delay_s) == (5.0, 300.0)
    config = build_application(dataclasses.asdict(spec))._bound_deployment._deployment_config.autoscaling_config
    assert (config.upscale_delay_s, config.downscale_delay_s) == (5.0, 300.0)
    assert (config.min_replicas, config.max_replicas, config.target_ongoing_requests) == (1, 3, 4.0)


def test_a_first_deploy_the_service_reports_unhealthy_fails_and_gives_back_its_capacity(api, backend,  # noqa: F811
                                                                                       model_dir):
    """A service that never served and that Serve marks DEPLOY_FAILED (its replicas cannot start) left the deployment
    DEPLOYING for good, holding its quota and devices: only a deploy call that raised counted towards the tries that
    end in FAILED."""
    from inference.workflows import DEPLOY_TRIES

    with deploys_failing(backend):
        deployment = Deployment.objects.get(pk=create(api("alpha", "member"), model_dir)["id"])
    assert deployment.state == "DEPLOYING", deployment.state_reason
    for _ in range(DEPLOY_TRIES - 2):
        deployment = sync(deployment.pk, backend)
        assert deployment.state == "DEPLOYING" and "DEPLOY_FAILED" in deployment.state_reason
    deployment = sync(deployment.pk, backend)
    assert deployment.state == "FAILED", deployment.state_reason
    assert deployment.state_reason.startswith("cannot deploy: revision 1 does not start: service unhealthy: "
                                              "DEPLOY_FAILED"), deployment.state_reason
    assert deployment.capacity_held == [] and deployment.replicas_limit is None
    assert sync(deployment.pk, backend).state == "FAILED"  # (and the orphan sweep removes its service)


def test_a_degraded_deployment_with_no_traffic_left_is_not_said_to_meet_its_sla(api, backend, model_dir):  # noqa: F811
    """A deployment DEGRADED by an SLA breach went back to SERVING with "healthy again: ..., SLA met" once its
    window held no requests at all: nothing was measured (QA). It still goes back (nothing says it is unhealthy), and
    the reason says how few answers there were."""
    from datetime import timedelta

    from django.utils import timezone

    from inference.models import InferenceRequest

    deployment = Deployment.objects.get(pk=create(api("alpha", "member"), model_dir)["id"])
    log_requests(deployment, 40, ttft_ms=812.0)
    assert sync(deployment.pk, backend).state == "DEGRADED"
    InferenceRequest.objects.filter(deployment=deployment).update(created_at=timezone.now() - timedelta(minutes=5))
    deployment = sync(deployment.pk, backend)
    assert deployment.state == "SERVING", deployment.state_reason
    assert "SLA met" not in deployment.state_reason
    assert "SLA not measured: 0 answered request(s) in the last 60 s, fewer than 20" in deployment.state_reason


def test_raising_replicas_min_above_replicas_max_names_replicas_min(api, backend, model_dir):  # noqa: F811
    """`PATCH {"replicas_min": 3}` on a deployment of 1-2 replicas was a 400 on replicas_max ("must be at least
    replicas_min (3)"), a field the client did not send; the 400 names replicas_min and the bound it must stay under."""
    from tests.api.test_deployment_lifecycle import patch

    client = api("alpha", "member")
    created = create(client, model_dir, replicas_min=1, replicas_max=2)
    body = patch(client, created["id"], {"replicas_min": 3}, expect=400)
    assert "replicas_max" not in body, body
    assert "must be at most replicas_max (2)" in str(body["replicas_min"]), body
    both = patch(client, created["id"], {"replicas_min": 3, "replicas_max": 2}, expect=400)  # both sent: the max
    assert "must be at least replicas_min (3)" in str(both["replicas_max"]), both
    lower = patch(client, created["id"], {"replicas_max": 0}, expect=400)
    assert "replicas_max" in lower, lower
    deployment = Deployment.objects.get(pk=created["id"])
    assert (deployment.replicas_min, deployment.replicas_max, deployment.revision) == (1, 2, 1)
    assert patch(client, created["id"], {"replicas_min": 2})["spec"]["replicas_min"] == 2  # within the bound: fine


def test_timed_out_requests_degrade_the_deployment_and_lower_its_target(api, backend, model_dir):  # noqa: F811
    """QA: requests that timed out (504) or failed (5xx) were left out of the autoscaling window: a deployment whose
    replicas timed out under load stayed SERVING and its target unchanged, as if it were idle. The gateway's own
    "not serving yet" 503s (sent before the deployment serves) are not counted."""
    from inference.models import InferenceRequest

    deployment = Deployment.objects.get(pk=create(api("alpha", "member"), model_dir)["id"])
    log_requests(deployment, 20, ttft_ms=50.0)
    log_requests(deployment, 20, ttft_ms=0.0, status=504)
    deployment = sync(deployment.pk, backend)
    assert deployment.state == "DEGRADED", deployment.state_reason
    assert deployment.state_reason == ("SLA breach: 20 of 40 requests not served (20 timed out (504)) in the last "
                                       "60 s; errors and timeouts count as SLA misses")
    assert deployment.observed["timeouts"] == 20 and deployment.autoscaling["target_ongoing_requests"] == 2
    assert deployment.autoscaling["max_replicas"] == 3
    InferenceRequest.objects.filter(deployment=deployment).delete()
    log_requests(deployment, 30, ttft_ms=0.0, status=503)
    InferenceRequest.objects.filter(deployment=deployment).update(
        error=f"the model {deployment.name!r} is DEPLOYING, not serving yet; it takes requests once SERVING")
    log_requests(deployment, 20, ttft_ms=50.0)
    deployment = sync(deployment.pk, backend)
    assert deployment.observed["errors"] == 0 and deployment.state == "SERVING", deployment.state_reason
