"""Which tests share a pytest-xdist worker under scripts/test's two workers (tests/conftest.py schedules by it).

The tests that start processes - Ray clusters, Celery workers, the launcher, Chromium (tests/integration,
tests/reliability, tests/e2e: every `ray`, `celery` and `browser` test) - run on one worker, one at a time: they
would fight over the two cores (several time what they wait for), and the Celery ones share a Redis database and its
queues in CI's second pass (run side by side there, a worker of one test consumed another test's messages). The
other worker runs the rest beside them, and once it is done they have the machine to themselves.
The families are told apart by folder: xdist's own `xdist_group` mark does nothing under pytest 9.2 (xdist 3.8 sets
a node id attribute pytest no longer reads), so marked tests were spread over both workers.
"""

from __future__ import annotations

TEST_FAMILIES = (("tests/integration/", "processes"), ("tests/reliability/", "processes"), ("tests/e2e/", "processes"))


def family_of(nodeid: str) -> str:
    """The work unit a test belongs to: its family, or the test alone."""
    return next((family for folder, family in TEST_FAMILIES if nodeid.startswith(folder)), nodeid)
