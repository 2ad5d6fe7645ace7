"""A team API token narrows its user to the token's team everywhere: a user who belongs to teams alpha and beta,
calling with a token of alpha, sees nothing of beta, not even its name (README, Tenancy)."""

from __future__ import annotations

from controlplane.quotas.services import cluster_queue_create
from controlplane.tenancy.services import membership_set
from tests.conftest import client_for


def test_a_cluster_queues_teams_show_only_the_tokens_team(world):
    alpha, beta = world["alpha"], world["beta"]
    membership_set(actor=beta["admin"], team=beta["team"], username=alpha["member"].username, role="member")
    cluster_queue_create(actor=world["ops"], name="private", quotas=[{"accelerator_type": "cpu", "nominal_quota": 4}],
                         teams=[alpha["team"], beta["team"]])
    alpha_token = client_for(alpha["member"], alpha["team"])
    assert alpha_token.get("/api/v1/teams/").json()["results"][0]["name"] == "alpha"  # as the other routes narrow it
    listed = {queue["name"]: queue for queue in alpha_token.get("/api/v1/cluster-queues/").json()["results"]}
    assert listed["private"]["teams"] == ["alpha"]
    assert alpha_token.get("/api/v1/cluster-queues/private/").json()["teams"] == ["alpha"]
    # the same user's session is not narrowed: both of their teams
    session = client_for(alpha["member"])
    assert session.get("/api/v1/cluster-queues/private/").json()["teams"] == ["alpha", "beta"]
