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

