"""REST API of deployments."""
