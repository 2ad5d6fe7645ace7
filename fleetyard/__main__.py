"""`python -m fleetyard ...` runs the CLI."""

import sys

from fleetyard.cli import main

sys.exit(main())
