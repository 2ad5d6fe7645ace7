"""Fleetyard's Python SDK and CLI: a typed client of the REST API, the YAML spec shared with the server,
and the `fleetyard` command. Pure Python: importing it never imports Django, Ray or torch."""

from fleetyard.client import Client, Deployment, LogLine, TrainingJob
from fleetyard.errors import ApiError, ConfigError, FleetyardError, SpecError, SpecIssue, TimeoutExpired
from fleetyard.spec import Spec, parse_spec

__all__ = ["ApiError", "Client", "ConfigError", "Deployment", "FleetyardError", "LogLine", "Spec", "SpecError",
           "SpecIssue", "TimeoutExpired", "TrainingJob", "parse_spec"]
__version__ = "0.1.0"
