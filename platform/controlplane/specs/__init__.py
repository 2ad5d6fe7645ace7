"""Specs: the fleetyard YAML format accepted by the REST API (POST /api/v1/specs/apply/).

Composes training jobs (jobs/) and deployments (inference/): it sits above both, like api_urls, and
owns no models; the submitted YAML is stored on the created job or deployment (`spec_yaml`)."""
