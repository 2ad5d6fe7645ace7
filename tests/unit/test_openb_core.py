"""The openb benchmark's `core` policies: the scheduling core's placement rules replayed on the trace's shapes."""

from __future__ import annotations

import pytest

from controlplane.scheduling.fgd import TargetRequest, WorkloadDistribution


def _pods(*shares):
    from benchmarks import openb

    return [openb.Pod(f"p{i}", 0, 0, 1, round(share * 1000), frozenset()) for i, share in enumerate(shares)]


def _two_single_gpu_nodes():
    from benchmarks import openb

    return [openb.Node("x", 0, 0, 1, "G2"), openb.Node("y", 0, 0, 1, "G2")]


def test_core_packs_a_fraction_on_the_fullest_device_and_strands_a_sliver():
    from benchmarks import openb

    # 0.3 goes to x (ties by name); 0.5 to x too (the fullest device it fits), leaving 0.2 that nothing uses;
    # the second 0.5 to y; the 0.7 then fits nowhere.
    result = openb.simulate_core(_two_single_gpu_nodes(), _pods(0.3, 0.5, 0.5, 0.7), "core")
    assert result["placed"] == 3 and result["failed"] == 1
    assert result["allocated_pct_final"] == pytest.approx(65.0)
    assert result["failed_by_kind"] == {"share": 1}
    assert result["first_failure"]["arrived_pct"] == pytest.approx(100.0)


def test_core_fgd_keeps_room_for_the_shapes_the_workload_asks_for():
    from benchmarks import openb

    # FGD puts the first 0.5 on y (its 0.5 left still serves 0.3 and 0.5 pods; x's 0.2 left would serve nothing),
    # the second on y too, and the 0.7 then fits on x: everything is placed.
    distribution = WorkloadDistribution.from_requests({TargetRequest.from_devices(0.3): 1.0,
                                                       TargetRequest.from_devices(0.5): 2.0,
                                                       TargetRequest.from_devices(0.7): 1.0})
    result = openb.simulate_core(_two_single_gpu_nodes(), _pods(0.3, 0.5, 0.5, 0.7), "core-fgd", distribution)
    assert result["placed"] == 4 and result["failed"] == 0
    assert result["allocated_pct_final"] == pytest.approx(100.0)


def test_core_policies_honour_gpu_models_and_whole_devices():
    from benchmarks import openb

    nodes = [openb.Node("a", 0, 0, 8, "A10"), openb.Node("t", 0, 0, 4, "T4")]
    pods = [openb.Pod("t-only", 0, 0, 4, 1000, frozenset({"T4"})), openb.Pod("eight", 0, 0, 8, 1000, frozenset()),
            openb.Pod("late", 0, 0, 1, 1000, frozenset({"T4"}))]
    result = openb.simulate_core(nodes, pods, "core")
    assert result["placed"] == 2 and result["failed_by_kind"] == {"1gpu": 1}


def test_core_fgd_needs_a_distribution_and_unknown_core_policies_are_refused():
    from benchmarks import openb

    with pytest.raises(ValueError, match="distribution"):
        openb.simulate_core(_two_single_gpu_nodes(), _pods(0.5), "core-fgd")
    with pytest.raises(ValueError, match="unknown core policy"):
        openb.simulate_core(_two_single_gpu_nodes(), _pods(0.5), "fgd")


def test_core_distribution_weighs_shapes_by_count_and_gpu_demand():
    from benchmarks import openb

    distribution = openb.core_distribution(_pods(0.5, 0.5) + [openb.Pod("w", 0, 0, 2, 1000, frozenset()),
                                                               openb.Pod("cpu", 4000, 0, 0, 0, frozenset())])
    weights = {request: weight for request, weight in distribution.requests}
    half, two = TargetRequest.from_devices(0.5), TargetRequest.from_devices(2)
    # counts 2 and 1 of 3 GPU pods; GPU demand 1,000 and 2,000 of 3,000 milli (the CPU-only pod is no shape)
    assert weights[half] == pytest.approx(0.5 * 2 / 3 + 0.5 * 1 / 3)
    assert weights[two] == pytest.approx(0.5 * 1 / 3 + 0.5 * 2 / 3)
    assert len(weights) == 2


def test_an_unknown_policy_is_a_usage_error(capsys):
    from benchmarks import openb

    with pytest.raises(SystemExit) as exit_info:
        openb.main(["--policies", "core,nope"])
    assert exit_info.value.code == 2
    assert "unknown policy nope" in capsys.readouterr().err


def test_place_gang_takes_devices_with_the_given_take_and_rolls_it_back_on_failure():
    from controlplane.scheduling.placement import NodeState, place_gang

    node = NodeState("n", "p", "t", "g", [0.6, 1.0])
    calls = []

    def emptiest_device(state, devices):  # the opposite of NodeState.take's fullest device
        index = max(range(len(state.device_free)), key=lambda i: state.device_free[i])
        state.device_free[index] -= devices
        calls.append(index)
        return ((index, devices),)

    placement = place_gang([node], workers=1, devices=0.5, take=emptiest_device)
    assert calls == [1] and placement.workers[0].taken == ((1, 0.5),) and node.device_free == [0.6, 0.5]
    assert place_gang([node], workers=3, devices=0.5, take=emptiest_device) is None  # only two fit
    assert node.device_free == pytest.approx([0.6, 0.5])  # both taken ones given back
