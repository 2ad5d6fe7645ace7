"""Planner input limits through the API (from a QA review): POST /api/v1/plans/ and a training job's
`parallelism: auto` refuse a model too large to compute with (hidden 1e300 was a 500), a job's global batch over the
endpoint's cap, and job options the endpoint would refuse (read as the endpoint reads them); hypothetical device
groups get names no node pool has."""

from __future__ import annotations

import pytest

from controlplane.cluster import plans
from controlplane.cluster.services import node_pool_create, nodes_sync
from controlplane.common.errors import ValidationFailed
from controlplane.compute.base import ObservedNode
from jobs.models import TrainingJob
from tests.conftest import JOB_BODY

PLANS = "/api/v1/plans/"
JOBS = "/api/v1/training-jobs/"
H100 = {"accelerator_type": "nvidia-h100", "count": 8}
HUGE = {"layers": 1, "hidden": 1e300, "heads": 1, "seq_len": 1, "vocab": 1}


def plan_post(client, body):
    return client.post(PLANS, body, format="json")


def job_post(client, parallelism, **overrides):
    body = {**JOB_BODY, "name": "planned", "accelerator_types": ["nvidia-h100"], "workers_min": 1, "workers_max": 1,
            "hyperparameters": {"steps": 10}, "parallelism": {"mode": "auto", **parallelism}, **overrides}
    return client.post(JOBS, body, format="json")


# -- the plan endpoint --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("model", "field"), [
    (HUGE, "hidden"),
    ({**HUGE, "hidden": 10**160}, "hidden"),
    ({"layers": 2_000_000, "hidden": 8, "heads": 1, "seq_len": 8, "vocab": 8, "learned_positions": False}, "layers"),
    ({"layers": 2, "hidden": 8, "heads": 1, "seq_len": 10**9, "vocab": 8}, "seq_len"),
    ({"layers": 2, "hidden": 64, "heads": 4, "seq_len": 64, "vocab": 100, "experts": 1_000_000, "top_k": 2},
     "experts"),
    ({"preset": "llama2-7b", "num_hidden_layers": 5000}, "layers"),
])
def test_plans_refuse_a_model_over_the_limits_naming_the_field(api, demo_cluster, model, field):
    response = plan_post(api("alpha", "viewer"), {"model": model, "global_batch_size": 8, "devices": [H100]})
    assert response.status_code == 400, response.content[:300]
    message = response.json()["model"][0]
    assert message.startswith(f"{field} must be at most "), message
    assert len(message) < 120  # not hundreds of digits


@pytest.mark.parametrize(("model", "words"), [
    ({"layers": 2, "hidden": 128, "hidden_size": 64, "heads": 4, "seq_len": 64, "vocab": 100},
     "'hidden' and 'hidden_size' both give hidden"),
    ({"layers": 2, "hidden": 96, "heads": 12, "experts": 1, "top_k": 2, "seq_len": 128, "vocab": 100},
     "top_k (2) applies only to a mixture of experts"),
    ({"layers": 2, "hidden": 96, "heads": 12, "experts": 0, "top_k": 7, "seq_len": 128, "vocab": 100},
     "top_k (7) applies only to a mixture of experts"),
    ({"layers": 2, "hidden": 96, "heads": 12, "experts": 4, "top_k": 8, "seq_len": 128, "vocab": 100},
     "top_k (8) must not exceed experts (4)"),
])
def test_plans_refuse_conflicting_names_and_a_top_k_that_cannot_apply(api, demo_cluster, model, words):
    response = plan_post(api("alpha", "viewer"), {"model": model, "global_batch_size": 8, "devices": [H100]})
    assert response.status_code == 400 and words in response.json()["model"][0], response.json()


def test_hypothetical_groups_get_names_no_node_pool_has(api, demo_cluster, world, accel):
    node_pool_create(actor=world["ops"], name="nvidia-h100-1", accelerator_type=accel["nvidia-h100"],
                     devices_per_node=8, simulated=True)
    nodes_sync(observed=[ObservedNode(node_id="x1", name="nvidia-h100-1-0", pool="nvidia-h100-1",
                                      accelerator_type="nvidia-h100", leaf_group="lg-x", alive=True, simulated=True,
                                      capacity={"accel:nvidia-h100": 8}, free={"accel:nvidia-h100": 8})])
    response = plan_post(api("alpha", "viewer"), {
        "model": "llama2-7b", "global_batch_size": 64, "pools": [{"pool": "nvidia-h100-1"}],
        "devices": [H100, H100], "options": {"allow_heterogeneous": False}})
    assert response.status_code == 200, response.json()
    pools = [(p["name"], p["source"]) for p in response.json()["pools"]]
    assert pools == [("nvidia-h100-1", "node-pool"), ("nvidia-h100", "hypothetical"),
                     ("nvidia-h100-2", "hypothetical")]


def test_a_pool_problem_is_not_filed_under_global_batch_size(db, accel, monkeypatch):
    # Names are unique now; were they not, the error names the devices, not the batch.
    monkeypatch.setattr(plans, "_free_name", lambda slug, index, taken: slug)
    with pytest.raises(ValidationFailed) as caught:
        plans.plan_estimate(model="llama2-7b", global_batch_size=8, devices=[H100, H100])
    assert caught.value.field == "devices" and "names must be unique" in caught.value.message


# -- a training job's parallelism: auto ----------------------------------------------------------------------------


def test_a_job_with_a_model_over_the_limits_is_a_400_naming_the_field(api, demo_cluster):
    response = job_post(api("alpha", "member"), {"model": HUGE, "global_batch_size": 8})
    assert response.status_code == 400, response.content[:300]
    assert response.json()["parallelism"][0].startswith("model: hidden must be at most 1,000,000")
    assert not TrainingJob.objects.exists()


def test_a_job_global_batch_over_the_endpoints_cap_is_refused(api, demo_cluster):
    client = api("alpha", "member")
    response = job_post(client, {"model": "llama2-7b", "global_batch_size": 10**13})
    assert response.status_code == 400
    assert response.json()["parallelism"] == [
        "global_batch_size: must be at most 10,000,000 sequences per step, got 10,000,000,000,000"]
    assert job_post(client, {"model": "llama2-7b", "global_batch_size": plans.MAX_GLOBAL_BATCH_SIZE + 1}
                    ).status_code == 400
    endpoint = plan_post(client, {"model": "llama2-7b", "global_batch_size": plans.MAX_GLOBAL_BATCH_SIZE + 1,
                                  "devices": [H100]})
    assert endpoint.status_code == 400 and "global_batch_size" in endpoint.json()


@pytest.mark.parametrize(("options", "words"), [
    ({"flash_attention": "maybe"}, "options.flash_attention: Must be a valid boolean."),
    ({"max_alternatives": 10**6}, "options.max_alternatives: "),
    ({"max_micro_batch": 0}, "options.max_micro_batch: "),
    ({"bogus": 1}, "options.bogus: unknown field"),
    ("fast", "options: Invalid data. Expected a dictionary"),
    ([1], "options: Invalid data. Expected a dictionary"),
])
def test_job_options_are_validated_like_the_endpoints(api, demo_cluster, options, words):
    client = api("alpha", "member")
    response = job_post(client, {"model": "llama2-7b", "global_batch_size": 64, "options": options})
    assert response.status_code == 400, response.content[:300]
    message = response.json()["parallelism"][0]
    assert message.startswith(words), message
    assert "PlanOptions" not in message and "dictionary update" not in message
    # the endpoint refuses the same options
    assert plan_post(client, {"model": "llama2-7b", "global_batch_size": 64, "devices": [H100],
                              "options": options}).status_code == 400


def test_job_option_strings_read_as_the_endpoint_reads_them(api, demo_cluster):
    client = api("alpha", "member")
    # GPT-3's layers at 8K sequences: without FlashAttention the s x s scores change the plan's memory.
    model = {"preset": "gpt3-175b", "layers": 8, "seq_len": 8192}
    stored = {}
    for index, flash in enumerate((True, False, "no")):
        response = job_post(client, {"model": model, "global_batch_size": 64, "options": {"flash_attention": flash}},
                            name=f"flash-{index}")
        assert response.status_code == 201, response.json()
        stored[flash] = TrainingJob.objects.get(pk=response.json()["id"]).parallel_plan["by_type"]["nvidia-h100"]
    assert stored["no"]["memory_gb"] == stored[False]["memory_gb"] != stored[True]["memory_gb"]
    assert stored["no"]["description"] == stored[False]["description"]
    endpoint = plan_post(client, {"model": model, "global_batch_size": 64, "devices": [H100],
                                  "options": {"flash_attention": "no"}}).json()
    assert endpoint["best"]["memory_gb"] == pytest.approx(stored["no"]["memory_gb"])


def test_a_gang_of_workers_that_do_not_fill_whole_nodes_can_be_planned(api, demo_cluster):
    """QA found 3 x 4 H100 with parallelism auto refused: "12 devices is neither whole nodes of 8 nor at most one
    node" (about a devices[0] the user never sent). Such workers may land on as many nodes as there are workers, so
    the plan takes them as such: tensor parallelism at most a worker's devices."""
    body = {**JOB_BODY, "name": "three-by-four", "accelerator_types": ["nvidia-h100"], "workers_min": 3,
            "workers_max": 3, "devices_per_worker": 4,
            "parallelism": {"mode": "auto", "model": "llama2-7b", "global_batch_size": 64}}
    response = api("alpha", "member").post(JOBS, body, format="json")
    assert response.status_code == 201, response.json()
    plan = TrainingJob.objects.get(pk=response.json()["id"]).parallel_plan["by_type"]["nvidia-h100"]
    assert plan["tp"] <= 4, plan


def test_the_dry_run_plan_shows_and_checks_a_parallelism_auto_job(api, demo_cluster):
    """QA found the dry run of a parallelism auto job saying "fits now: yes" for a model no accepted type could run
    (the apply then failed), and never showing the layout. The dry run now plans it as the submit does."""
    client = api("alpha", "member")
    spec = ("name: planned\nqueue: default\nworkers: 1\nresources:\n  accelerators: H100:8\n"
            "parallelism: {{mode: auto, model: {model}, global_batch_size: 64}}\n")
    response = client.post("/api/v1/specs/apply/?dry_run=1", {"spec": spec.format(model="llama2-7b")}, format="json")
    assert response.status_code == 200, response.json()
    shown = response.json()["plan"]["parallel_plan"]["nvidia-h100"]
    assert shown["tp"] * shown["pp"] * shown["dp"] <= 8 and shown["tokens_per_s"] > 0
    refused = client.post("/api/v1/specs/apply/?dry_run=1", {"spec": spec.format(model="gpt3-175b")}, format="json")
    assert refused.status_code == 400, refused.json()
    assert "no accepted accelerator type can run this model" in str(refused.json())
    assert not TrainingJob.objects.exists()


def test_a_job_global_batch_of_an_integral_float_is_taken_as_the_endpoint_takes_it(api, demo_cluster):
    """QA: `global_batch_size: 64.0` was refused on the job path and accepted by POST /api/v1/plans/."""
    body = {**JOB_BODY, "name": "float-batch"}
    body.update(accelerator_types=["nvidia-h100"], workers_min=1, workers_max=1, devices_per_worker=8,
                parallelism={"mode": "auto", "model": "llama2-7b", "global_batch_size": 64.0})
    response = api("alpha", "member").post(JOBS, body, format="json")
    assert response.status_code == 201, response.json()
    assert TrainingJob.objects.get(pk=response.json()["id"]).parallel_plan["global_batch_size"] == 64
    body["parallelism"] = {"mode": "auto", "model": "llama2-7b", "global_batch_size": 64.5}
    body["name"] = "half-batch"
    refused = api("alpha", "member").post(JOBS, body, format="json")
    assert refused.status_code == 400 and "global_batch_size: must be a positive integer" in str(refused.json())
