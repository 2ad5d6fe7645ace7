"""scripts/test's two xdist workers: the tests that start processes share one family, one worker runs them."""

from tests.families import family_of


def test_process_and_browser_tests_form_families_and_the_rest_run_alone():
    assert family_of("tests/integration/test_ray_backend.py::test_x") == "processes"
    assert family_of("tests/reliability/test_outbox.py::test_y[redis]") == "processes"
    assert family_of("tests/e2e/test_jobs_console.py::test_z") == "processes"
    unit = "tests/unit/test_scheduler.py::test_a"
    assert family_of(unit) == unit


def test_the_scheduler_hook_groups_by_family():
    import pytest

    xdist = pytest.importorskip("xdist.scheduler")
    from tests.conftest import pytest_xdist_make_scheduler

    class Config:
        values = {"dist": "loadgroup", "tx": ["2*popen"], "maxschedchunk": None}

        def getvalue(self, name):
            return self.values[name]

        def getoption(self, name, default=None):
            return self.values.get(name, default)

    scheduler = pytest_xdist_make_scheduler(Config(), None)
    assert isinstance(scheduler, xdist.LoadGroupScheduling)
    assert scheduler._split_scope("tests/integration/test_a.py::t") == scheduler._split_scope(
        "tests/reliability/test_b.py::u")
    assert scheduler._split_scope("tests/unit/test_a.py::t") != scheduler._split_scope("tests/unit/test_a.py::u")
    Config.values = {**Config.values, "dist": "load"}
    assert pytest_xdist_make_scheduler(Config(), None) is None  # other modes: xdist's own
