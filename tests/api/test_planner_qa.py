"""QA of the parallel-strategy planner as users reach it: POST /api/v1/plans/ and training jobs with
`parallelism: auto`. Each test fails on the code before its fix."""

from __future__ import annotations

from controlplane.cluster.selectors import never_hold_reason
from jobs.models import TrainingJob

PLANS = "/api/v1/plans/"


def test_the_plan_answer_keeps_zero2_and_dropout_the_cost_model_planned_with(api, world):
    """The answer's layout lost `shard_gradients` and its model lost `dropout` (the response serializer left them
    out): a ZeRO-2 best read `"zero": true` only, so its fields said ZeRO-1 where its description said ZeRO-2, and a
    client rebuilding the layout from them got another memory figure."""
    body = {"model": {"preset": "llama2-7b", "dropout": True}, "global_batch_size": 64,
            "devices": [{"accelerator_type": "nvidia-h100", "count": 16}]}
    response = api("alpha", "member").post(PLANS, body, format="json")
    assert response.status_code == 200, response.json()
    answer = response.json()
    assert answer["model"]["dropout"] is True
    best = answer["best"]
    assert "ZeRO-2" in best["description"], best["description"]  # the case the fields must tell apart
    assert best["layout"]["zero"] is True and best["layout"]["shard_gradients"] is True, best["layout"]
    for prediction in [best, *answer["alternatives"]]:
        assert prediction["layout"]["shard_gradients"] == ("ZeRO-2" in prediction["description"]), prediction


def test_an_expert_parallel_layout_makes_the_gang_non_elastic(demo_cluster):
    """An elastic job (1..32 workers x 1 H100) planned Mixtral as DP32 x EP4: each EP rank holds a quarter of the
    experts, so the layout needs its devices in groups of 4, yet the gang was left elastic (28..32 workers), where 29,
    30 or 31 workers can run no EP4 layout at all. Expert parallelism is model parallelism: all of the gang."""
    from jobs.planning import gang_size_from_plan, plan_job_parallelism

    plan = plan_job_parallelism(parallelism={"mode": "auto", "model": "mixtral-8x7b", "global_batch_size": 64},
                                accelerator_types=["nvidia-h100"], workers=32, devices_per_worker=1)
    h100 = plan["by_type"]["nvidia-h100"]
    assert (h100["tp"], h100["pp"]) == (1, 1) and h100["ep"] > 1, h100["description"]  # the case in question
    assert plan["model_parallel"] is True
    assert gang_size_from_plan(plan, workers_min=1, workers_max=32, devices_per_worker=1) == (32, 32)


def test_a_model_parallel_plan_says_why_it_fixed_an_elastic_gang(api, demo_cluster):
    """An elastic job (1..8 workers x 8 H100, Llama-2 7B, global batch 8) was planned at 64 devices as DP2 x TP8 x PP4
    and silently became a fixed gang of 8 workers: the plan said nothing of it (only a data-parallel job's raised
    minimum was noted), and the dry run answered that it can never run ("it needs 8") with no word of why 8."""
    from jobs.planning import gang_size_from_plan, plan_job_parallelism

    plan = plan_job_parallelism(parallelism={"mode": "auto", "model": "llama2-7b", "global_batch_size": 8},
                                accelerator_types=["nvidia-h100"], workers=8, devices_per_worker=8)
    h100 = plan["by_type"]["nvidia-h100"]
    assert plan["model_parallel"] and h100["tp"] * h100["pp"] > 1, h100["description"]  # the case in question
    assert gang_size_from_plan(plan, workers_min=1, workers_max=8, devices_per_worker=8) == (8, 8)
    assert plan["min_workers_by_plan"] == (
        f"the best layout on nvidia-h100 (DP{h100['dp']} x TP{h100['tp']} x PP{h100['pp']}) splits the model over its "
        "devices, so the gang is not elastic: it starts at 8 workers, not 1")
    fixed = plan_job_parallelism(parallelism={"mode": "auto", "model": "llama2-7b", "global_batch_size": 8},
                                 accelerator_types=["nvidia-h100"], workers=8, devices_per_worker=8)
    gang_size_from_plan(fixed, workers_min=8, workers_max=8, devices_per_worker=8)
    assert "min_workers_by_plan" not in fixed  # asked for a fixed gang: nothing changed, nothing to say

    spec = ("name: planned\nqueue: default\nworkers: 1-8\nresources:\n  accelerators: H100:8\n"
            "parallelism: {mode: auto, model: llama2-7b, global_batch_size: 8}\n")
    response = api("alpha", "member").post("/api/v1/specs/apply/?dry_run=1", {"spec": spec}, format="json")
    assert response.status_code == 200, response.json()
    shown = response.json()["plan"]
    # (planned as the submit plans it: the two 8-device nodes hold 2 workers, so the gang is 2, and the notes say why)
    assert shown["members"] == 2, shown
    assert any(note.endswith("so the gang is not elastic: it starts at 2 workers, not 1") for note in shown["notes"])
    assert any(note.startswith("no accepted type's nodes could ever hold 8 workers") for note in shown["notes"])


def test_a_one_node_pool_alone_needs_no_inter_node_figure(api, world, accel):
    """A node pool of one L40S node (no assumed inter-node bandwidth) alone in a request was refused ("has no link
    bandwidth to plan with"), while the same 8 L40S as hypothetical devices planned, and so did a job of one worker on
    that pool: one node talks to no other node. Beside another entry a pipeline may cross nodes: still refused."""
    from controlplane.cluster.models import Node
    from controlplane.cluster.services import node_pool_create

    pool = node_pool_create(actor=world["ops"], name="l40s-pool", accelerator_type=accel["nvidia-l40s"],
                            devices_per_node=8, simulated=True)
    Node.objects.create(pool=pool, name="l40s-0", capacity_devices=8, free_devices=8)
    client = api("alpha", "member")
    for pools in ([{"pool": "l40s-pool"}], [{"pool": "l40s-pool", "devices": 4}]):
        response = client.post(PLANS, {"model": "llama2-7b", "global_batch_size": 8, "pools": pools}, format="json")
        assert response.status_code == 200, response.json()
        answer = response.json()
        assert answer["feasible"], answer["reason"]
        planned = answer["pools"][0]
        assert planned["nodes"] == 1 and planned["intra_node_gbps"] == planned["inter_node_gbps"] == 32.0, planned
        assert "one node: no traffic between nodes" in planned["link_bandwidth_note"], planned
    mixed = client.post(PLANS, {"model": "llama2-7b", "global_batch_size": 8, "pools": [{"pool": "l40s-pool"}],
                                "devices": [{"accelerator_type": "nvidia-h100", "count": 8}]}, format="json")
    assert mixed.status_code == 400 and "has no link bandwidth to plan with" in mixed.json()["pools"][0], mixed.json()


AUTO_7B = {"mode": "auto", "model": "llama2-7b", "global_batch_size": 8}


def test_an_elastic_model_parallel_job_is_planned_at_the_widest_gang_its_nodes_could_hold(api, demo_cluster):
    """An elastic job (1..8 workers x 8 H100, Llama-2 7B, global batch 8) was planned at workers_max (64 devices, DP2 x
    TP8 x PP4) and became a fixed gang of 8 workers, where the two 8-device H100 nodes could never hold more than 2:
    it waited for good, as the dry run said. It is planned at 2 workers now, the widest gang from workers_min those
    nodes could hold, and the plan says why; with no width in range that fits (3..8), the plan at workers_max
    stands."""
    client = api("alpha", "member")
    body = {"name": "wide", "queue": "default", "accelerator_types": ["nvidia-h100"], "workers_min": 1,
            "workers_max": 8, "devices_per_worker": 8, "parallelism": AUTO_7B}
    response = client.post("/api/v1/training-jobs/", body, format="json")
    assert response.status_code == 201, response.json()
    job = TrainingJob.objects.get(pk=response.json()["id"])
    plan = job.parallel_plan
    h100 = plan["by_type"]["nvidia-h100"]
    assert h100["tp"] * h100["pp"] * h100["ep"] > 1, h100["description"]  # still model parallel: a fixed gang
    assert (job.workers_min, job.workers_max) == (2, 2) and plan["devices"] == h100["devices"] == 16, plan
    assert plan["sized_by_plan"] == ("no accepted type's nodes could ever hold 8 workers of 8 devices, even all in "
                                     "service with nothing running: planned at 2 workers, the most the nvidia-h100 "
                                     "nodes could hold")
    assert plan["min_workers_by_plan"].endswith("so the gang is not elastic: it starts at 2 workers, not 1")
    assert never_hold_reason(accelerator_type="nvidia-h100", units=8, members=job.workers_min) == ""

    none_fits = client.post("/api/v1/training-jobs/", {**body, "name": "none-fits", "workers_min": 3},
                            format="json")
    assert none_fits.status_code == 201, none_fits.json()
    job = TrainingJob.objects.get(pk=none_fits.json()["id"])
    assert (job.workers_min, job.workers_max) == (8, 8) and job.parallel_plan["devices"] == 64
    assert "sized_by_plan" not in job.parallel_plan, job.parallel_plan["sized_by_plan"]
