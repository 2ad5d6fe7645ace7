"""QA of the parallel-strategy planner as users reach it: POST /api/v1/plans/ and training jobs with
`parallelism: auto`. Each test fails on the code before its fix."""

from __future__ import annotations

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
