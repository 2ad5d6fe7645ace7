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


def test_a_staff_users_team_token_carries_only_that_teams_role_not_the_operators_powers(world, demo_cluster):
    """A staff user's token of one team is that team's role, nothing more: no cluster-wide writes (node pools,
    cluster queues, priority classes, cordons, teams), no cluster-wide audit events, only its team's name; the
    same user's session still acts as an operator (README, Tenancy)."""
    from controlplane.cluster.models import Node, NodePool
    from controlplane.quotas.models import ClusterQueue, PriorityClass
    from controlplane.tenancy.models import Team

    ops, alpha = world["ops"], world["alpha"]
    membership_set(actor=alpha["admin"], team=alpha["team"], username=ops.username, role="admin")
    token = client_for(ops, alpha["team"])
    before = (NodePool.objects.count(), ClusterQueue.objects.count(), PriorityClass.objects.count(),
              Team.objects.count())
    writes = [
        ("/api/v1/cluster-queues/", {"name": "by-token", "quotas": [{"accelerator_type": "cpu", "nominal_quota": 1}]}),
        ("/api/v1/priority-classes/", {"name": "by-token", "value": 7}),
        ("/api/v1/node-pools/", {"name": "by-token", "accelerator_type": "cpu", "devices_per_node": 1,
                                 "simulated": True}),
        ("/api/v1/teams/", {"name": "by-token"}),
    ]
    for path, body in writes:
        response = token.post(path, body, format="json")
        assert response.status_code == 403, (path, response.status_code, response.content)
    node = Node.objects.first()
    assert token.post(f"/api/v1/nodes/{node.pk}/cordon/", {"reason": "x"}, format="json").status_code == 403
    assert not Node.objects.get(pk=node.pk).cordoned
    assert (NodePool.objects.count(), ClusterQueue.objects.count(), PriorityClass.objects.count(),
            Team.objects.count()) == before
    # reads narrowed too: its team's name only, and no cluster-wide (team-less) audit events
    assert [t["name"] for t in token.get("/api/v1/teams/").json()["results"]] == ["alpha"]
    assert all(e["team"] == "alpha" for e in token.get("/api/v1/audit-events/?page_size=500").json()["results"])
    shared = token.get("/api/v1/cluster-queues/shared/").json()
    assert "beta" not in (shared.get("teams") or [])
    # the same user's session is an operator
    session = client_for(ops)
    assert session.post("/api/v1/priority-classes/", {"name": "by-session", "value": 8},
                        format="json").status_code == 201
    assert {t["name"] for t in session.get("/api/v1/teams/").json()["results"]} == {"alpha", "beta"}
