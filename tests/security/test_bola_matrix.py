"""S1 (issue 8): broken object-level authorization, tested from the OpenAPI schema itself.

Every path of the schema that names an object (`{id}`), with every method it declares (actions such as
logs, metrics, checkpoints, cancel, scale and revoke included), is called by every role of team alpha on an
object of team beta: the answer is 404 every time (never 403, which would confirm the object exists), and
the database is unchanged. Every list path, with and without filters aimed at beta, never shows a beta row.
Because the matrix is generated from the schema, a new endpoint is covered the day it is added, and a new
kind of object path fails `test_every_object_path_is_classified` until someone says whose it is.
"""

from __future__ import annotations

import json

import pytest
from django.test import Client

from tests.security.conftest import BETA_SECRETS, database_snapshot

API = "/api/v1/"
# Objects that belong to one team: another team's caller must not be able to tell they exist.
TEAM_OWNED = {"api-tokens", "audit-events", "datasets", "deployments", "local-queues", "memberships", "teams",
              "training-jobs"}
# Cluster-wide facts every signed-in user may read (their writes are for operators: tests/security/test_roles.py).
SHARED = {"accelerator-types", "cluster-queues", "node-pools", "nodes", "priority-classes"}
ROLES = ("admin", "member", "viewer")


def _object_paths(schema: dict) -> list[tuple[str, str, str]]:
    """(path template, resource, method) for every method of every path with a path parameter."""
    rows = []
    for path, operations in schema["paths"].items():
        if "{" not in path:
            continue
        resource = path[len(API):].split("/")[0]
        for method in operations:
            if method in {"get", "post", "put", "patch", "delete"}:
                rows.append((path, resource, method))
    return rows


def _list_paths(schema: dict) -> list[tuple[str, list[dict]]]:
    """(path, declared query parameters) for every GET path without a path parameter."""
    return [(path, ops["get"].get("parameters", [])) for path, ops in schema["paths"].items()
            if "{" not in path and "get" in ops and not path.endswith(("/schema/", "/docs/", "/redoc/"))]


def _client(world, role: str, *, session: bool = False) -> Client:
    from controlplane.tenancy.services import api_token_create

    user = world["alpha"][role]
    if session:
        client = Client()
        client.force_login(user)
        return client
    _, raw = api_token_create(actor=user, team=world["alpha"]["team"], user=user, name=f"bola-{role}")
    return Client(HTTP_AUTHORIZATION=f"Bearer {raw}")


def test_every_object_path_is_classified(api_schema):
    resources = {resource for _, resource, _ in _object_paths(api_schema)}
    assert resources, "the schema has no object paths: the matrix would test nothing"
    unclassified = resources - TEAM_OWNED - SHARED
    assert not unclassified, f"classify these as team-owned or shared: {unclassified}"
    assert resources >= TEAM_OWNED, f"team-owned resources missing from the schema: {TEAM_OWNED - resources}"


@pytest.mark.parametrize("session", [False, True], ids=["token", "session"])
def test_another_teams_object_is_404_on_every_path_and_method(world, beta_objects, api_schema, session):
    matrix = [(path, resource, method) for path, resource, method in _object_paths(api_schema)
              if resource in TEAM_OWNED]
    clients = {role: _client(world, role, session=session) for role in ROLES}
    before = database_snapshot()
    answers = []
    for path, resource, method in matrix:
        name = path[path.index("{") + 1:path.index("}")]
        url = path.replace("{" + name + "}", str(beta_objects[resource]))
        for role, client in clients.items():
            call = getattr(client, method)
            kwargs = {"data": json.dumps({}), "content_type": "application/json"} if method in {"post", "patch",
                                                                                                  "put"} else {}
            response = call(url, **kwargs)
            answers.append((role, method.upper(), url, response.status_code))
            body = response.content.decode("utf-8", errors="replace")
            assert not any(secret in body for secret in BETA_SECRETS), (role, method, url, body[:300])
    wrong = [a for a in answers if a[3] != 404]
    print(f"\nBOLA matrix ({'session' if session else 'token'}): {len(answers)} requests over {len(matrix)} "
          f"path x method pairs and {len(ROLES)} roles; {len(answers) - len(wrong)} answered 404 "
          f"({100 * (len(answers) - len(wrong)) / len(answers):.1f}%)")
    assert not wrong, wrong
    assert len(matrix) >= 20, matrix
    assert database_snapshot() == before, "a request on another team's object changed the database"


def _filter_values(parameter: dict, world, beta_objects) -> list[str]:
    """Values aimed at team beta for one declared query parameter."""
    name = parameter["name"]
    if name in {"page", "page_size", "limit", "after", "since_step", "worker", "timeout", "follow", "ordering"}:
        return []
    kind = parameter.get("schema", {}).get("type")
    beta_team = world["beta"]["team"]
    if kind == "integer":
        return [str(beta_team.pk), *{str(v) for v in beta_objects.values()}]
    return ["beta", beta_team.name, *BETA_SECRETS]


def test_lists_and_filters_never_show_another_teams_rows(world, beta_objects, api_schema):
    client = _client(world, "admin")
    beta_team = world["beta"]["team"]
    requests = 0
    for path, parameters in _list_paths(api_schema):
        queries = [{}, {"team": beta_team.pk}, {"team": beta_team.name}, {"search": "secret"},
                   {"search": "b7"}, {"page_size": 500}]
        for parameter in parameters:
            queries += [{parameter["name"]: value} for value in _filter_values(parameter, world, beta_objects)]
        for query in queries:
            response = client.get(path, query)
            requests += 1
            assert response.status_code in {200, 400, 404}, (path, query, response.status_code)
            body = response.content.decode("utf-8", errors="replace")
            asked = " ".join(str(v) for v in query.values())  # a 400 may quote the caller's own input
            assert not any(secret in body for secret in BETA_SECRETS if secret not in asked), (path, query, body[:300])
            if response.status_code != 200 or path.endswith("/me/"):
                continue
            data = response.json()
            rows = data.get("results", data) if isinstance(data, dict) else data
            resource = path[len(API):].split("/")[0]
            if resource in TEAM_OWNED and isinstance(rows, list):
                ids = {row.get("id") for row in rows if isinstance(row, dict)}
                assert beta_objects[resource] not in ids, (path, query)
                teams = {row.get("team") for row in rows if isinstance(row, dict)} - {None}
                assert not teams & {beta_team.pk, beta_team.name}, (path, query, teams)
    print(f"\nlist matrix: {requests} list requests with filters aimed at beta; none showed a beta row")
    assert requests > 50
