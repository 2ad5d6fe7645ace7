#!/usr/bin/env python3
"""Django's command-line utility for Fleetyard. Puts the `platform/` source root on the path."""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent


def main() -> None:
    for entry in (str(ROOT / "platform"), str(ROOT)):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
