"""REST plumbing shared by every viewset: pagination, error bodies, team scoping helpers."""

from __future__ import annotations

import base64
import binascii
import datetime
import decimal
import json
import math
import uuid
from collections import OrderedDict

from django.conf import settings
from django.core.exceptions import FieldDoesNotExist
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import F, Q
from django.http import Http404, JsonResponse
from django.views.defaults import page_not_found
from rest_framework import exceptions, serializers, status
from rest_framework.pagination import PageNumberPagination
from rest_framework.response import Response
from rest_framework.utils.urls import remove_query_param, replace_query_param
from rest_framework.views import exception_handler as drf_exception_handler

from controlplane.common.errors import DomainError, RateLimited


class StandardPagination(PageNumberPagination):
    """`?page=` and `?page_size=`; a page_size above FLEETYARD_MAX_PAGE_SIZE is capped to it (as DRF does), so
    no request makes the database or the serializer handle more rows than that.

    `?cursor=` (opt-in; empty for the first page) reads the list by keyset instead: each page starts after the last
    row of the one before, by the list's ordering (its `?ordering=` or default, the id last as the tie-breaker), and
    `next` carries that position as an opaque cursor (`previous` is null: forward only). A row that leaves a filtered
    list while it is read (a job that stops RUNNING while `?state=RUNNING` is paged) no longer shifts the rows after
    it back onto a page already read, where a page-number reader missed one (QA); a row that joins or moves is seen
    once, or not, as it falls before or after the position. The console and existing clients keep page numbers."""

    page_size = 50
    page_size_query_param = "page_size"
    cursor_query_param = "cursor"
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
        self.cursor_mode = self.cursor_query_param in request.query_params
        if self.cursor_mode:
            return self._keyset_page(queryset, request)
        try:
            return super().paginate_queryset(queryset, request, view)
        except exceptions.NotFound as exc:  # a page past the last: still a 404, naming the parameter
            raise exceptions.NotFound({self.page_query_param: [str(exc.detail)]}) from None

    def _keyset_page(self, queryset, request) -> list:
        """One page of the list in cursor mode (see the class)."""
        if self.page_query_param in request.query_params:
            raise exceptions.ValidationError({self.page_query_param: [
                f"not with {self.cursor_query_param}: a cursor gives the position (leave {self.page_query_param} "
                "out)"]})
        values = request.query_params.getlist(self.cursor_query_param)
        if len(values) != 1:
            raise exceptions.ValidationError({self.cursor_query_param: ["give it once"]})
        terms = _keyset_terms(queryset)
        position = _decode_cursor(values[0], terms, self.cursor_query_param)
        count = queryset.count()
        ordered = queryset.order_by(*(F(name).desc(nulls_first=True) if descending else F(name).asc(nulls_last=True)
                                      for name, descending in terms))
        size = self.get_page_size(request)
        try:
            if position is not None:
                ordered = ordered.filter(_after(terms, position))
            rows = list(ordered[:size + 1])
        except (ValueError, TypeError, OverflowError, DjangoValidationError):
            # a forged position: `id` "abc", a date "soon", a date out of range once in UTC ("0001-01-01T00:00+05:00")
            raise exceptions.ValidationError({self.cursor_query_param: [_NOT_A_CURSOR]}) from None
        self.keyset_count, self.request = count, request
        self.next_cursor = _encode_cursor(terms, rows[size - 1]) if len(rows) > size else None
        return rows[:size]

    def get_paginated_response(self, data):
        if not getattr(self, "cursor_mode", False):
            return super().get_paginated_response(data)
        next_link = None
        if self.next_cursor is not None:
            next_link = replace_query_param(self.request.build_absolute_uri(), self.cursor_query_param,
                                            self.next_cursor)
        return Response(OrderedDict([("count", self.keyset_count), ("next", next_link), ("previous", None),
                                     ("results", data)]))

    def get_next_link(self):
        if getattr(self, "cursor_mode", False):  # (DRF's browsable API asks)
            return None
        return super().get_next_link()

    def get_previous_link(self):
        if getattr(self, "cursor_mode", False):
            return None
        link = super().get_previous_link()
        return link and remove_query_param(link, self.cursor_query_param)

    def get_page_number(self, request, paginator):
        _one_positive_int(request, self.page_query_param, allowed=tuple(self.last_page_strings))
        return super().get_page_number(request, paginator)

    def get_schema_operation_parameters(self, view):
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            parameter["schema"]["minimum"] = 1
        parameters.append({
            "name": self.cursor_query_param, "required": False, "in": "query",
            "description": "Read the list by keyset instead of page numbers: empty for the first page, then the "
                           "cursor of the `next` link (not with `page`). Rows that leave the list while it is read "
                           "do not make the reader miss others.",
            "schema": {"type": "string"}})
        return parameters


_NOT_A_CURSOR = "not a cursor this API gave: leave it empty for the first page, then follow the `next` links"


def _keyset_terms(queryset) -> list[tuple[str, bool]]:
    """The queryset's ordering as (field path, descending) pairs, ending with the primary key: what a cursor's
    position is made of. A relation (`deployment`) is compared by its id."""
    query = queryset.query
    names = list(query.order_by) or (list(query.get_meta().ordering) if query.default_ordering else [])
    terms, meta = [], queryset.model._meta
    for name in names:
        if not isinstance(name, str) or name.lstrip("-") in ("", "?"):
            raise exceptions.ValidationError({"cursor": ["this list's ordering cannot be read by cursor; use page"]})
        path = name.lstrip("-")
        if path == "pk":
            path = meta.pk.name
        if path not in query.annotations:
            path = _concrete_path(queryset.model, path)
        terms.append((path, name.startswith("-")))
    if not any(path == meta.pk.name for path, _ in terms):
        terms.append((meta.pk.name, bool(terms) and terms[-1][1]))
    else:  # nothing after the primary key changes the order
        terms = terms[:[path for path, _ in terms].index(meta.pk.name) + 1]
    return terms


def _concrete_path(model, path: str) -> str:
    """`path` with a relation at its end named by its column (`deployment` -> `deployment_id`)."""
    parts = path.split("__")
    for index, part in enumerate(parts):
        try:
            field = model._meta.get_field(part)
        except FieldDoesNotExist:
            raise exceptions.ValidationError({"cursor": ["this list's ordering cannot be read by cursor; use "
                                                         "page"]}) from None
        if field.is_relation and index == len(parts) - 1:
            if not (field.many_to_one or field.one_to_one) or not field.concrete:
                raise exceptions.ValidationError({"cursor": ["this list's ordering cannot be read by cursor; use "
                                                             "page"]})
            parts[index] = field.attname
        elif field.is_relation:
            model = field.related_model
    return "__".join(parts)


def _row_value(row, path: str):
    value = row
    for part in path.split("__"):
        value = getattr(value, part, None)
        if value is None:
            return None
    return value


def _encode_cursor(terms, row) -> str:
    values = []
    for path, _ in terms:
        value = _row_value(row, path)
        if isinstance(value, datetime.datetime | datetime.date | datetime.time):
            value = value.isoformat()
        elif isinstance(value, decimal.Decimal | uuid.UUID):
            value = str(value)
        values.append(value)
    document = json.dumps({"o": [("-" if descending else "") + path for path, descending in terms], "v": values},
                          separators=(",", ":"))
    return base64.urlsafe_b64encode(document.encode()).decode().rstrip("=")


def _decode_cursor(text: str, terms, name: str) -> list | None:
    """The position a cursor holds (None for the empty first-page cursor), or a 400 naming the parameter."""
    if text == "":
        return None
    order = [("-" if descending else "") + path for path, descending in terms]
    try:
        document = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode())
    except (binascii.Error, ValueError, UnicodeDecodeError):
        document = None
    if not (isinstance(document, dict) and isinstance(document.get("v"), list)
            and all(value is None or (isinstance(value, str) and "\x00" not in value) or isinstance(value, int)
                    or (isinstance(value, float) and math.isfinite(value)) for value in document["v"])):
        # (Infinity/NaN: an int column's lookup overflowed; a NUL: PostgreSQL refuses it in text, a DataError)
        raise exceptions.ValidationError({name: [_NOT_A_CURSOR]})
    if document.get("o") != order or len(document["v"]) != len(terms):
        raise exceptions.ValidationError({name: ["a cursor of another ordering of the list: keep the query of the "
                                                 "page that gave it"]})
    return document["v"]


def _after(terms, position) -> Q:
    """The rows after `position` in the order of `terms` (NULL sorts as the largest value, as order_by above puts
    it): the keyset's condition, term by term."""
    after, equal_so_far = Q(pk__in=[]), Q()
    for (path, descending), value in zip(terms, position, strict=True):
        if value is None:
            beyond = Q(**{f"{path}__isnull": False}) if descending else Q(pk__in=[])
            same = Q(**{f"{path}__isnull": True})
        else:
            beyond = (Q(**{f"{path}__lt": value}) if descending
                      else Q(**{f"{path}__gt": value}) | Q(**{f"{path}__isnull": True}))
            same = Q(**{path: value})
        after |= equal_so_far & beyond
        equal_so_far &= same
    return after


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


# Fields that read every value of a form field given more than once (DRF takes them with `getlist`).
LIST_VALUED_FIELDS = (serializers.ListField, serializers.MultipleChoiceField, serializers.ManyRelatedField)


class StrictInputMixin:
    """Refuses input fields the serializer does not take (read-only ones included), so a typo (`worker_max`) is a
    400 naming the field instead of a silently ignored setting; and, in a form or multipart body, a field given more
    than once that takes one value (DRF kept the last: two `file` parts stored only the second; QA). A JSON body
    cannot repeat a key once parsed; a list-valued field (LIST_VALUED_FIELDS) is given once per item in a form."""

    def to_internal_value(self, data):
        if hasattr(data, "keys"):
            accepted = sorted(name for name, field in self.fields.items() if not field.read_only)
            errors = {}
            unknown = sorted(set(data.keys()) - set(accepted))
            if unknown:
                reason = (f"unknown field; expected one of: {', '.join(accepted)}" if accepted
                          else "unknown field; this request takes no fields")
                errors.update({name: [reason] for name in unknown})
            if hasattr(data, "getlist"):  # a QueryDict: a form or multipart body
                errors.update({name: ["given more than once; give this field once"] for name in accepted
                               if len(data.getlist(name)) > 1
                               and not isinstance(self.fields[name], LIST_VALUED_FIELDS)})
            if errors:
                raise serializers.ValidationError(errors)
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
