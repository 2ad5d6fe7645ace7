"""Datasets and their immutable versions: a URI, or a file uploaded into the platform's storage."""
