"""The OpenAPI schema's account of the answers every endpoint can give besides its success: the error bodies
that `controlplane.common.api.exception_handler` (and the body-size middleware) write, so a client generated
from the schema knows them and schemathesis can hold the API to them (issue 8, S7)."""

from __future__ import annotations

from drf_spectacular.openapi import AutoSchema
from drf_spectacular.plumbing import ResolvedComponent

ERROR_COMPONENT = "Error"
ERROR_SCHEMA = {
    "type": "object",
    "description": "Why the request was refused: `detail` when the reason is not about one input; otherwise "
                   "each input field at fault (or `non_field_errors`) names its reasons.",
    "properties": {
        "detail": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
    },
    "additionalProperties": {},
}

WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# Methods whose body is read: one that takes no fields still refuses any it is sent (common.api.no_fields_check).
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
ERROR_DESCRIPTIONS = {
    "400": "Invalid input: a field (an unknown one too), a query parameter (an unknown one too), an ordering or "
           "the page size (the body names each at fault).",
    "401": "No credentials, or a token that is invalid, expired or revoked.",
    "403": "Signed in, but the caller's role does not allow this.",
    "404": "No such object visible to the caller (another team's object is 404 too), or no such page.",
    "409": "The object's state does not allow this now (for example cancelling a finished job).",
    "413": "The request body is over the platform's size limit.",
    "415": "The request body's media type is not one this operation reads.",
    # Only where the view lists the action in `submission_actions` (it creates a training job or deployment).
    "429": "The team submitted its limit of training jobs and deployments for this minute (see Retry-After).",
}


class FleetyardAutoSchema(AutoSchema):
    """drf-spectacular's AutoSchema plus the error answers each operation can give."""

    def get_operation(self, path, path_regex, path_prefix, method, registry):
        operation = super().get_operation(path, path_regex, path_prefix, method, registry)
        if operation is None:
            return operation
        reference = {"$ref": self._error_component().ref["$ref"]}
        responses = operation.setdefault("responses", {})
        for code in self._error_codes(operation, method):
            responses.setdefault(code, {
                "description": ERROR_DESCRIPTIONS[code],
                "content": {"application/json": {"schema": reference}},
            })
        return operation

    def _error_component(self) -> ResolvedComponent:
        component = ResolvedComponent(name=ERROR_COMPONENT, type=ResolvedComponent.SCHEMA,
                                      object=ERROR_COMPONENT, schema=ERROR_SCHEMA)
        self.registry.register_on_missing(component)
        return component

    def _error_codes(self, operation: dict, method: str) -> list[str]:
        parameters = operation.get("parameters", [])
        has_body = "requestBody" in operation
        codes = []
        if has_body or method in BODY_METHODS or any(p["in"] == "query" for p in parameters):
            codes.append("400")
        if operation.get("security") and {} not in operation["security"]:
            codes += ["401", "403"]
        if any(p["in"] == "path" or p["name"] == "page" for p in parameters):
            codes.append("404")
        if method in WRITE_METHODS:
            codes.append("409")
        if has_body:
            codes += ["413", "415"]
        action = getattr(self.view, "action", None) or method.lower()
        if action in getattr(self.view, "submission_actions", ()):
            codes.append("429")
        return codes
