"""REST API of the cluster app."""
