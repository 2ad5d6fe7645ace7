"""HTTP for the OpenAI-compatible gateway: thin views over openai_schema (parsing) and services.

Authentication is the team API token (`Authorization: Bearer fy_...`, the REST API's
ApiTokenAuthentication); the token's team is where `model` names are looked up. Errors are
OpenAI-shaped (`{"error": {"message", "type", "param", "code"}}`), 429 and 503 carry Retry-After.
Streams are server-sent events: `data: {chunk}\\n\\n` ... `data: [DONE]\\n\\n`; a failure after the
stream started is sent as a `data: {"error": ...}` event before [DONE].
"""

from __future__ import annotations

import time
import uuid

from django.core.exceptions import RequestDataTooBig
from django.http import HttpResponse, JsonResponse, StreamingHttpResponse
from django.utils.decorators import method_decorator
from django.views import View
from django.views.decorators.csrf import csrf_exempt
from rest_framework.exceptions import AuthenticationFailed

from controlplane.tenancy.authentication import ApiTokenAuthentication
from controlplane.tenancy.models import Role, Team
from controlplane.tenancy.selectors import has_role, visible_team_ids
from inference.gateway import services
from inference.gateway.openai_schema import (
    CHAT_COMPLETIONS,
    COMPLETIONS,
    SSE_DONE,
    CompletionRequest,
    GatewayError,
    chunk_body,
    completion_body,
    parse_request,
    sse_event,
    usage,
    usage_chunk_body,
)

CLIENT_CLOSED_REQUEST = 499  # recorded when the client goes away mid-stream (nginx's convention)


def error_response(error: GatewayError, *, allow: list[str] | None = None) -> JsonResponse:
    response = JsonResponse(error.body(), status=error.status)
    if error.retry_after is not None:
        response["Retry-After"] = error.retry_after
    if error.status == 401:
        response["WWW-Authenticate"] = ApiTokenAuthentication().authenticate_header(None)
    if allow:
        response["Allow"] = ", ".join(allow)
    return response


def authenticate_team(request, *, minimum: Role | None = None) -> Team:
    """The team of the request's API token, or a 401; with `minimum`, a 403 unless the token's user has at least that
    role in the team (a completion needs a member, as the console's playground does: a viewer, refused there, ran the
    same completion here with a token of their own; QA)."""
    try:
        result = ApiTokenAuthentication().authenticate(request)
    except AuthenticationFailed as exc:
        raise GatewayError(str(exc.detail), status=401, kind="authentication_error", code="invalid_api_key") from None
    if result is None:
        raise GatewayError("missing API token: send 'Authorization: Bearer fy_...' (a team API token)", status=401,
                           kind="authentication_error", code="invalid_api_key")
    user, token = result
    if token.team_id not in visible_team_ids(user=user, token=token):
        raise GatewayError("the token's user is no longer a member of its team", status=401,
                           kind="authentication_error", code="invalid_api_key")
    if minimum is not None and not has_role(user=user, team_id=token.team_id, minimum=minimum, token=token):
        raise GatewayError(f"a completion needs the {minimum.value} role in team {token.team.name} (viewers may list "
                           "its models)", status=403, kind="permission_error", code="forbidden")
    return token.team


@method_decorator(csrf_exempt, name="dispatch")
class GatewayView(View):
    """Shared plumbing: OpenAI-style 405s, and GatewayError raised anywhere becomes its JSON answer."""

    def dispatch(self, request, *args, **kwargs):
        try:
            return super().dispatch(request, *args, **kwargs)
        except GatewayError as error:
            return error_response(error)

    def http_method_not_allowed(self, request, *args, **kwargs):
        allowed = [m.upper() for m in self.http_method_names if hasattr(self, m) and m != "options"]
        error = GatewayError(f"method {request.method} is not allowed here; use {', '.join(allowed)}", status=405,
                             code="method_not_allowed")
        return error_response(error, allow=allowed)


class ModelsView(GatewayView):
    """GET /v1/models: the team's live deployments (`fleetyard.ready` says which take requests now)."""

    def get(self, request):
        team = authenticate_team(request)
        return JsonResponse({"object": "list",
                             "data": [services.model_card(d) for d in services.models_list(team=team)]})


class ModelView(GatewayView):
    """GET /v1/models/<name>: one of the team's live deployments, or 404."""

    def get(self, request, model: str):
        team = authenticate_team(request)
        return JsonResponse(services.model_card(services.deployment_for_model(team=team, model=model)))


class UnknownEndpointView(GatewayView):
    """Any other URL under /v1/: a 404 in OpenAI's shape naming the endpoints there are (before, Django's HTML page,
    which OpenAI clients cannot read, e.g. for `/v1/completions/` with a trailing slash)."""

    http_method_names = ["get", "post", "put", "patch", "delete", "head", "options"]

    def dispatch(self, request, *args, **kwargs):
        return error_response(GatewayError(
            f"no such endpoint: {request.method} {request.path}; the endpoints are GET /v1/models, "
            f"GET /v1/models/{{model}}, POST /v1/completions and POST /v1/chat/completions (no trailing slash)",
            status=404, code="unknown_url"))


class _CompletionView(GatewayView):
    endpoint = COMPLETIONS
    id_prefix = "cmpl-"

    def post(self, request):
        started = time.monotonic()
        team = authenticate_team(request, minimum=Role.MEMBER)
        try:
            raw = request.body
        except RequestDataTooBig as exc:
            raise GatewayError(f"the request body is too large: {exc}", status=413, code="request_too_large") from None
        parsed = parse_request(raw, endpoint=self.endpoint)
        generation = services.completion_start(team=team, request=parsed, started=started)
        response_id = f"{self.id_prefix}{uuid.uuid4().hex}"
        created = int(time.time())
        if parsed.stream:
            return stream_response(generation, parsed, response_id, created)
        return _complete(generation, parsed, response_id, created)


class CompletionsView(_CompletionView):
    """POST /v1/completions."""

    endpoint = COMPLETIONS
    id_prefix = "cmpl-"


class ChatCompletionsView(_CompletionView):
    """POST /v1/chat/completions (messages rendered with openai_schema.render_chat_prompt)."""

    endpoint = CHAT_COMPLETIONS
    id_prefix = "chatcmpl-"


def _complete(generation: services.Generation, parsed: CompletionRequest, response_id: str,
              created: int) -> HttpResponse:
    status, error = 500, "the gateway failed"
    try:
        text = "".join(generation.deltas())
        body = completion_body(parsed, response_id=response_id, created=created, text=text,
                               finish_reason=generation.finish_reason, usage=usage(*generation.usage()),
                               extra=generation.extra())
        status, error = 200, ""
        return JsonResponse(body)
    except GatewayError as exc:
        status, error = exc.status, exc.message
        return error_response(exc)
    finally:
        generation.close(status_code=status, error=error)


def stream_response(generation: services.Generation, parsed: CompletionRequest, response_id: str,
                    created: int) -> StreamingHttpResponse:
    """The server-sent events answer of a started generation (also the console playground's)."""
    response = StreamingHttpResponse(_stream(generation, parsed, response_id, created),
                                     content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


def _stream(generation: services.Generation, parsed: CompletionRequest, response_id: str, created: int):
    """The SSE body. The request's row is written when this ends: finished, failed or closed by the client."""
    ids = {"response_id": response_id, "created": created}
    status, error, complete = 200, "", False
    try:
        try:
            if parsed.chat:
                yield sse_event(chunk_body(parsed, **ids, role=True))
            for delta in generation.deltas():
                yield sse_event(chunk_body(parsed, **ids, text=delta))
            yield sse_event(chunk_body(parsed, **ids, text="" if not parsed.chat else None,
                                       finish_reason=generation.finish_reason, extra=generation.extra()))
            if parsed.include_usage:
                yield sse_event(usage_chunk_body(parsed, **ids, usage=usage(*generation.usage())))
        except GatewayError as exc:
            status, error = exc.status, exc.message
            yield sse_event(exc.body())
        complete = True
        yield SSE_DONE
    except GeneratorExit:
        if not error and not complete:
            status, error = CLIENT_CLOSED_REQUEST, "the client closed the stream"
        raise
    except BaseException as exc:
        status, error = 500, f"the gateway failed: {type(exc).__name__}: {exc}"
        raise
    finally:
        generation.close(status_code=status, error=error)
