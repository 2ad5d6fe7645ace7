"""Pieces shared by every control-plane app: state machines, API plumbing, errors, audit helpers."""
