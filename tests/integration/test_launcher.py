"""`manage.py up` (what scripts/up runs) starts web, worker and beat, serves the console, and
stops every process it started on Ctrl-C. Ray is left out here (`--no-ray`); the Ray cluster's own
start/stop by pid is tested in test_ray_backend.py."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.celery


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def start_up(tmp_path, port):
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("FLEETYARD_", "CELERY_", "RAY_", "DJANGO_"))}
    env["FLEETYARD_DATA_DIR"] = str(tmp_path)
    log = open(tmp_path / "up.log", "w+b")  # noqa: SIM115
    process = subprocess.Popen([sys.executable, "manage.py", "up", "--no-ray", f"--port={port}"], cwd=ROOT,
                               env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 90
    output = ""
    while "press Ctrl-C" not in output:
        assert process.poll() is None and time.monotonic() < deadline, output
        time.sleep(0.5)
        output = (tmp_path / "up.log").read_text()
    return process, log, output, json.loads((tmp_path / "processes.json").read_text())


def kill_leftovers(process, children) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
    for pid in children.values():
        if group_alive(pid):
            os.killpg(pid, signal.SIGKILL)


def test_up_serves_the_console_and_ctrl_c_stops_everything(tmp_path):
    port = free_port()
    process, log, output, children = start_up(tmp_path, port)
    try:
        assert f"console:  http://127.0.0.1:{port}/" in output
        password = re.search(r"login:\s+demo / (\S+)", output).group(1)
        assert password == (tmp_path / "demo_password").read_text()[:20]
        assert set(children) == {"worker", "beat", "web"}
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/login/", timeout=10) as response:  # noqa: S310
            assert response.status == 200 and b"Fleetyard" in response.read()
        process.send_signal(signal.SIGINT)
        assert process.wait(60) == 0
        assert "stopped" in (tmp_path / "up.log").read_text()
        for name, pid in children.items():
            assert not group_alive(pid), f"{name} (process group {pid}) survived Ctrl-C"
        assert not (tmp_path / "processes.json").exists()
    finally:
        kill_leftovers(process, children)
        log.close()


def test_children_die_with_a_killed_launcher(tmp_path):
    process, log, _, children = start_up(tmp_path, free_port())
    try:
        process.kill()  # SIGKILL: no chance to clean up; the children's parent-death signal must act
        process.wait(10)
        deadline = time.monotonic() + 30
        while any(group_alive(pid) for pid in children.values()) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert [name for name, pid in children.items() if group_alive(pid)] == []
    finally:
        kill_leftovers(process, children)
        log.close()
