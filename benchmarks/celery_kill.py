"""C1 at full size (issue 8): 2,000 effect tasks, a whole Celery worker SIGKILLed 10 times, one poison message.

Two real Celery workers (prefork, one pool process each; acks_late, reject_on_worker_lost, prefetch 1) run
`c1.write_effect` tasks that write one row per idempotency key (tests/reliability/celery_kill_support.py);
the benchmark SIGKILLs a worker's whole process group at a random moment once it consumes, in turn, and
starts it again, then waits until every effect is written and the poison message (which SIGKILLs its own
pool process on every delivery) is dead-lettered by the delivery ledger. Checks exactly N effects (no
duplicates, none missing) and the dead letter; prints a table and writes JSON.

Runs in its own data folder: the embedded SQLite database and the file-system broker by default;
`--broker redis` uses Redis on 127.0.0.1:6379/15, `--database-url postgres://...` PostgreSQL (its c1 tables
are dropped and its ledger rows deleted afterwards).

    .venv/bin/python benchmarks/celery_kill.py [--broker filesystem|redis] [--database-url URL]
                                               [--tasks 2000] [--kills 10] [--json PATH] [--no-write]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
for _path in (str(REPO_ROOT / "platform"), str(REPO_ROOT)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from benchmarks._args import COUNT, OFFSET  # noqa: E402

RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"


def setup_django(work: Path, database_url: str | None) -> None:
    os.environ["FLEETYARD_DATA_DIR"] = str(work / "data")
    if database_url:
        os.environ["FLEETYARD_DATABASE_URL"] = database_url
    else:
        os.environ.pop("FLEETYARD_DATABASE_URL", None)  # the embedded SQLite file of the work folder
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", interactive=False, verbosity=0)


def checks(figures: dict, tasks: int, limit: int) -> dict[str, bool]:
    return {
        "exactly N effects": figures["effects"] == tasks and figures["distinct_keys"] == tasks,
        "every rerun saw its effect": figures["effect_runs"] - figures["duplicates_prevented"] == tasks,
        "no effect task dead-lettered": figures["effect_tasks_dead_lettered"] == 0,
        "poison dead-lettered at the limit": figures["poison_state"] == "DEAD_LETTERED"
        and figures["poison_worker_losses"] == limit and figures["poison_runs"] <= limit,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--broker", choices=["filesystem", "redis"], default="filesystem")
    parser.add_argument("--database-url", default=None, help="postgres://... (default: SQLite in a temp folder)")
    parser.add_argument("--tasks", type=COUNT, default=2000)
    parser.add_argument("--kills", type=OFFSET, default=10)
    parser.add_argument("--json", type=Path, default=None, help="default benchmarks/results/celery_kill_<broker>.json")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="fleetyard-c1-") as tmp:
        work = Path(tmp)
        setup_django(work, args.database_url)
        from django.conf import settings

        from controlplane.common.models import TaskDelivery
        from tests.reliability.celery_kill_support import (
            create_effect_tables,
            drop_effect_tables,
            run_kill_scenario,
        )

        create_effect_tables()
        try:
            figures = run_kill_scenario(kind=args.broker, tmp_path=work, tasks=args.tasks, kills=args.kills,
                                        drain_timeout_s=300.0)
        finally:
            drop_effect_tables()
            TaskDelivery.objects.filter(task_name__startswith="c1.").delete()
        limit = settings.FLEETYARD_TASK_MAX_WORKER_LOSSES
    result = {**figures, "max_worker_losses": limit, "checks": checks(figures, args.tasks, limit)}
    rows = [("broker / database", f"{figures['broker']} / {figures['database']}"),
            ("tasks", figures["tasks"]), ("workers", figures["workers"]), ("kill -9 of a worker", figures["kills"]),
            ("effects", figures["effects"]), ("missing", figures["missing"]),
            ("effect task runs", figures["effect_runs"]),
            ("duplicates prevented by the key", figures["duplicates_prevented"]),
            ("redeliveries after a lost worker (ledger)", figures["redeliveries"]),
            ("poison", f"{figures['poison_state']} after {figures['poison_runs']} runs, "
                       f"{figures['poison_deliveries']} deliveries"),
            ("seconds to drain", figures["drained_s"])]
    width = max(len(name) for name, _ in rows)
    print("\n".join(f"{name:<{width}}  {value}" for name, value in rows))
    for name, ok in result["checks"].items():
        print(f"{'ok  ' if ok else 'FAIL'} {name}")
    if not args.no_write:
        path = args.json or RESULTS_DIR / f"celery_kill_{args.broker}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {path}")
    return 0 if all(result["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
