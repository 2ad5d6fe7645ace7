"""Quotas in Kueue's words: ClusterQueues with per-accelerator quotas in cohorts, LocalQueues, priority classes."""
