"""REST plumbing shared by every viewset: pagination, error bodies, team scoping helpers."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404, JsonResponse
from django.views.defaults import page_not_found
from rest_framework import exceptions, serializers, status
from rest_framework.pagination import PageNumberPagination
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from controlplane.common.errors import DomainError, RateLimited


class StandardPagination(PageNumberPagination):
    """`?page=` and `?page_size=`; a page_size above FLEETYARD_MAX_PAGE_SIZE is capped to it (as DRF does), so
    no request makes the database or the serializer handle more rows than that."""

    page_size = 50
    page_size_query_param = "page_size"
    # DRF said only "Invalid page." for a page past the last one: which parameter, and why (found by QA).
    invalid_page_message = "page {page_number} does not exist: {message}"

    @property
    def max_page_size(self) -> int:
        return settings.FLEETYARD_MAX_PAGE_SIZE

    def get_page_size(self, request):
        """One positive integer or the default; anything else is a 400 naming the parameter (DRF quietly used
        the default for `page_size=abc`, `page_size=-5` or a repeated parameter: found by schemathesis, S7)."""
        size = _one_positive_int(request, self.page_size_query_param)
        return self.page_size if size is None else min(size, self.max_page_size)

    def paginate_queryset(self, queryset, request, view=None):
        """Every list is paginated, so every list (a viewset's and an object's events, revisions or versions)
        refuses here the query parameters it does not read; detail routes run the filter backends too (in
        get_object) but not this."""
        from controlplane.common.filters import query_params_check  # see common/filters.py

        query_params_check(request, view, queryset, self)
        try:
            return super().paginate_queryset(queryset, request, view)
        except exceptions.NotFound as exc:  # a page past the last: still a 404, naming the parameter
            raise exceptions.NotFound({self.page_query_param: [str(exc.detail)]}) from None

    def get_page_number(self, request, paginator):
        _one_positive_int(request, self.page_query_param, allowed=tuple(self.last_page_strings))
        return super().get_page_number(request, paginator)

    def get_schema_operation_parameters(self, view):
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            parameter["schema"]["minimum"] = 1
        return parameters


def _one_positive_int(request, name: str, allowed: tuple[str, ...] = ()) -> int | None:
    """The query parameter `name` as a positive integer (None when absent or one of `allowed`), or a 400."""
    values = request.query_params.getlist(name)
    if not values or (len(values) == 1 and values[0] in allowed):
        return None
    if len(values) == 1 and values[0].isascii() and values[0].isdigit() and int(values[0]) > 0:
        return int(values[0])
    raise exceptions.ValidationError({name: ["must be one positive integer"]})


def exception_handler(exc, context):
    """Every error is a JSON body: `{"field": ["reason"]}` for input errors, `{"detail": ...}` otherwise."""
    if isinstance(exc, DomainError):
        headers = {"Retry-After": str(exc.retry_after)} if isinstance(exc, RateLimited) else None
        return Response(exc.as_dict(), status=exc.status_code, headers=headers)
    if isinstance(exc, DjangoValidationError):
        if hasattr(exc, "message_dict"):
            return Response(exc.message_dict, status=status.HTTP_400_BAD_REQUEST)
        return Response({"detail": exc.messages}, status=status.HTTP_400_BAD_REQUEST)
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    if isinstance(exc, exceptions.ValidationError) and not isinstance(exc.detail, dict):
        # A bare list (DRF's SearchFilter refusing a NUL character) still gets the documented object shape.
        return Response({"detail": exc.detail}, status=exc.status_code)
    return drf_exception_handler(exc, context)


def not_found(request, exception):
    """The site's handler404: under /api/ a JSON body like every other API error (a URL no route matches, such
    as `/api/v1/datasets/1.5/`, was Django's HTML page: found by schemathesis, S7); elsewhere Django's page."""
    if request.path_info.startswith("/api/"):
        return JsonResponse({"detail": "Not found."}, status=status.HTTP_404_NOT_FOUND)
    return page_not_found(request, exception)


class StrictInputMixin:
    """Refuses input fields the serializer does not take (read-only ones included), so a typo (`worker_max`) is a
    400 naming the field instead of a silently ignored setting."""

    def to_internal_value(self, data):
        if hasattr(data, "keys"):
            accepted = sorted(name for name, field in self.fields.items() if not field.read_only)
            unknown = sorted(set(data.keys()) - set(accepted))
            if unknown:
                reason = (f"unknown field; expected one of: {', '.join(accepted)}" if accepted
                          else "unknown field; this request takes no fields")
                raise serializers.ValidationError({name: [reason] for name in unknown})
        return super().to_internal_value(data)


class StrictInputSerializer(StrictInputMixin, serializers.Serializer):
    """An input serializer that rejects fields it does not know (see StrictInputMixin)."""


class NoFieldsSerializer(StrictInputSerializer):
    """The body of an action that takes none (retry, revoke, a checkpoint request): empty, or a 400 naming each
    field sent, so `{"reason": "..."}` sent to an action that records no reason is not silently dropped."""


def validated_query(request, serializer_class) -> dict:
    """The query parameters of a read that takes them through a (strict) serializer: each given once (`.dict()` keeps
    the last of a repeated one, so `?after=1&after=900` quietly read from 900), `format` left to DRF's renderer (it
    was refused as an unknown field on a deployment's metrics; QA)."""
    repeated = sorted(name for name, values in request.query_params.lists() if len(values) > 1)
    if repeated:
        raise exceptions.ValidationError({name: ["give this parameter once"] for name in repeated})
    data = serializer_class(data={k: v for k, v in request.query_params.dict().items() if k != "format"})
    data.is_valid(raise_exception=True)
    return dict(data.validated_data)


def no_fields_check(request) -> None:
    """A 400 naming each field of the request's body, for an action that takes none."""
    NoFieldsSerializer(data=request.data).is_valid(raise_exception=True)
