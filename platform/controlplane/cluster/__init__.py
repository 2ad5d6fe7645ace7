"""Cluster inventory: accelerator types with their public facts, node pools, and nodes observed from Ray."""
