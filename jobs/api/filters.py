"""Filters for the training job list."""

from __future__ import annotations

import django_filters

from jobs.models import TrainingJob
from jobs.states import JobState


class TrainingJobFilter(django_filters.FilterSet):
    team = django_filters.CharFilter(field_name="team__name")
    queue = django_filters.CharFilter(field_name="local_queue__name")
    state = django_filters.MultipleChoiceFilter(choices=[(s.value, s.value) for s in JobState])
    name = django_filters.CharFilter(lookup_expr="icontains")
    created_after = django_filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="gte")
    created_before = django_filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="lt")

    class Meta:
        model = TrainingJob
        fields = ["team", "queue", "state", "name", "trainer"]
