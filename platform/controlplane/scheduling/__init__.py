"""The scheduling core: pure Python (no Django, no Ray), plain dataclasses in, decisions out.

- model:      the dataclasses the core reads (nodes, queues, quotas, workloads) and the decisions it returns
- placement:  per-device node state, fit tests and node-choice policies (first-fit, best-fit, FGD)
- efficiency: the efficiency matrix (throughput of a workload class per chip) and cost-aware type choice
- quota:      ClusterQueue / cohort accounting: nominal, borrowing and lending limits
- scheduler:  one scheduling cycle: ordering, backfill with reservation, gangs, preemption, elastic
The simulator and the benchmarks (benchmarks/) drive these modules directly.
"""
