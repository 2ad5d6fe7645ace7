"""Which tests share a pytest-xdist worker under scripts/test's two workers (tests/conftest.py schedules by it).

The tests that start Ray clusters, Celery workers or the launcher (tests/integration, tests/reliability: every `ray`
and `celery` test) run on one worker, one at a time: they would fight over the two cores, and the Celery ones share
a Redis database and its queues in CI's second pass (run side by side there, a worker of one test consumed another
test's messages). The browser tests (tests/e2e) keep to one worker too. The other worker runs the rest beside them.
The families are told apart by folder: xdist's own `xdist_group` mark does nothing under pytest 9.2 (xdist 3.8 sets
a node id attribute pytest no longer reads), so marked tests were spread over both workers.
"""

from __future__ import annotations

TEST_FAMILIES = (("tests/integration/", "processes"), ("tests/reliability/", "processes"), ("tests/e2e/", "browser"))


def family_of(nodeid: str) -> str:
    """The work unit a test belongs to: its family, or the test alone."""
    return next((family for folder, family in TEST_FAMILIES if nodeid.startswith(folder)), nodeid)
