"""A route of one object (GET /<things>/<id>/ and its writes) does not run the list's filters on its lookup.

DRF's get_object applies the view's filter backends, so `GET /api/v1/deployments/7/?name=other` answered 404 as if
the deployment did not exist, and `?search=` or `?ordering=` were taken silently (found by QA, 2026-11-29). Each such
parameter is now a 400 naming it (controlplane.common.filters), and the list still filters by it."""

from __future__ import annotations

import pytest

from controlplane.datasets.services import dataset_create

REFUSAL = "a filter of the list; a route of one object takes none (leave it out)"


@pytest.fixture
def objects(world, api, demo_cluster):
    """One object of each kind the alpha member or the operator can read, by route: (client, its lookup value)."""
    alpha = world["alpha"]
    dataset_create(actor=alpha["member"], team=alpha["team"], name="corpus")
    member, ops = api("alpha", "member"), api("ops")
    found = {}
    for route, client in (("teams", member), ("local-queues", member), ("cluster-queues", ops), ("nodes", ops),
                          ("node-pools", ops), ("datasets", member), ("memberships", member)):
        rows = client.get(f"/api/v1/{route}/").json()["results"]
        assert rows, route
        found[route] = (client, rows[0]["name"] if route in ("cluster-queues", "node-pools") else rows[0]["id"])
    return found


@pytest.mark.parametrize("route, query", [
    ("teams", "name=nobody"), ("local-queues", "name=nobody"), ("cluster-queues", "cohort=nobody"),
    ("nodes", "ordering=name"), ("node-pools", "ordering=-name"), ("datasets", "name=nobody"),
    ("datasets", "search=nobody"), ("memberships", "role=viewer"),
])
def test_a_list_filter_on_a_route_of_one_object_is_a_400_naming_it(objects, route, query):
    client, pk = objects[route]
    name = query.partition("=")[0]
    response = client.get(f"/api/v1/{route}/{pk}/?{query}")
    assert response.status_code == 400 and response.json() == {name: [REFUSAL]}, (response.status_code,
                                                                                   response.json())
    assert client.get(f"/api/v1/{route}/{pk}/").status_code == 200
    assert client.get(f"/api/v1/{route}/{pk}/?format=json").status_code == 200
    assert client.get(f"/api/v1/{route}/?{query}").status_code == 200  # the list still takes it


def test_a_write_to_one_object_with_a_list_filter_changes_nothing(objects):
    client, pk = objects["datasets"]
    response = client.delete(f"/api/v1/datasets/{pk}/?name=nobody")
    assert response.status_code == 400 and response.json() == {"name": [REFUSAL]}
    assert client.get(f"/api/v1/datasets/{pk}/").status_code == 200
