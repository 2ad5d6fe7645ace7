"""REST plumbing shared by every viewset: pagination, error bodies, team scoping helpers."""

from __future__ import annotations

from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404
from rest_framework import exceptions, serializers, status
from rest_framework.pagination import PageNumberPagination
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from controlplane.common.errors import DomainError


class StandardPagination(PageNumberPagination):
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500


def exception_handler(exc, context):
    """Every error is a JSON body: `{"field": ["reason"]}` for input errors, `{"detail": ...}` otherwise."""
    if isinstance(exc, DomainError):
        return Response(exc.as_dict(), status=exc.status_code)
    if isinstance(exc, DjangoValidationError):
        if hasattr(exc, "message_dict"):
            return Response(exc.message_dict, status=status.HTTP_400_BAD_REQUEST)
        return Response({"detail": exc.messages}, status=status.HTTP_400_BAD_REQUEST)
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    return drf_exception_handler(exc, context)


class StrictInputSerializer(serializers.Serializer):
    """An input serializer that rejects fields it does not know, so a typo (`worker_max`) is a 400
    naming the field instead of a silently ignored setting."""

    def to_internal_value(self, data):
        if hasattr(data, "keys"):
            unknown = sorted(set(data.keys()) - set(self.fields))
            if unknown:
                raise serializers.ValidationError(
                    {name: [f"unknown field; expected one of: {', '.join(sorted(self.fields))}"]
                     for name in unknown}
                )
        return super().to_internal_value(data)
