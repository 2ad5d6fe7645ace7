"""Filters for the training job list."""

from __future__ import annotations

from datetime import UTC

import django_filters
from django import forms
from django_filters.fields import IsoDateTimeField

from jobs.models import TrainingJob
from jobs.states import JobState


class UtcIsoDateTimeField(IsoDateTimeField):
    """An ISO 8601 date-time, turned to UTC before it reaches the query: PostgreSQL refuses an offset beyond
    +-15:59, which Python accepts (`2024-01-01T00:00:00-22:26` was a 500 there: found by schemathesis, S7)."""

    def to_python(self, value):
        value = super().to_python(value)
        if value is None:
            return value
        try:
            return value.astimezone(UTC)
        except OverflowError:
            raise forms.ValidationError("date-time out of range", code="invalid") from None


class UtcIsoDateTimeFilter(django_filters.IsoDateTimeFilter):
    field_class = UtcIsoDateTimeField


class TrainingJobFilter(django_filters.FilterSet):
    team = django_filters.CharFilter(field_name="team__name")
    queue = django_filters.CharFilter(field_name="local_queue__name")
    state = django_filters.MultipleChoiceFilter(choices=[(s.value, s.value) for s in JobState])
    name = django_filters.CharFilter(lookup_expr="icontains")
    created_after = UtcIsoDateTimeFilter(field_name="created_at", lookup_expr="gte")
    created_before = UtcIsoDateTimeFilter(field_name="created_at", lookup_expr="lt")

    class Meta:
        model = TrainingJob
        fields = ["team", "queue", "state", "name", "trainer"]
