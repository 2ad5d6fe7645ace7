"""REST API of the quotas app."""
