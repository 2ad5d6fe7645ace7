"""Process discovery behind LocalCluster.kill_node: a node's process group and every descendant,
even one that moved to a session of its own (as the raylet does with its Ray workers)."""

from __future__ import annotations

import os
import signal
import subprocess
import time

from controlplane.compute.local_cluster import _group_and_descendants


def test_group_and_descendants_includes_children_in_other_sessions():
    leader = subprocess.Popen(["/bin/sh", "-c", "setsid sleep 60 & sleep 60"], start_new_session=True)
    try:
        deadline = time.monotonic() + 5
        while True:
            found = _group_and_descendants(leader.pid)
            other_session = [pid for pid in found if os.getpgid(pid) != leader.pid]
            if len(found) >= 3 and other_session:
                break
            assert time.monotonic() < deadline, found
            time.sleep(0.05)
        assert leader.pid in found
    finally:
        for pid in _group_and_descendants(leader.pid):
            os.kill(pid, signal.SIGKILL)
        leader.wait(5)
