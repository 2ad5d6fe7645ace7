"""REST API of training jobs."""
