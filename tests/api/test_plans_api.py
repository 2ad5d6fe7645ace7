"""POST /api/v1/plans/: plan a training run on node pools or hypothetical devices without submitting it,
and the node pools' link bandwidths the plans are built on."""

from __future__ import annotations

import pytest
import yaml
from rest_framework.test import APIClient

from controlplane.cluster.link_defaults import ASSUMED_LINK_GBPS
from controlplane.cluster.models import Node

PLANS = "/api/v1/plans/"


def post(client, body):
    return client.post(PLANS, body, format="json")


# -- plans over the demo cluster's pools -----------------------------------------------------------------------


def test_plan_over_demo_pools_prices_the_best_layout(api, demo_cluster, accel):
    response = post(api("alpha", "viewer"), {"model": "llama2-7b", "global_batch_size": 256,
                                             "pools": [{"pool": "h100-pool"}, {"pool": "a100-pool"}]})
    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["feasible"] is True and body["compare"] is None
    assert body["model"]["preset"] == "llama2-7b" and 6.7e9 < body["model"]["parameters"] < 6.8e9
    pools = {p["name"]: p for p in body["pools"]}
    h100 = pools["h100-pool"]
    assert (h100["source"], h100["nodes"], h100["devices_per_node"], h100["devices"]) == ("node-pool", 2, 8, 16)
    assert h100["intra_node_gbps"] == 450 and h100["inter_node_gbps"] == 50 and h100["link_bandwidth_assumed"]
    assert "assumed default" in h100["link_bandwidth_note"] and h100["simulated"] is True
    assert pools["a100-pool"]["intra_node_gbps"] == 300 and pools["a100-pool"]["achievable_fraction"] == 0.65
    assert any("assumed default" in note for note in body["assumptions"])

    best = body["best"]
    for figure in ("step_time_s", "tokens_per_s", "mfu", "model_tflops_per_device", "memory_gb"):
        assert best[figure] > 0, figure
    assert best["memory_gb"] <= best["memory_limit_gb"] and 0 < best["mfu"] < 1
    assert best["reason"] == body["reason"] and best["description"] in body["reason"]
    assert best["layout"]["devices"] <= 32
    # The price is that of the devices the layout uses, from the accelerator types' list prices.
    prices = {"h100-pool": float(accel["nvidia-h100"].price_per_hour_usd),
              "a100-pool": float(accel["nvidia-a100"].price_per_hour_usd)}
    per_hour = sum(count * prices[pool] for pool, count in best["layout"]["devices_by_pool"].items())
    assert best["cost_per_hour_usd"] == pytest.approx(per_hour, abs=1e-4)
    assert best["cost_per_million_tokens_usd"] == pytest.approx(per_hour / (best["tokens_per_s"] * 3600) * 1e6,
                                                                abs=1e-4)
    assert best["unpriced_accelerator_types"] == []
    # Ranked alternatives: never faster than the best, each priced.
    assert body["alternatives"]
    times = [best["step_time_s"]] + [alt["step_time_s"] for alt in body["alternatives"]]
    assert times == sorted(times)
    assert all(alt["cost_per_hour_usd"] is not None for alt in body["alternatives"])


def test_compare_shows_each_type_alone_beside_the_mix(api, demo_cluster):
    response = post(api("beta", "member"), {"model": "llama2-7b", "global_batch_size": 256, "compare": True,
                                            "pools": [{"pool": "h100-pool"}, {"pool": "a100-pool"}]})
    assert response.status_code == 200, response.json()
    body = response.json()
    compare = body["compare"]
    rows = {row["accelerator_type"]: row for row in compare["by_type"]}
    assert set(rows) == {"nvidia-a100", "nvidia-h100"}
    assert rows["nvidia-h100"]["pools"] == ["h100-pool"] and rows["nvidia-h100"]["devices"] == 16
    for row in rows.values():
        assert row["feasible"] and row["best"]["cost_per_million_tokens_usd"] > 0
        assert set(row["best"]["layout"]["devices_by_pool"]) == set(row["pools"])  # planned alone
        # The mix searches every single-type layout too, so it is never slower by its own model.
        assert row["step_time_ratio_to_mix"] >= 1.0
        assert row["step_time_ratio_to_mix"] == pytest.approx(row["best"]["step_time_s"]
                                                              / body["best"]["step_time_s"], rel=1e-3)
    # 16 H100s (989 TFLOPS each) outrun 16 A100s (312).
    assert compare["fastest_single_type"] == "nvidia-h100"
    assert rows["nvidia-a100"]["step_time_ratio_to_mix"] > rows["nvidia-h100"]["step_time_ratio_to_mix"]
    assert compare["mix_speedup_over_fastest_single_type"] == rows["nvidia-h100"]["step_time_ratio_to_mix"]
    assert compare["cheapest_single_type"] in rows


def test_fewer_devices_than_the_pool_has(api, demo_cluster):
    client = api("alpha", "viewer")
    body = post(client, {"model": "llama2-7b", "global_batch_size": 64,
                         "pools": [{"pool": "h100-pool", "devices": 8}]}).json()
    assert (body["pools"][0]["nodes"], body["pools"][0]["devices"]) == (1, 8)
    assert body["best"]["layout"]["devices"] <= 8
    part = post(client, {"model": "llama2-7b", "global_batch_size": 64, "pools": [{"pool": "h100-pool", "devices": 4}]})
    assert part.status_code == 200 and part.json()["pools"][0]["devices_per_node"] == 4
    for devices, words in ((12, "whole nodes"), (32, "has 16 devices")):
        bad = post(client, {"model": "llama2-7b", "global_batch_size": 64,
                            "pools": [{"pool": "h100-pool", "devices": devices}]})
        assert bad.status_code == 400 and words in bad.json()["pools"][0], bad.json()


def test_only_ready_nodes_count(api, demo_cluster):
    Node.objects.filter(name="h100-pool-0").update(cordoned=True)
    body = post(api("alpha", "viewer"), {"model": "llama2-7b", "global_batch_size": 64,
                                         "pools": [{"pool": "h100-pool"}]}).json()
    assert body["pools"][0]["devices"] == 8
    Node.objects.filter(pool__name="h100-pool").update(health="unreachable")
    response = post(api("alpha", "viewer"), {"model": "llama2-7b", "global_batch_size": 64,
                                             "pools": [{"pool": "h100-pool"}]})
    assert response.status_code == 400 and "no healthy, uncordoned nodes" in response.json()["pools"][0]


# -- hypothetical clusters ---------------------------------------------------------------------------------------


def test_hypothetical_h100_vs_a100_vs_mix(api, world):
    body = {"model": {"preset": "llama2-70b", "seq_len": 2048}, "global_batch_size": 512, "compare": True,
            "devices": [{"accelerator_type": "nvidia-h100", "count": 64},
                        {"accelerator_type": "nvidia-a100", "count": 64, "devices_per_node": 8}]}
    response = post(api("alpha", "member"), body)
    assert response.status_code == 200, response.json()
    answer = response.json()
    assert answer["model"]["name"] == "Llama-2 70B" and answer["model"]["seq_len"] == 2048
    assert [(p["name"], p["source"], p["nodes"]) for p in answer["pools"]] == [
        ("nvidia-h100", "hypothetical", 8), ("nvidia-a100", "hypothetical", 8)]
    assert answer["pools"][0]["simulated"] is None
    assert answer["feasible"] and answer["best"]["cost_per_hour_usd"] > 0
    rows = {row["accelerator_type"]: row for row in answer["compare"]["by_type"]}
    assert rows["nvidia-h100"]["devices"] == 64 and rows["nvidia-a100"]["devices"] == 64
    assert answer["compare"]["mix_speedup_over_fastest_single_type"] >= 1.0
    assert all(row["cost_per_million_tokens_ratio_to_mix"] > 0 for row in rows.values())


def test_request_bandwidths_replace_the_assumed_defaults(api, world):
    client = api("alpha", "viewer")
    no_default = post(client, {"model": "llama2-7b", "global_batch_size": 64,
                               "devices": [{"accelerator_type": "nvidia-l40s", "count": 16}]})
    assert no_default.status_code == 400
    assert "inter_node_gbps unknown" in no_default.json()["devices"][0]
    given = post(client, {"model": "llama2-7b", "global_batch_size": 64,
                          "devices": [{"accelerator_type": "nvidia-l40s", "count": 16, "inter_node_gbps": 12.5}]})
    assert given.status_code == 200, given.json()
    pool = given.json()["pools"][0]
    assert pool["inter_node_gbps"] == 12.5 and pool["intra_node_gbps"] == ASSUMED_LINK_GBPS["nvidia-l40s"][
        "intra_node_gbps"]
    assert "inter_node_gbps set by the request" in pool["link_bandwidth_note"] and pool["link_bandwidth_assumed"]


def test_one_node_needs_no_bandwidth_between_nodes(api, world):
    """One node of 8 L40S (intra_node_gbps assumed, no inter-node default) was refused for lack of inter_node_gbps,
    though one node has no traffic between nodes (found by QA)."""
    answer = post(api("alpha", "viewer"), {"model": "llama2-7b", "global_batch_size": 64,
                                            "devices": [{"accelerator_type": "nvidia-l40s", "count": 8}]})
    assert answer.status_code == 200, answer.json()
    assert "one node: no traffic between nodes" in answer.json()["pools"][0]["link_bandwidth_note"]
    # beside another entry its node talks to the other's (a review found two entries of 8 planned as a pipeline over
    # an invented inter-node figure)
    two = post(api("alpha", "viewer"), {"model": "llama2-7b", "global_batch_size": 64,
                                         "devices": [{"accelerator_type": "nvidia-l40s", "count": 8},
                                                     {"accelerator_type": "nvidia-l40s", "count": 8}]})
    assert two.status_code == 400 and "give intra_node_gbps and inter_node_gbps" in str(two.json()["devices"])


def test_unknown_price_gives_null_costs_never_a_guess(api, world, accel):
    accel["nvidia-a100"].price_per_hour_usd = None
    accel["nvidia-a100"].save()
    body = post(api("alpha", "viewer"), {"model": "llama2-7b", "global_batch_size": 64, "compare": True,
                                         "devices": [{"accelerator_type": "nvidia-a100", "count": 8},
                                                     {"accelerator_type": "nvidia-h100", "count": 8}]}).json()
    rows = {row["accelerator_type"]: row for row in body["compare"]["by_type"]}
    a100 = rows["nvidia-a100"]["best"]
    assert a100["cost_per_hour_usd"] is None and a100["cost_per_million_tokens_usd"] is None
    assert a100["unpriced_accelerator_types"] == ["nvidia-a100"]
    assert rows["nvidia-h100"]["best"]["cost_per_hour_usd"] == pytest.approx(8 * 3.99)
    assert body["pools"][0]["price_per_hour_usd"] is None
    assert any("no known price for nvidia-a100" in note for note in body["assumptions"])
    assert body["compare"]["cheapest_single_type"] == "nvidia-h100"


# -- infeasible is an answer -------------------------------------------------------------------------------------


def test_infeasible_request_is_an_answer_with_its_reason(api, demo_cluster):
    client = api("alpha", "viewer")
    response = post(client, {"model": "gpt3-175b", "global_batch_size": 1536, "compare": True,
                             "pools": [{"pool": "h100-pool"}, {"pool": "a100-pool"}]})
    assert response.status_code == 200
    body = response.json()
    assert body["feasible"] is False and body["best"] is None and body["alternatives"] == []
    assert "device memory" in body["reason"] and "TB" in body["reason"]
    assert all(not row["feasible"] and row["step_time_ratio_to_mix"] is None for row in body["compare"]["by_type"])
    assert body["compare"]["fastest_single_type"] is None
    assert body["compare"]["mix_speedup_over_fastest_single_type"] is None

    fp8 = post(client, {"model": {"preset": "llama2-7b", "precision": "fp8"}, "global_batch_size": 64,
                        "pools": [{"pool": "a100-pool"}]}).json()
    assert fp8["feasible"] is False and "no pool can run fp8" in fp8["reason"]


# -- malformed input is a 400 naming the field ------------------------------------------------------------------

GOOD = {"model": "llama2-7b", "global_batch_size": 64, "pools": [{"pool": "h100-pool"}]}


@pytest.mark.parametrize(("change", "field", "words"), [
    ({"global_batch": 64}, "global_batch", "unknown field"),
    ({"pools": [{"pool": "h100-pool", "gpus": 8}]}, "pools", None),
    ({"model": {"layers": 0, "hidden": 4096, "heads": 32, "seq_len": 2048, "vocab": 32000}}, "model", "layers"),
    ({"model": {"layerz": 32, "hidden": 4096, "heads": 32, "seq_len": 2048, "vocab": 32000}}, "model", "layerz"),
    ({"model": {"hidden": 4096, "heads": 32, "seq_len": 2048, "vocab": 32000}}, "model", "'layers' is required"),
    ({"model": {"preset": "llama2-70b", "kv_heads": 7}}, "model", "kv_heads"),
    ({"model": "gpt-5"}, "model", "unknown model preset"),
    ({"model": 7}, "model", "preset name or an object"),
    ({"global_batch_size": 0}, "global_batch_size", None),
    ({"pools": [{"pool": "tpu-pool"}]}, "pools", "unknown node pool 'tpu-pool'"),
    ({"pools": [{"pool": "h100-pool"}, {"pool": "h100-pool"}]}, "pools", "listed twice"),
    ({"pools": [{"pool": "p800-pool"}]}, "pools", "no published bf16_dense_tflops"),
    ({"pools": [], "devices": [{"accelerator_type": "tpu-v5", "count": 8}]}, "devices",
     "unknown accelerator type 'tpu-v5'"),
    ({"pools": [], "devices": [{"accelerator_type": "nvidia-h100", "count": 12}]}, "devices", "whole nodes"),
    ({"pools": [], "devices": [{"accelerator_type": "cpu", "count": 8}]}, "devices", "no published"),
    ({"pools": []}, "pools", "hypothetical devices"),
    ({"pools": [{"pool": "h100-pool"}, {"pool": "a100-pool"}, {"pool": "p800-pool"}]}, "pools", "at most 2"),
    ({"options": {"max_micro_batch": 0}}, "options", None),
    ({"options": {"zero": True}}, "options", None),
])
def test_malformed_input_is_a_400_naming_the_field(api, demo_cluster, change, field, words):
    response = post(api("alpha", "viewer"), {**GOOD, **change})
    assert response.status_code == 400, response.json()
    body = response.json()
    assert field in body, body
    if words:
        assert words in str(body[field]), body


def test_more_pools_when_the_mixed_search_is_off(api, demo_cluster):
    body = {**GOOD, "pools": [{"pool": "h100-pool"}, {"pool": "a100-pool"}],
            "devices": [{"accelerator_type": "nvidia-h200", "count": 8}], "options": {"allow_heterogeneous": False}}
    response = post(api("alpha", "viewer"), body)
    assert response.status_code == 200, response.json()
    assert not any(len(set(s["pool"] for s in alt["layout"]["stages"])) > 1
                   for alt in [response.json()["best"], *response.json()["alternatives"]])


def test_signed_in_users_only(api, world):
    assert post(APIClient(), GOOD).status_code in (401, 403)
    assert post(api("ops"), {**GOOD, "pools": [], "devices": [{"accelerator_type": "nvidia-h100",
                                                               "count": 8}]}).status_code == 200


# -- node pools carry their link bandwidths ---------------------------------------------------------------------


def test_node_pools_show_own_or_assumed_link_bandwidths(api, demo_cluster):
    client = api("ops")
    body = {"name": "h100-ib", "accelerator_type": "nvidia-h100", "devices_per_node": 8, "simulated": True,
            "inter_node_gbps": 100.0}
    created = client.post("/api/v1/node-pools/", body, format="json")
    assert created.status_code == 201, created.json()
    pool = created.json()
    assert pool["inter_node_gbps"] == 100 and pool["intra_node_gbps"] is None
    assert (pool["effective_intra_node_gbps"], pool["effective_inter_node_gbps"]) == (450, 100)
    assert pool["link_bandwidth_assumed"] is True and "inter_node_gbps set by the pool" in pool["link_bandwidth_note"]

    pools = {p["name"]: p for p in api("alpha", "viewer").get("/api/v1/node-pools/").json()["results"]}
    a100 = pools["a100-pool"]
    assert a100["intra_node_gbps"] is None and a100["effective_intra_node_gbps"] == 300
    assert a100["effective_inter_node_gbps"] == 25 and a100["link_bandwidth_assumed"] is True
    p800 = pools["p800-pool"]
    assert p800["effective_intra_node_gbps"] is None and "no assumed default for kunlun-p800" in p800[
        "link_bandwidth_note"]

    bad = client.post("/api/v1/node-pools/", {**body, "name": "h100-bad", "intra_node_gbps": 0}, format="json")
    assert bad.status_code == 400 and "intra_node_gbps" in bad.json()


def test_a_pools_own_bandwidth_reaches_the_plan(api, demo_cluster, world, accel):
    from controlplane.cluster.services import node_pool_create

    pool = node_pool_create(actor=world["ops"], name="h100-fast", accelerator_type=accel["nvidia-h100"],
                            devices_per_node=8, simulated=True, intra_node_gbps=450.0, inter_node_gbps=100.0)
    Node.objects.create(pool=pool, name="h100-fast-0", capacity_devices=8, free_devices=8)
    body = post(api("alpha", "viewer"), {**GOOD, "pools": [{"pool": "h100-fast"}]}).json()
    assert body["pools"][0]["inter_node_gbps"] == 100 and body["pools"][0]["link_bandwidth_assumed"] is False
    assert body["pools"][0]["link_bandwidth_note"] == "intra_node_gbps and inter_node_gbps set by the pool"


def test_schema_documents_plans(api):
    schema = yaml.safe_load(api("alpha", "viewer").get("/api/v1/schema/").content)
    operation = schema["paths"]["/api/v1/plans/"]["post"]
    assert operation["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith("/PlanResult")
    assert "intra_node_gbps" in schema["components"]["schemas"]["NodePool"]["properties"]


def test_a_plan_may_recompute_only_the_layer_norms(api, world):
    """Llama 3 70B on 32 hypothetical H100s: without recomputation the layouts that rank first need more than
    the device holds, and recomputing the two norms of each layer (cheap, memory-bound) is enough."""
    response = post(api("alpha", "member"), {"model": "llama3-70b", "global_batch_size": 256,
                                             "devices": [{"accelerator_type": "nvidia-h100", "count": 32}]})
    assert response.status_code == 200, response.json()
    best = response.json()["best"]
    assert best["layout"]["recompute"] == "norms"
    assert "layer-norm recompute" in best["description"]
    assert "layer-norm recompute because without recomputation it would need" in best["reason"]
    assert best["memory_gb"] <= best["memory_limit_gb"]
    # Software that fuses each norm into the next linear layer cannot recompute the norms alone.
    fused = post(api("alpha", "member"), {"model": "llama3-70b", "global_batch_size": 256,
                                          "options": {"allow_norm_recompute": False},
                                          "devices": [{"accelerator_type": "nvidia-h100", "count": 32}]})
    assert fused.status_code == 200, fused.json()
    answer = fused.json()
    assert all(plan["layout"]["recompute"] != "norms" for plan in [answer["best"], *answer["alternatives"]])
    assert answer["best"]["step_time_s"] > best["step_time_s"]


def test_a_jobs_model_that_is_neither_a_name_nor_fields_says_both_are_taken(api, world):
    """parallelism.model: 5 said "model must be an object, got int", though a preset name is taken too (QA)."""
    client = api("alpha", "member")
    body = {"name": "m", "queue": "default", "accelerator_types": ["nvidia-h100"], "devices_per_worker": 8,
            "parallelism": {"mode": "auto", "model": 5, "global_batch_size": 64}}
    answer = client.post("/api/v1/training-jobs/", body, format="json")
    assert answer.status_code == 400
    assert "model: give a preset name or an object of model fields, got int" in str(answer.json()["parallelism"])
