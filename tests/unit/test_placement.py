"""placement.without_workers: releasing workers from a gang one for one."""

from controlplane.scheduling.placement import WorkerPlacement, without_workers


def test_without_workers_releases_equal_placements_one_for_one():
    half = WorkerPlacement("cpu-0", ((0, 0.5),))
    other = WorkerPlacement("cpu-0", ((1, 0.5),))
    workers = (half, half, other, half)
    assert without_workers(workers, (half,)) == (half, half, other)  # the last equal one goes
    assert without_workers(workers, (half, half, half)) == (other,)
    assert without_workers(workers, ()) == workers
    assert without_workers(workers, (WorkerPlacement("cpu-1", ((0, 0.5),)),)) == workers
