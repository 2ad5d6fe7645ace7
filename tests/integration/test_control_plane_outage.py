"""The control plane down for 10 s during training (issue 8, C3), the test variant of
benchmarks/control_plane_outage.py (which runs the 0 / 20 / 60 s series).

Real processes as production starts them (controlplane/launcher.py): gunicorn, a Celery worker (prefork) and
Celery beat, sharing this test's database and the file-system broker, driving the session's Ray cluster.
Web, worker and beat are SIGKILLed together while two jobs train, kept down 10 s (training goes on in Ray),
started again; a third job is cancelled right after the restart. Afterwards the job list is the same, each
job's metrics are exactly steps 0..N-1 once per worker (no gaps, no duplicates), state and step are what the
run reported, the cancelled job is CANCELLED with its run gone and its quota free, and Ray holds nothing.

Database: the SQLite test file (WAL, IMMEDIATE transactions: settings.py) shared by the four processes, so the
test runs in CI's pass 1 with the other Ray tests (pass 2, PostgreSQL, runs `not ray`); on PostgreSQL it
runs the same way against the test database.
"""

from __future__ import annotations

import pytest

from benchmarks.control_plane_outage import Api, ControlPlaneProcesses, format_report, run_outage
from controlplane.tenancy.services import api_token_create

pytestmark = [pytest.mark.ray, pytest.mark.celery, pytest.mark.django_db(transaction=True)]


def test_training_survives_a_20_s_control_plane_outage(ray_cluster, ray_backend, pools_from_ray, world, tmp_path):
    alpha = world["alpha"]
    _, token = api_token_create(actor=alpha["member"], team=alpha["team"], user=alpha["member"], name="outage")
    processes = ControlPlaneProcesses(ray_env={"RAY_ADDRESS": ray_cluster.address, **ray_cluster.client_env()},
                                      log_dir=tmp_path / "logs")
    lines: list[str] = []
    try:
        result = run_outage(backend=ray_backend, api=Api(processes.base_url, token), processes=processes,
                            outage_s=10.0, log=lines.append)
    finally:
        for handle in ray_backend.list_training_handles():  # nothing may outlive the test
            ray_backend.stop_training(handle, checkpoint=False)
            ray_backend.release_training(handle)
    report = format_report([result])
    print("\n".join(lines) + "\n" + report)
    assert all(result["checks"].values()), f"{report}\n{result}"
