"""`?cursor=`: a list read by keyset instead of page numbers (StandardPagination's opt-in mode). A row that leaves a
filtered list while it is read (a job cancelled while `?state=QUEUED` is paged) made a page-number reader miss the
row after it, shifted back onto a page already read (QA); a cursor reader does not. Page numbers are unchanged, and
a bad cursor is a 400 naming the parameter."""

from __future__ import annotations

import base64
import datetime
import json
import urllib.parse

import pytest
from django.test import TestCase
from django.utils import timezone

from controlplane.tenancy.models import ApiToken
from tests.conftest import JOB_BODY


def submit(client, name: str) -> dict:
    with TestCase.captureOnCommitCallbacks(execute=True):
        response = client.post("/api/v1/training-jobs/", {**JOB_BODY, "name": name}, format="json")
    assert response.status_code == 201, response.json()
    return response.json()


def pages(client, url: str, *, between=None) -> list[dict]:
    """Every row of the list, following `next`; `between(rows)` runs after each page but the last."""
    rows = []
    while url:
        response = client.get(url)
        assert response.status_code == 200, response.json()
        page = response.json()
        rows.extend(page["results"])
        url = page["next"]
        if url and between:
            between(rows)
    return rows


@pytest.fixture
def alpha(api):
    return api("alpha", "member")


@pytest.fixture
def five_queued(alpha):
    jobs = [submit(alpha, f"job-{n}") for n in range(5)]  # no nodes: they stay QUEUED
    queued = alpha.get("/api/v1/training-jobs/?state=QUEUED").json()
    assert sorted(job["id"] for job in queued["results"]) == sorted(job["id"] for job in jobs)
    return jobs


def _cancel_first_read(client):
    done = []

    def cancel(rows):
        if not done:
            assert client.post(f"/api/v1/training-jobs/{rows[0]['id']}/cancel/").status_code == 200
            done.append(rows[0]["id"])
    return cancel


def test_page_numbers_miss_a_row_that_shifts_back_a_page(alpha, five_queued):
    """The flaw, as the page-number mode still has it (kept for the console and existing clients)."""
    rows = pages(alpha, "/api/v1/training-jobs/?state=QUEUED&page_size=2", between=_cancel_first_read(alpha))
    assert len({row["id"] for row in rows}) == 4  # one of the five never shown


def test_a_cursor_reader_sees_every_row_when_one_leaves_the_list(alpha, five_queued):
    rows = pages(alpha, "/api/v1/training-jobs/?state=QUEUED&page_size=2&cursor=", between=_cancel_first_read(alpha))
    assert sorted(row["id"] for row in rows) == sorted(job["id"] for job in five_queued)
    assert len(rows) == 5


@pytest.mark.parametrize("ordering", ["", "name", "-name", "created_at", "-created_at", "id", "-id", "state",
                                      "-state_changed_at"])
def test_a_cursor_reads_the_same_rows_in_the_same_order_as_pages(alpha, ordering):
    for n in range(7):
        submit(alpha, f"job-{n % 3}")  # names tie: the id breaks them
    query = f"&ordering={ordering}" if ordering else ""
    by_page = pages(alpha, f"/api/v1/training-jobs/?page_size=3{query}")
    by_cursor = pages(alpha, f"/api/v1/training-jobs/?page_size=3&cursor={query}")
    assert [row["id"] for row in by_cursor] == [row["id"] for row in by_page]


def test_the_answer_has_the_page_shape_count_and_a_next_cursor(alpha, five_queued):
    first = alpha.get("/api/v1/training-jobs/?page_size=2&cursor=").json()
    assert first["count"] == 5 and len(first["results"]) == 2 and first["previous"] is None
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(first["next"]).query, keep_blank_values=True)
    assert query["page_size"] == ["2"] and query["cursor"][0] and "page" not in query
    last = alpha.get("/api/v1/training-jobs/?page_size=5&cursor=").json()
    assert len(last["results"]) == 5 and last["next"] is None


def test_nullable_fields_are_ordered_and_paged_by_cursor(world, api):
    """api-tokens by expires_at, where most tokens have none: each row once, nulls together (after the dates)."""
    client = api("alpha", "admin")
    client.get("/api/v1/api-tokens/")
    member = world["alpha"]["admin"]
    now = timezone.now()
    for n in range(6):
        ApiToken.objects.create(team=world["alpha"]["team"], user=member, name=f"t{n}", prefix=f"fy_p{n}",
                                token_hash=f"h{n}", expires_at=None if n % 2 else now + datetime.timedelta(days=n))
    total = client.get("/api/v1/api-tokens/?page_size=100").json()["count"]
    for ordering in ("expires_at", "-expires_at"):
        rows = pages(client, f"/api/v1/api-tokens/?page_size=2&ordering={ordering}&cursor=")
        assert len(rows) == total == len({row["id"] for row in rows})
        dates = [row["expires_at"] for row in rows]
        nulls = [date is None for date in dates]
        assert nulls == sorted(nulls, reverse=ordering.startswith("-"))  # NULL as the largest value
        given = [date for date in dates if date is not None]
        assert given == sorted(given, reverse=ordering.startswith("-"))


def test_an_object_list_of_a_relation_ordering_reads_by_cursor(alpha, five_queued):
    """A job's events: the nested lists take a cursor too."""
    job_id = five_queued[0]["id"]
    alpha.post(f"/api/v1/training-jobs/{job_id}/cancel/")
    url = f"/api/v1/training-jobs/{job_id}/events/?page_size=1"
    assert [r["id"] for r in pages(alpha, url + "&cursor=")] == [r["id"] for r in pages(alpha, url)]


def _cursor(document: dict) -> str:
    return base64.urlsafe_b64encode(json.dumps(document).encode()).decode().rstrip("=")


@pytest.mark.parametrize("cursor", ["@@@", "bm90IGpzb24", "eyJvIjpbImlkIl19", "W10",
                                    _cursor({"o": ["-created_at", "-id"], "v": ["soon", 3]}),
                                    _cursor({"o": ["-created_at", "-id"], "v": ["2026-01-01T00:00:00+00:00", "abc"]}),
                                    _cursor({"o": ["-created_at", "-id"], "v": [True, 3]}),
                                    _cursor({"o": ["-created_at", "-id"], "v": [[1], 3]})])
def test_a_cursor_the_api_did_not_give_is_a_400_naming_it(alpha, five_queued, cursor):
    response = alpha.get(f"/api/v1/training-jobs/?cursor={cursor}")
    assert response.status_code == 400
    assert list(response.json()) == ["cursor"] and "not a cursor this API gave" in response.json()["cursor"][0]


def test_a_cursor_of_another_ordering_is_a_400(alpha, five_queued):
    link = alpha.get("/api/v1/training-jobs/?page_size=2&cursor=&ordering=name").json()["next"]
    cursor = urllib.parse.parse_qs(urllib.parse.urlsplit(link).query)["cursor"][0]
    response = alpha.get(f"/api/v1/training-jobs/?page_size=2&cursor={cursor}&ordering=-created_at")
    assert response.status_code == 400 and "another ordering" in response.json()["cursor"][0]


def test_cursor_with_page_or_twice_is_a_400_naming_the_parameter(alpha, five_queued):
    both = alpha.get("/api/v1/training-jobs/?cursor=&page=2")
    assert both.status_code == 400 and list(both.json()) == ["page"]
    twice = alpha.get("/api/v1/training-jobs/?cursor=&cursor=")
    assert twice.status_code == 400 and twice.json() == {"cursor": ["give it once"]}
    assert alpha.get("/api/v1/training-jobs/?cursor=&page_size=0").status_code == 400


def test_the_schema_offers_the_cursor(alpha):
    schema = alpha.get("/api/v1/schema/?format=json")
    if schema.status_code != 200:
        pytest.skip("no schema route")
    parameters = schema.json()["paths"]["/api/v1/training-jobs/"]["get"]["parameters"]
    assert "cursor" in [p["name"] for p in parameters]


def _raw_cursor(text: bytes) -> str:
    return base64.urlsafe_b64encode(text).decode().rstrip("=")


@pytest.mark.parametrize("cursor", [
    _raw_cursor(b'{"o":["-created_at","-id"],"v":["2026-01-01T00:00:00+00:00",Infinity]}'),
    _raw_cursor(b'{"o":["-created_at","-id"],"v":["2026-01-01T00:00:00+00:00",NaN]}'),
    _cursor({"o": ["-created_at", "-id"], "v": ["0001-01-01T00:00:00+05:00", 3]}),
    _cursor({"o": ["-created_at", "-id"], "v": ["9999-12-31T23:59:59.999999-05:00", 3]}),
    _cursor({"o": ["-created_at", "-id"], "v": ["2026-01-01T00:00:00+00:00", "3\x00"]})])
def test_a_forged_cursor_out_of_range_is_a_400_not_a_500(alpha, five_queued, cursor):
    """Infinity for an id (an OverflowError), a date that leaves the calendar in UTC (SQLite: OverflowError; PostgreSQL
    reads those two dates, a 200)."""
    response = alpha.get(f"/api/v1/training-jobs/?cursor={cursor}")
    assert response.status_code in (200, 400)
    assert response.status_code == 200 or list(response.json()) == ["cursor"]


def test_a_cursor_with_a_nul_character_is_a_400_on_postgresql_too(alpha, five_queued):
    """PostgreSQL refuses a NUL in a text parameter (a DataError, a 500); SQLite took it."""
    cursor = _cursor({"o": ["name", "id"], "v": ["a\x00b", 3]})
    response = alpha.get(f"/api/v1/training-jobs/?ordering=name&cursor={cursor}")
    assert response.status_code == 400 and list(response.json()) == ["cursor"]
