"""REST API of the datasets app."""
