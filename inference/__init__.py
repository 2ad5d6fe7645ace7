"""Inference deployments: SLA-aware model services with revisions and a state timeline."""
