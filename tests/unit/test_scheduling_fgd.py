"""FGD fragmentation measure and node scoring (controlplane.scheduling.fgd), and a smoke run of benchmarks.openb."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from controlplane.scheduling.fgd import (
    TargetRequest,
    WorkloadDistribution,
    fgd_device_choice,
    fgd_score,
    fgd_take,
    model_pressure,
)
from controlplane.scheduling.placement import NodeState, place_gang

HALF = TargetRequest(gpu_milli=500)
ONE = TargetRequest(gpu_milli=1000, num_gpu=1)
TWO = TargetRequest(gpu_milli=1000, num_gpu=2)


def half_and_one() -> WorkloadDistribution:
    return WorkloadDistribution.from_requests({HALF: 1.0, ONE: 1.0})


def test_empty_node_has_no_fragmentation():
    dist = half_and_one()
    assert dist.fragmentation("T4", [1000, 1000, 1000, 1000]) == 0.0


def test_full_node_has_no_fragmentation():
    dist = half_and_one()
    assert dist.fragmentation("T4", [0, 0, 0, 0]) == 0.0


def test_partly_used_node_fragmentation_against_distribution():
    dist = half_and_one()
    # one whole free GPU and one GPU with 300 free: the 300 is too small for both request kinds.
    assert dist.fragmentation("T4", [1000, 300]) == pytest.approx(300.0)
    # 600 free fits the half-GPU request (no fragment for it) but not the whole-GPU one: 0.5 * 600.
    assert dist.fragmentation("T4", [600]) == pytest.approx(300.0)
    # 600 + 600 free: whole-GPU requests cannot run at all -> all 1200 is fragment for them (weight 0.5).
    assert dist.fragmentation("T4", [600, 600]) == pytest.approx(600.0)


def test_unsatisfiable_requests_count_all_free_gpu():
    two_only = WorkloadDistribution.from_requests({TWO: 1.0})
    assert two_only.fragmentation("T4", [1000]) == pytest.approx(1000.0)  # one whole GPU cannot host 2 GPUs
    assert two_only.fragmentation("T4", [1000, 1000]) == 0.0
    v100_only = WorkloadDistribution.from_requests({TargetRequest(1000, 1, gpu_models=frozenset({"V100"})): 1.0})
    assert v100_only.fragmentation("T4", [1000, 1000]) == pytest.approx(2000.0)  # wrong GPU model
    assert v100_only.fragmentation("V100", [1000, 1000]) == 0.0
    cpu_hungry = WorkloadDistribution.from_requests({TargetRequest(1000, 1, cpu_milli=8000): 1.0})
    assert cpu_hungry.fragmentation("T4", [1000], cpu_free=4000) == pytest.approx(1000.0)  # lacks CPU
    assert cpu_hungry.fragmentation("T4", [1000], cpu_free=8000) == 0.0


def test_fgd_prefers_the_placement_that_leaves_whole_gpus_whole():
    dist = half_and_one()
    # a half-GPU pod: on a node with a half-used GPU it completes that GPU; on an empty node it breaks one.
    assert dist.score("T4", [500, 1000], HALF) < dist.score("T4", [1000, 1000], HALF)
    # within a node, it goes onto the partly used GPU, not a whole one
    node = NodeState("n", "p", "T4", "g", [1.0, 0.5, 1.0])
    assert fgd_device_choice(node, 0.5, dist) == 1
    assert fgd_take(node, 0.5, dist) == ((1, 0.5),)
    assert node.device_free == [1.0, 0.0, 1.0]


def test_fgd_score_counts_only_the_increase():
    dist = half_and_one()
    # taking a whole GPU from two whole ones leaves one whole one: no fragment either way
    assert dist.score("T4", [1000, 1000], ONE) == pytest.approx(0.0)
    # a request that does not fit gives None
    assert dist.score("T4", [400], HALF) is None


def test_from_pods_keeps_the_most_popular_shapes():
    pods = [HALF] * 60 + [ONE] * 36 + [TWO] * 4
    dist = WorkloadDistribution.from_pods(pods, popularity=0.95)
    shapes = {request: weight for request, weight in dist.requests}
    assert set(shapes) == {HALF, ONE}
    assert shapes[HALF] == pytest.approx(60 / 96)


def test_from_pods_can_weigh_shapes_by_gpu_demand():
    eight = TargetRequest(gpu_milli=1000, num_gpu=8)
    pods = [HALF] * 60 + [ONE] * 36 + [eight] * 4
    by_count = dict(WorkloadDistribution.from_pods(pods, popularity=0.95).requests)
    assert eight not in by_count  # 4% of pods: outside the typical set
    by_gpu = dict(WorkloadDistribution.from_pods(pods, popularity=1.0, weight_by="gpu").requests)
    assert by_gpu[eight] == pytest.approx(32 / (30 + 36 + 32))  # 32 of 98 GPUs asked for
    mix = dict(WorkloadDistribution.from_pods(pods, popularity=1.0, weight_by="mix").requests)
    assert mix[eight] == pytest.approx(0.5 * 0.04 + 0.5 * 32 / 98)
    with pytest.raises(ValueError):
        WorkloadDistribution.from_pods(pods, weight_by="size")


def test_model_pressure_marks_models_constrained_pods_need():
    t4_only = TargetRequest(1000, 1, gpu_models=frozenset({"T4"}))
    anywhere = TargetRequest(1000, 1)
    # 30 T4-only GPUs and 70 unconstrained on 20 T4 + 80 G2 GPUs: T4-only pods ask for 1.5x the T4 capacity
    pressure = model_pressure([t4_only] * 30 + [anywhere] * 70, {"T4": 20_000, "G2": 80_000})
    assert pressure == {"T4": pytest.approx(1.5), "G2": 0.0}
    spread = model_pressure([TargetRequest(1000, 2, gpu_models=frozenset({"T4", "G2"}))], {"T4": 1000, "G2": 3000})
    assert spread == {"T4": pytest.approx(1.0), "G2": pytest.approx(1.0)}


def test_fgd_score_usable_with_place_gang():
    dist = WorkloadDistribution.from_devices({0.5: 1.0, 1: 1.0})
    nodes = [
        NodeState("a-empty", "p", "T4", "g1", [1.0, 1.0]),
        NodeState("b-half", "p", "T4", "g1", [0.5, 1.0]),
    ]
    placement = place_gang(nodes, workers=1, devices=0.5, score=fgd_score(dist), leaf_group_aware=False)
    assert placement is not None
    assert placement.nodes() == ["b-half"]  # best_fit would agree; first_fit would take a-empty
    # an unfit node scores +inf rather than raising
    assert fgd_score(dist)(NodeState("full", "p", "T4", "g1", [0.0, 0.2]), 0.5) == float("inf")


DATA = Path(__file__).resolve().parents[2].parent / "shared" / "benchmarks" / "alibaba-gpu-2023"


@pytest.mark.skipif(not (DATA / "openb_node_list_gpu_node.csv").exists(),
                    reason=f"public trace data not present at {DATA} (../shared/benchmarks)")
def test_openb_smoke_on_a_slice_of_the_real_trace():
    from benchmarks import openb

    started = time.perf_counter()
    nodes = openb.load_nodes(DATA / "openb_node_list_gpu_node.csv")[::10]  # 122 nodes
    pods = openb.load_pods(DATA / "openb_pod_list_gpuspec33.csv")[:900]
    capacity = sum(n.gpus for n in nodes) * 1000
    arrivals = openb.build_arrivals(pods, capacity, seed=42)
    assert sum(p.total_gpu_milli for p in arrivals) <= 1.3 * capacity
    pressure = openb.fleetyard_pressure(nodes, pods)
    results = {policy: openb.simulate(nodes, arrivals, policy, 42, openb.policy_distribution(pods, policy),
                                      pressure=pressure) for policy in openb.POLICIES}
    for result in results.values():
        at = result["allocated_pct_at_arrived_pct"]
        assert set(at) == {"80", "90", "95", "100", "130"}
        assert 0 < at["80"] <= at["100"] <= at["130"] <= 100.0
        assert result["placed"] + result["failed"] == len(arrivals)
    assert time.perf_counter() - started < 10


def _node(name: str, model: str, gpus: int, cpu: int = 64_000):
    from benchmarks import openb

    return openb.Node(name, cpu, 512 * 1024, gpus, model)


def _pod(name: str, num_gpu: int, gpu_milli: int, models: frozenset[str] = frozenset(), cpu: int = 1000):
    from benchmarks import openb

    return openb.Pod(name, cpu, 1024, num_gpu, gpu_milli, models)


def test_fleetyard_keeps_constrained_models_for_constrained_pods():
    from benchmarks import openb

    # two T4 GPUs listed first, two G2 GPUs; the workload says T4-only pods need all of T4
    nodes = [_node("t4", "T4", 2), _node("g2", "G2", 2)]
    t4_pod = frozenset({"T4"})
    pods = [_pod("a", 1, 1000), _pod("b", 1, 1000), _pod("c", 1, 1000, t4_pod), _pod("d", 1, 1000, t4_pod)]
    dist, pressure = openb.policy_distribution(pods, "fleetyard"), openb.fleetyard_pressure(nodes, pods)
    assert pressure["T4"] > pressure["G2"]
    result = openb.simulate(nodes, pods, "fleetyard", 1, dist, pressure=pressure)
    assert result["failed"] == 0  # unconstrained pods went to G2, the T4-only ones still fit
    first_fit = openb.simulate(nodes, pods, "first-fit", 1)
    assert first_fit["failed"] == 2  # first-fit fills T4 with the unconstrained pods


def test_fleetyard_sees_gangs_and_packs_deterministically():
    from benchmarks import openb

    nodes = [_node("a", "G2", 8), _node("b", "G2", 8)]
    # typical set (95% of pods) is all 1-GPU pods; the 8-GPU gang only shows in the full distribution
    pods = [_pod(f"p{i}", 1, 1000) for i in range(20)] + [_pod("gang", 8, 1000)]
    arrivals = [_pod(f"x{i}", 1, 1000) for i in range(8)] + [_pod("gang", 8, 1000)]
    dist = openb.policy_distribution(pods, "fleetyard")
    assert any(request.num_gpu == 8 for request, _ in dist.requests)
    for seed in (1, 2, 3):  # never depends on the seed: the 1-GPU pods share one node, the gang gets the other
        result = openb.simulate(nodes, arrivals, "fleetyard", seed, dist, pressure={"G2": 0.0})
        assert result["failed"] == 0
