"""Gateway services: the deployment a model name means, a generation through the compute backend, the
request log.

    generation = completion_start(team=team, request=parsed, started=time.monotonic())
    text = "".join(generation.deltas())         # or stream them; GatewayError on a failure mid-way
    generation.close(status_code=200)           # writes the InferenceRequest row, once

Every request that reaches a deployment (the model name resolved to a live deployment of the team)
writes exactly one InferenceRequest row, whether it was served or refused (not serving yet, prompt
too long, overloaded, unavailable, timed out, client gone). Failures before that (a bad token, an
unknown model, an invalid body) write nothing.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Iterator

from django.conf import settings

from controlplane.compute.base import (
    ServiceError,
    ServiceOverloaded,
    ServiceRequestInvalid,
    ServiceUnavailable,
)
from controlplane.compute.registry import get_compute_backend
from controlplane.tenancy.models import Team
from inference.gateway.openai_schema import CompletionRequest, GatewayError, OutputText, invalid
from inference.models import Deployment, InferenceRequest
from inference.states import DeploymentState

logger = logging.getLogger(__name__)

SERVING_STATES = frozenset({DeploymentState.SERVING, DeploymentState.UPDATING, DeploymentState.DEGRADED})
TERMINAL_STATES = frozenset({DeploymentState.DELETED, DeploymentState.FAILED})
NOT_SERVING_RETRY_AFTER_S = 10.0
# The longest wait for the backend's next event (the first one included) before the request fails
# with a 503; settings.FLEETYARD_GATEWAY_TIMEOUT_SECONDS overrides it.
DEFAULT_TIMEOUT_S = 60.0


def gateway_timeout_s() -> float:
    return float(getattr(settings, "FLEETYARD_GATEWAY_TIMEOUT_SECONDS", DEFAULT_TIMEOUT_S))


# --------------------------------------------------------------------------------------------------- models


def models_list(*, team: Team) -> list[Deployment]:
    """The team's live deployments (not deleted or failed), by name; their state says which take requests."""
    return list(Deployment.objects.filter(team=team).exclude(state__in=TERMINAL_STATES)
                .select_related("team").order_by("name", "-id"))


def deployment_for_model(*, team: Team, model: str) -> Deployment:
    """The live deployment called `model` in the team, or a 404 (another team's deployment is unknown here). A name
    holding a NUL is no deployment's and is not looked up (PostgreSQL refuses NUL in text: it was a 500; QA)."""
    deployment = None if "\x00" in model else (
        Deployment.objects.filter(team=team, name=model).exclude(state__in=TERMINAL_STATES)
        .select_related("team").first())
    if deployment is None:
        raise GatewayError(f"the model {model!r} does not exist in team {team.name} (see GET /v1/models)",
                           status=404, kind="invalid_request_error", param="model", code="model_not_found")
    return deployment


def model_card(deployment: Deployment) -> dict:
    """One entry of GET /v1/models. `ready`: it takes calls from here (not a service the in-memory backend keeps in
    another process, under scripts/up --no-ray)."""
    ready = deployment.state in SERVING_STATES and bool(deployment.compute_handle) \
        and get_compute_backend().serves_calls(deployment.compute_handle)
    return {"id": deployment.name, "object": "model", "created": int(deployment.created_at.timestamp()),
            "owned_by": deployment.team.name,
            "fleetyard": {"deployment_id": deployment.pk, "state": deployment.state, "ready": ready}}


# --------------------------------------------------------------------------------------------------- the log


def inference_request_record(*, deployment: Deployment, endpoint: str, status_code: int, stream: bool,
                             total_ms: float | None, finish_reason: str = "", error: str = "",
                             prompt_tokens: int = 0, output_tokens: int = 0,
                             metrics: dict | None = None) -> InferenceRequest:
    """Write one request's row. `metrics` is the backend's done-event metrics (seconds; stored as ms); its
    token counts win over the gateway's own (`prompt_tokens`, `output_tokens`) when present."""
    metrics = metrics or {}
    return InferenceRequest.objects.create(
        deployment=deployment, endpoint=endpoint, status_code=status_code, stream=stream,
        finish_reason=(finish_reason or "")[:16], error=(error or "")[:500],
        prompt_tokens=_count(metrics.get("prompt_tokens"), prompt_tokens),
        cached_tokens=_count(metrics.get("cached_tokens"), 0),
        output_tokens=_count(metrics.get("output_tokens"), output_tokens),
        queue_ms=_ms(metrics.get("queue_s")), ttft_ms=_ms(metrics.get("ttft_s")), tpot_ms=_ms(metrics.get("tpot_s")),
        total_ms=None if total_ms is None else round(total_ms, 3), replica=str(metrics.get("replica") or "")[:128],
    )


def _count(value, fallback: int) -> int:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0 else fallback


def _ms(seconds) -> float | None:
    if seconds is None or isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        return None
    return round(float(seconds) * 1000.0, 3)


# --------------------------------------------------------------------------------------------------- generation


class Generation:
    """One request running on a deployment: the backend's events turned into client text, then the log row."""

    def __init__(self, *, deployment: Deployment, request: CompletionRequest, events: Iterator[dict],
                 first_event: dict, started: float, prompt_tokens: int) -> None:
        self.deployment = deployment
        self.request = request
        self.started = started
        self.prompt_tokens = prompt_tokens
        self.output_tokens = 0  # token events seen (the backend's count, in its done event, wins)
        self.metrics: dict = {}
        self.finish_reason: str | None = None
        self._events = events
        self._first: dict | None = first_event
        self._text = OutputText(request.stop)
        self._closed = False

    @property
    def text(self) -> str:
        return self._text.text

    def deltas(self) -> Iterator[str]:
        """The text as it is released (cut at a complete stop string, see OutputText); sets finish_reason and metrics
        at the end. Raises GatewayError when the backend fails part-way."""
        event, self._first = self._first, None
        backend_finish = None
        try:
            while True:
                if event is None:
                    raise GatewayError("the model's stream ended without its final event", status=502,
                                       kind="server_error", code="backend_error")
                kind = event.get("type")
                if kind == "token":
                    self.output_tokens += 1
                    delta = self._text.feed(str(event.get("text") or ""))
                    if delta:
                        yield delta
                elif kind == "done":
                    self.metrics = dict(event.get("metrics") or {})
                    backend_finish = event.get("finish_reason")
                    break
                event = next(self._events, None)
        except GatewayError:
            raise
        except Exception as exc:
            raise _gateway_error(exc) from exc
        self.finish_reason = self._text.finish(backend_finish)

    def usage(self) -> tuple[int, int]:
        """(prompt tokens, completion tokens): the backend's counts, else the gateway's."""
        return (_count(self.metrics.get("prompt_tokens"), self.prompt_tokens),
                _count(self.metrics.get("output_tokens"), self.output_tokens))

    def extra(self) -> dict:
        """The `fleetyard` extra of a response: what the replica measured, in milliseconds."""
        return {"deployment_id": self.deployment.pk, "queue_ms": _ms(self.metrics.get("queue_s")),
                "ttft_ms": _ms(self.metrics.get("ttft_s")), "tpot_ms": _ms(self.metrics.get("tpot_s")),
                "cached_tokens": _count(self.metrics.get("cached_tokens"), 0),
                "replica": str(self.metrics.get("replica") or "")}

    def close(self, *, status_code: int, error: str = "") -> None:
        """Stop the backend's stream (if still open) and write the request's row; safe to call twice.
        Never raises: the client already has its answer."""
        if self._closed:
            return
        self._closed = True
        closer = getattr(self._events, "close", None)
        if closer is not None:
            try:
                closer()
            except Exception:
                logger.exception("closing the backend stream of %s failed", self.deployment)
        try:
            inference_request_record(
                deployment=self.deployment, endpoint=self.request.endpoint, status_code=status_code,
                stream=self.request.stream, total_ms=(time.monotonic() - self.started) * 1000.0,
                finish_reason=self.finish_reason or "", error=error, prompt_tokens=self.prompt_tokens,
                output_tokens=self.output_tokens, metrics=self.metrics)
        except Exception:
            logger.exception("recording a request to %s failed", self.deployment)


def completion_start(*, team: Team, request: CompletionRequest, started: float,
                     timeout_s: float | None = None) -> Generation:
    """Resolve the model, check the deployment takes requests and the prompt fits, and start the
    generation (its first event is already read, so refusals are HTTP statuses, not broken streams).
    Raises GatewayError: 404 (no such model, nothing recorded), 503 not serving / unavailable, 400 prompt
    too long or refused by the replica, 429 overloaded, 504 timeout (these are recorded)."""
    deployment = deployment_for_model(team=team, model=request.model)
    prompt_tokens = request.prompt_tokens()
    events = None
    try:
        _check_serving(deployment)
        _check_prompt(deployment, request, len(prompt_tokens))
        backend = get_compute_backend()
        events = iter(backend.stream_completion(
            deployment.compute_handle, request.backend_request(seed=secrets.randbelow(2**31)),
            timeout_s=timeout_s if timeout_s is not None else gateway_timeout_s()))
        first = next(events, None)
        if first is None:
            raise GatewayError("the model's stream ended before its first event", status=502, kind="server_error",
                               code="backend_error")
    except Exception as exc:
        error = _gateway_error(exc)
        if events is not None and hasattr(events, "close"):
            events.close()
        _record_safely(deployment=deployment, endpoint=request.endpoint, status_code=error.status,
                       stream=request.stream, total_ms=(time.monotonic() - started) * 1000.0, error=error.message,
                       prompt_tokens=len(prompt_tokens))
        if error is exc:
            raise
        raise error from exc
    return Generation(deployment=deployment, request=request, events=events, first_event=first, started=started,
                      prompt_tokens=len(prompt_tokens))


def _check_serving(deployment: Deployment) -> None:
    # (selectors.NOT_SERVING_YET knows these 503s by their words: the autoscaling policy does not count them)
    if deployment.state not in SERVING_STATES:
        raise GatewayError(f"the model {deployment.name!r} is {deployment.state}, not serving yet; it takes "
                           f"requests once SERVING", status=503, kind="service_unavailable_error",
                           code="model_not_ready", retry_after_s=NOT_SERVING_RETRY_AFTER_S)
    if not deployment.compute_handle:
        raise GatewayError(f"the model {deployment.name!r} has no running service yet", status=503,
                           kind="service_unavailable_error", code="model_not_ready",
                           retry_after_s=NOT_SERVING_RETRY_AFTER_S)


def _check_prompt(deployment: Deployment, request: CompletionRequest, tokens: int) -> None:
    engine = deployment.engine if isinstance(deployment.engine, dict) else {}
    limit = engine.get("max_prompt_tokens")
    if isinstance(limit, int) and not isinstance(limit, bool) and 0 < limit < tokens:
        raise invalid(request.prompt_param, f"{request.prompt_param}: the prompt has {tokens} tokens (UTF-8 bytes"
                                            f"{', chat template included' if request.chat else ''}); the model "
                                            f"{deployment.name!r} takes at most {limit}",
                      code="context_length_exceeded")


def _gateway_error(exc: BaseException) -> GatewayError:
    """The OpenAI-style error for anything the backend raised."""
    if isinstance(exc, GatewayError):
        return exc
    if isinstance(exc, ServiceOverloaded):
        return GatewayError(str(exc) or "the model is overloaded", status=429, kind="rate_limit_error",
                            code="overloaded", retry_after_s=exc.retry_after_s or 1.0)
    if isinstance(exc, ServiceUnavailable):
        return GatewayError(str(exc) or "the model is unavailable", status=503, kind="service_unavailable_error",
                            code="model_unavailable", retry_after_s=exc.retry_after_s or 5.0)
    if isinstance(exc, ServiceRequestInvalid):
        message = str(exc) or "the model refused the request"
        field, _, _ = message.partition(":")  # replicas name the field first: "prompt: 5000 tokens; ..."
        return GatewayError(message, status=400, kind="invalid_request_error", code="rejected_by_model",
                            param=field if field.isidentifier() else None)
    if isinstance(exc, ServiceError):
        return GatewayError(str(exc) or "the model failed", status=exc.status, kind="server_error",
                            code="backend_error", retry_after_s=exc.retry_after_s)
    if isinstance(exc, TimeoutError):
        return GatewayError(f"the model did not answer in time: {exc}".rstrip(": "), status=504,
                            kind="timeout_error", code="timeout")
    logger.error("the compute backend failed a completion", exc_info=exc)
    return GatewayError(f"the model failed: {type(exc).__name__}: {exc}", status=502, kind="server_error",
                        code="backend_error")


def _record_safely(**fields) -> None:
    try:
        inference_request_record(**fields)
    except Exception:
        logger.exception("recording a request to %s failed", fields.get("deployment"))
