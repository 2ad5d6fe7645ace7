"""Accelerator types, node pools, nodes, cluster/local queues and priority classes through the API."""

from __future__ import annotations

from controlplane.cluster.models import Node, NodePool
from controlplane.cluster.services import nodes_sync
from controlplane.compute.memory import InMemoryComputeBackend
from controlplane.compute.topology import load_topology


def test_accelerator_types_are_seeded_with_sources(api):
    body = api("alpha", "viewer").get("/api/v1/accelerator-types/?page_size=100").json()
    slugs = {item["slug"] for item in body["results"]}
    assert {"nvidia-h100", "nvidia-h200", "nvidia-a100", "nvidia-l40s", "amd-mi300x", "kunlun-p800",
            "ascend-910b", "cpu"} <= slugs
    h100 = api("alpha", "viewer").get("/api/v1/accelerator-types/nvidia-h100/").json()
    assert h100["bf16_dense_tflops"] > 900 and h100["memory_gb"] == 80
    assert h100["sources"]["bf16_dense_tflops"]
    for item in body["results"]:
        for figure in ("bf16_dense_tflops", "memory_gb", "price_per_hour_usd"):
            if item[figure] is not None:
                assert item["sources"].get(figure), (item["slug"], figure)


def test_node_pools_are_operator_managed(api):
    body = {"name": "h100-pool", "accelerator_type": "nvidia-h100", "devices_per_node": 8, "simulated": True}
    assert api("alpha", "admin").post("/api/v1/node-pools/", body, format="json").status_code == 403
    response = api("ops").post("/api/v1/node-pools/", body, format="json")
    assert response.status_code == 201 and response.json()["simulated"] is True
    again = api("ops").post("/api/v1/node-pools/", body, format="json")
    assert again.status_code == 400 and "name" in again.json()
    bad = api("ops").post("/api/v1/node-pools/", {**body, "name": "x", "accelerator_type": "tpu"}, format="json")
    assert bad.status_code == 400 and "accelerator_type" in bad.json()
    unsaid = {k: v for k, v in body.items() if k != "simulated"} | {"name": "unsaid"}
    missing = api("ops").post("/api/v1/node-pools/", unsaid, format="json")
    assert missing.status_code == 400 and "simulated" in missing.json()
    # a GPU pool of nodes without devices (accepted before 2026-11-29: QA); a CPU pool counts cores, not devices
    empty = api("ops").post("/api/v1/node-pools/", {**body, "name": "empty", "devices_per_node": 0}, format="json")
    assert empty.status_code == 400 and "at least 1 device per node" in " ".join(empty.json()["devices_per_node"])
    cpu = {**body, "name": "cpus", "accelerator_type": "cpu", "devices_per_node": 0, "simulated": False}
    assert api("ops").post("/api/v1/node-pools/", cpu, format="json").status_code == 201


def test_nodes_observed_from_the_backend_show_capacity_and_simulation(api, world, accel):
    from controlplane.cluster.services import node_pool_create

    topology = load_topology()
    for pool in topology.pools:
        node_pool_create(actor=world["ops"], name=pool.name, accelerator_type=accel[pool.accelerator_type],
                         devices_per_node=pool.devices_per_node, simulated=pool.simulated)
    backend = InMemoryComputeBackend.from_topology(topology)
    nodes_sync(observed=backend.list_nodes())
    pools = {p["name"]: p for p in api("alpha", "viewer").get("/api/v1/node-pools/").json()["results"]}
    assert pools["h100-pool"]["node_count"] == 2 and pools["h100-pool"]["capacity_devices"] == 16
    assert pools["h100-pool"]["simulated"] is True and pools["cpu-pool"]["simulated"] is False
    nodes = api("alpha", "viewer").get("/api/v1/nodes/?pool__name=a100-pool").json()["results"]
    assert {n["leaf_group"] for n in nodes} == {"lg-a100-a", "lg-a100-b"}
    assert all(n["labels"]["fleetyard.io/simulated"] == "true" for n in nodes)


def test_cordon_is_for_operators_and_audited(api, world, accel):
    from controlplane.cluster.services import node_pool_create
    from controlplane.tenancy.models import AuditEvent

    pool = node_pool_create(actor=world["ops"], name="cpu-pool", accelerator_type=accel["cpu"],
                            devices_per_node=1, simulated=False)
    node = Node.objects.create(pool=pool, name="cpu-pool-0")
    assert api("alpha", "admin").post(f"/api/v1/nodes/{node.pk}/cordon/").status_code == 403
    response = api("ops").post(f"/api/v1/nodes/{node.pk}/cordon/", {"reason": "flaky NIC"}, format="json")
    assert response.status_code == 200 and response.json()["cordoned"] is True
    assert AuditEvent.objects.filter(action="node.cordon", data__reason="flaky NIC").exists()
    assert api("ops").post(f"/api/v1/nodes/{node.pk}/uncordon/").json()["cordoned"] is False


def test_a_pools_free_devices_leave_out_cordoned_nodes(api, demo_cluster):
    """QA (2026-11-29): a pool counted a cordoned node's free devices, while the scheduler and the plans left them
    out."""
    def h100():
        pools = api("alpha", "viewer").get("/api/v1/node-pools/").json()["results"]
        return next(p for p in pools if p["name"] == "h100-pool")

    before = h100()
    assert (before["capacity_devices"], before["free_devices"]) == (16, 16)
    node = Node.objects.filter(pool__name="h100-pool").order_by("name").first()
    assert api("ops").post(f"/api/v1/nodes/{node.pk}/cordon/").status_code == 200
    after = h100()
    assert (after["capacity_devices"], after["free_devices"]) == (16, 8)


def test_cluster_queues(api):
    body = {"name": "team-x", "cohort": "all", "quotas": [
        {"accelerator_type": "nvidia-h100", "nominal_quota": 8, "borrowing_limit": 8, "lending_limit": 4}]}
    assert api("alpha", "admin").post("/api/v1/cluster-queues/", body, format="json").status_code == 403
    response = api("ops").post("/api/v1/cluster-queues/", body, format="json")
    assert response.status_code == 201, response.json()
    assert response.json()["quotas"][0]["lending_limit"] == 4
    listed = api("alpha", "viewer").get("/api/v1/cluster-queues/").json()["results"]
    assert {q["name"] for q in listed} == {"shared", "team-x"}
    patched = api("ops").patch("/api/v1/cluster-queues/team-x/", {"quotas": [
        {"accelerator_type": "nvidia-a100", "nominal_quota": 4}]}, format="json")
    assert patched.status_code == 200 and [q["accelerator_type"] for q in patched.json()["quotas"]] == ["nvidia-a100"]


def test_cluster_queue_bad_quotas_write_nothing(api):
    from controlplane.quotas.models import ClusterQueue

    for quotas in ([{"accelerator_type": "tpu", "nominal_quota": 1}],
                   [{"accelerator_type": "cpu", "nominal_quota": 1}, {"accelerator_type": "cpu", "nominal_quota": 2}],
                   [{"accelerator_type": "cpu", "nominal_quota": 1, "lending_limit": 5}],
                   [{"accelerator_type": "cpu", "nominal_quota": -1}]):
        response = api("ops").post("/api/v1/cluster-queues/", {"name": "bad", "quotas": quotas}, format="json")
        assert response.status_code == 400 and "quotas" in response.json(), response.json()
        assert not ClusterQueue.objects.filter(name="bad").exists()


def test_local_queues_need_team_admin(api):
    body = {"name": "urgent", "cluster_queue": "shared"}
    assert api("alpha", "member").post("/api/v1/local-queues/", body, format="json").status_code == 403
    response = api("alpha", "admin").post("/api/v1/local-queues/", body, format="json")
    assert response.status_code == 201 and response.json()["team"] == "alpha"
    dup = api("alpha", "admin").post("/api/v1/local-queues/", body, format="json")
    assert dup.status_code == 400 and "name" in dup.json()
    bad = api("alpha", "admin").post("/api/v1/local-queues/", {"name": "x", "cluster_queue": "nope"}, format="json")
    assert bad.status_code == 400 and "cluster_queue" in bad.json()


def test_priority_classes(api):
    assert api("alpha", "admin").post("/api/v1/priority-classes/", {"name": "p", "value": 1},
                                      format="json").status_code == 403
    assert api("ops").post("/api/v1/priority-classes/", {"name": "urgent", "value": 900},
                           format="json").status_code == 201
    names = [p["name"] for p in api("alpha", "viewer").get("/api/v1/priority-classes/").json()["results"]]
    assert names == ["urgent", "standard"]  # highest value first
    dup = api("ops").post("/api/v1/priority-classes/", {"name": "urgent", "value": 1}, format="json")
    assert dup.status_code == 400 and "name" in dup.json()
    assert NodePool.objects.count() == 0


def test_an_operator_sets_a_cluster_queues_preemption_policies_through_the_api(api):
    """QA (2026-11-28): the policies the cycle reads could only be set in the Django admin (400 unknown field)."""
    from controlplane.quotas.models import ClusterQueue

    body = {"name": "strict", "cohort": "all", "preemption_within_queue": "Never", "reclaim_within_cohort": "Never",
            "quotas": [{"accelerator_type": "nvidia-h100", "nominal_quota": 8}]}
    created = api("ops").post("/api/v1/cluster-queues/", body, format="json")
    assert created.status_code == 201, created.json()
    assert (created.json()["preemption_within_queue"], created.json()["reclaim_within_cohort"]) == ("Never", "Never")
    patched = api("ops").patch("/api/v1/cluster-queues/strict/", {"reclaim_within_cohort": "LowerPriority"},
                               format="json")
    assert patched.status_code == 200 and patched.json()["reclaim_within_cohort"] == "LowerPriority"
    assert patched.json()["preemption_within_queue"] == "Never" and patched.json()["quotas"]  # the rest kept
    bad = api("ops").patch("/api/v1/cluster-queues/strict/", {"preemption_within_queue": "Sometimes"}, format="json")
    assert bad.status_code == 400 and "preemption_within_queue" in bad.json()
    assert ClusterQueue.objects.get(name="strict").preemption_within_queue == "Never"
    default = api("ops").post("/api/v1/cluster-queues/", {"name": "plain"}, format="json").json()
    assert (default["preemption_within_queue"], default["reclaim_within_cohort"]) == ("LowerPriority", "Any")
    assert api("alpha", "admin").patch("/api/v1/cluster-queues/strict/", {"reclaim_within_cohort": "Any"},
                                       format="json").status_code == 403


def test_a_cluster_queue_for_some_teams_takes_only_their_local_queues(api):
    """QA (2026-11-29): any team admin could point a local queue at any cluster queue (`production` included) and so
    use its quota. A cluster queue's `teams` (Kueue's namespaceSelector) say whose queues it takes; none: everyone's."""
    from controlplane.quotas.models import ClusterQueue, LocalQueue

    created = api("ops").post("/api/v1/cluster-queues/", {"name": "prod", "teams": ["alpha"], "quotas": [
        {"accelerator_type": "nvidia-h100", "nominal_quota": 8}]}, format="json")
    assert created.status_code == 201 and created.json()["teams"] == ["alpha"], created.json()
    refused = api("beta", "admin").post("/api/v1/local-queues/", {"name": "sneak", "cluster_queue": "prod"},
                                        format="json")
    assert refused.status_code == 400, refused.json()
    assert "is not open to team beta" in " ".join(refused.json()["cluster_queue"])
    assert "alpha" not in str(refused.json())  # other teams' names are not beta's to see (review)
    seen_by_beta = api("beta", "viewer").get("/api/v1/cluster-queues/prod/").json()
    assert (seen_by_beta["teams"], seen_by_beta["open_to_all_teams"]) == ([], False)
    assert api("alpha", "viewer").get("/api/v1/cluster-queues/prod/").json()["teams"] == ["alpha"]
    assert not LocalQueue.objects.filter(name="sneak").exists()
    mine = api("alpha", "admin").post("/api/v1/local-queues/", {"name": "prod", "cluster_queue": "prod"},
                                      format="json")
    assert mine.status_code == 201, mine.json()
    # leaving alpha out while its queue points here is refused, and nothing changes
    moved = api("ops").patch("/api/v1/cluster-queues/prod/", {"teams": ["beta"]}, format="json")
    assert moved.status_code == 409 and "alpha/prod" in str(moved.json()), moved.json()
    assert list(ClusterQueue.objects.get(name="prod").teams.values_list("name", flat=True)) == ["alpha"]
    widened = api("ops").patch("/api/v1/cluster-queues/prod/", {"teams": ["alpha", "beta"]}, format="json")
    assert widened.status_code == 200 and widened.json()["teams"] == ["alpha", "beta"]
    opened = api("ops").patch("/api/v1/cluster-queues/prod/", {"teams": []}, format="json")
    assert opened.status_code == 200 and opened.json()["teams"] == []
    unknown = api("ops").patch("/api/v1/cluster-queues/prod/", {"teams": ["nobody"]}, format="json")
    assert unknown.status_code == 400 and "teams" in unknown.json()
    assert api("alpha", "admin").patch("/api/v1/cluster-queues/prod/", {"teams": ["alpha"]},
                                       format="json").status_code == 403
    # an open cluster queue (the demo's and the fixture's) still takes every team's queues
    assert api("beta", "admin").post("/api/v1/local-queues/", {"name": "open", "cluster_queue": "shared"},
                                     format="json").status_code == 201


def test_a_cluster_queue_whose_only_team_is_deleted_stays_closed_to_other_teams(api, world):
    """Review (2026-11-29): "open to every team" was read as "names no teams", so deleting the one team a queue was
    for (the Django admin cascades its local queues away) opened that queue's quota to every team."""
    from django.contrib.auth import get_user_model

    from controlplane.quotas.models import ClusterQueue, LocalQueue
    from controlplane.quotas.services import local_queue_create
    from controlplane.tenancy.models import Team
    from controlplane.tenancy.services import team_create

    gamma_admin = get_user_model().objects.create_user("gamma-admin", password="pw-123456789")
    gamma = team_create(actor=world["ops"], name="gamma", admin=gamma_admin)
    created = api("ops").post("/api/v1/cluster-queues/", {"name": "gamma-only", "teams": ["gamma"]}, format="json")
    assert created.status_code == 201 and created.json()["open_to_all_teams"] is False
    local_queue_create(actor=gamma_admin, team=gamma, name="mine",
                       cluster_queue=ClusterQueue.objects.get(name="gamma-only"))
    Team.objects.filter(pk=gamma.pk).delete()  # as the Django admin deletes it
    assert not LocalQueue.objects.filter(name="mine").exists()

    seen = api("ops").get("/api/v1/cluster-queues/gamma-only/").json()
    assert (seen["teams"], seen["open_to_all_teams"]) == ([], False)
    refused = api("beta", "admin").post("/api/v1/local-queues/", {"name": "grab", "cluster_queue": "gamma-only"},
                                        format="json")
    assert refused.status_code == 400 and "is not open to team beta" in str(refused.json()), refused.json()
    assert not LocalQueue.objects.filter(name="grab").exists()
    # an operator opens it on purpose: teams [] (as at creation without teams)
    opened = api("ops").patch("/api/v1/cluster-queues/gamma-only/", {"teams": []}, format="json")
    assert opened.status_code == 200 and opened.json()["open_to_all_teams"] is True
    assert api("beta", "admin").post("/api/v1/local-queues/", {"name": "grab", "cluster_queue": "gamma-only"},
                                     format="json").status_code == 201


def test_a_cluster_queue_with_a_cohort_named_before_the_rule_can_still_be_changed(api, world):
    """Review (2026-11-29): quotas 0005 made a cohort a lowercase name, with no data migration (renaming one could
    merge two cohorts), so every PATCH of a queue whose stored cohort broke the new rule ("GPU_pool", as SQLite and
    PostgreSQL stored it before) was a 400 on cohort, a field the request did not hold: its quotas, teams or description
    could not be changed. The rule applies to a cohort being set."""
    from controlplane.quotas.models import ClusterQueue

    ClusterQueue.objects.filter(name="shared").update(cohort="GPU_pool")  # as an older release stored it
    ops = api("ops")
    changed = ops.patch("/api/v1/cluster-queues/shared/", {"description": "the shared queue"}, format="json")
    assert changed.status_code == 200, changed.json()
    assert ClusterQueue.objects.get(name="shared").description == "the shared queue"
    # setting such a cohort is still refused, naming it
    refused = ops.patch("/api/v1/cluster-queues/shared/", {"cohort": "Other_pool"}, format="json")
    assert refused.status_code == 400 and "cohort" in refused.json(), refused.json()
    renamed = ops.patch("/api/v1/cluster-queues/shared/", {"cohort": "gpu-pool"}, format="json")
    assert renamed.status_code == 200 and renamed.json()["cohort"] == "gpu-pool"
