"""`manage.py up` refuses, before it starts anything, a port it cannot listen on (launcher.port_refusal) and a data
folder another run is using (launcher.hold_data_folder)."""

from __future__ import annotations

import os
import socket

from controlplane.launcher import hold_data_folder, port_refusal


def test_a_port_another_program_listens_on_is_refused_with_what_to_do():
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        assert port_refusal("127.0.0.1", port) == \
            f"port {port} on 127.0.0.1 is in use by another program; choose another with --port"
    assert port_refusal("127.0.0.1", port) == ""  # free again once it closed


def test_ports_outside_the_range_and_unknown_hosts_are_refused():
    assert port_refusal("127.0.0.1", 0) == "--port must be between 1 and 65535, not 0"
    assert port_refusal("127.0.0.1", 70000) == "--port must be between 1 and 65535, not 70000"
    assert port_refusal("nosuch.invalid", 8000).startswith("--host 'nosuch.invalid' is not an address")


def test_a_second_run_on_the_same_data_folder_is_refused_until_the_first_ends(tmp_path):
    first = hold_data_folder(tmp_path)
    assert not isinstance(first, str)
    second = hold_data_folder(tmp_path)
    assert second == (f"Fleetyard is already running from {tmp_path} (launcher pid {os.getpid()}): stop it first "
                      "(Ctrl-C where it runs), or start this one with another FLEETYARD_DATA_DIR")
    first.close()  # as when the first run ends, however it ends
    again = hold_data_folder(tmp_path)
    assert not isinstance(again, str)
    again.close()
