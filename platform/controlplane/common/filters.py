"""List filter backends of the REST API (settings: REST_FRAMEWORK["DEFAULT_FILTER_BACKENDS"]) and the check that a
list reads every query parameter it is sent.

DRF and django-filter ignore what they do not know: `?stat=QUEUED` (for `state`) listed every job and
`?ordering=bogus` the default order. Here an unknown parameter or ordering field is a 400 naming it and listing
what is accepted. On an object's own routes (a detail view: get, update, delete, its actions) the list's filters,
ordering and search do not narrow the lookup: each is a 400 naming it (DRF's get_object ran them, so
`GET /deployments/7/?name=other` answered 404). Kept apart from common/api.py for the reason common/parsers.py is
(DRF reads these settings while importing its generic views)."""

from __future__ import annotations

from django import forms
from django_filters.rest_framework import DjangoFilterBackend
from rest_framework import exceptions, filters
from rest_framework.settings import api_settings

_DETAIL_REFUSAL = "a filter of the list; a route of one object takes none (leave it out)"


def _refuse_on_detail(request, names) -> None:
    """A 400 naming each of the list parameters `names` sent to a detail route."""
    sent = sorted(name for name in set(names) if name in request.query_params)
    if sent:
        raise exceptions.ValidationError({name: [_DETAIL_REFUSAL] for name in sent})


class StrictFilterBackend(DjangoFilterBackend):
    """django-filter's backend for lists; on a detail route its parameters are refused, not applied."""

    def filter_queryset(self, request, queryset, view):
        if getattr(view, "detail", False):
            _refuse_on_detail(request, _filterset_params(self, view, queryset))
            return queryset
        return super().filter_queryset(request, queryset, view)


class StrictOrderingFilter(filters.OrderingFilter):
    """`?ordering=` with a field the view does not order by is a 400 naming `ordering` and the accepted fields; a
    valid ordering ends with the primary key as the tie-breaker."""

    def filter_queryset(self, request, queryset, view):
        if getattr(view, "detail", False):
            _refuse_on_detail(request, [self.ordering_param])
            return queryset
        return super().filter_queryset(request, queryset, view)

    def remove_invalid_fields(self, queryset, fields, view, request):
        valid = [name for name, _ in self.get_valid_fields(queryset, view, {"request": request})]
        terms = [term for term in fields if term]
        invalid = [term for term in terms if term.removeprefix("-") not in valid]
        if invalid:
            raise exceptions.ValidationError({self.ordering_param: [
                f"cannot order by {', '.join(invalid)}; accepted: {', '.join(valid)} "
                f"(a leading - for descending)"]})
        if terms and not any(term.removeprefix("-") in ("pk", "id") for term in terms):
            # Rows that tie on every requested field come in id order: without it PostgreSQL may order them
            # differently from one page to the next, so a paged list repeated some rows and skipped others.
            terms.append("pk")
        return terms


class StrictSearchFilter(filters.SearchFilter):
    """`?search=` only where the view searches (`search_fields`): elsewhere it is an unknown parameter, and the
    schema does not offer it."""

    def filter_queryset(self, request, queryset, view):
        if getattr(view, "detail", False):
            if getattr(view, "search_fields", None):
                _refuse_on_detail(request, [self.search_param])
            return queryset
        return super().filter_queryset(request, queryset, view)

    def get_schema_operation_parameters(self, view):
        return super().get_schema_operation_parameters(view) if getattr(view, "search_fields", None) else []


def _filterset_params(backend: DjangoFilterBackend, view, queryset) -> dict[str, forms.Field]:
    """Each query parameter the view's filterset reads, with the form field that parses it."""
    filterset_class = backend.get_filterset_class(view, queryset)
    if filterset_class is None:
        return {}
    params = {}
    for name, declared in filterset_class.base_filters.items():
        field = declared.field
        suffixes = getattr(field.widget, "suffixes", None)  # a range filter reads name_min and name_max, say
        params.update({field.widget.suffixed(name, suffix): field for suffix in suffixes} if suffixes
                      else {name: field})
    return params


def query_params_check(request, view, queryset, paginator) -> None:
    """A 400 naming each query parameter the list does not read (with the accepted ones), and each choice filter
    sent empty: django-filter takes `?role=` for no filter at all, so it listed every membership."""
    filter_params: dict[str, forms.Field] = {}
    accepted = {api_settings.URL_FORMAT_OVERRIDE} - {None}
    for backend_class in getattr(view, "filter_backends", None) or ():
        backend = backend_class()
        if isinstance(backend, DjangoFilterBackend):
            filter_params |= _filterset_params(backend, view, queryset)
        elif isinstance(backend, filters.OrderingFilter):
            accepted.add(backend.ordering_param)
        elif isinstance(backend, filters.SearchFilter) and getattr(view, "search_fields", None):
            accepted.add(backend.search_param)
    accepted |= set(filter_params)
    accepted |= {name for name in (paginator.page_query_param, paginator.page_size_query_param,
                                   getattr(paginator, "cursor_query_param", None)) if name}
    errors = {}
    reason = f"unknown query parameter; accepted: {', '.join(sorted(accepted))}"
    for name in sorted(request.query_params):
        field = filter_params.get(name)
        if name not in accepted:
            errors[name] = [reason]
        elif isinstance(field, forms.ChoiceField) and "" in request.query_params.getlist(name):
            choices = [str(value) for value, _ in field.choices if value != ""]
            errors[name] = [f"give one of: {', '.join(choices)} (or leave the parameter out)"]
    if errors:
        raise exceptions.ValidationError(errors)
