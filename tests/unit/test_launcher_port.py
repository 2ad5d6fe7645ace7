"""`manage.py up` refuses a port it cannot listen on before it starts anything (launcher.port_refusal)."""

from __future__ import annotations

import socket

from controlplane.launcher import port_refusal


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
