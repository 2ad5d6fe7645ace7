"""Options every lifecycle task shares: ack after the work, re-queue if the worker dies, bounded retries."""

LIFECYCLE_TASK = {"acks_late": True, "reject_on_worker_lost": True, "ignore_result": True, "max_retries": 5,
                  "retry_backoff": True, "retry_backoff_max": 60}
