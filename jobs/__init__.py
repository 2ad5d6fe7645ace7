"""Training jobs: spec + status + event timeline, submitted to team LocalQueues."""
