"""The training job state machine (DESIGN.md): one enum and one transition table.

    PENDING -> QUEUED -> ADMITTED -> STARTING -> RUNNING <-> RECOVERING
    RUNNING -> PREEMPTED -> QUEUED
    terminal: SUCCEEDED, FAILED, CANCELLED (any live state may be cancelled or fail)
    ADMITTED -> QUEUED when an admission is withdrawn before the gang starts.
"""

from __future__ import annotations

from enum import StrEnum

from controlplane.common.state_machine import StateMachine


class JobState(StrEnum):
    PENDING = "PENDING"
    QUEUED = "QUEUED"
    ADMITTED = "ADMITTED"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    RECOVERING = "RECOVERING"
    PREEMPTED = "PREEMPTED"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


S = JobState
JOB_TRANSITIONS = {
    S.PENDING: {S.QUEUED, S.FAILED, S.CANCELLED},
    S.QUEUED: {S.ADMITTED, S.FAILED, S.CANCELLED},
    S.ADMITTED: {S.STARTING, S.QUEUED, S.FAILED, S.CANCELLED},
    S.STARTING: {S.RUNNING, S.RECOVERING, S.FAILED, S.CANCELLED},
    S.RUNNING: {S.RECOVERING, S.PREEMPTED, S.SUCCEEDED, S.FAILED, S.CANCELLED},
    S.RECOVERING: {S.RUNNING, S.FAILED, S.CANCELLED},
    S.PREEMPTED: {S.QUEUED, S.FAILED, S.CANCELLED},
    S.SUCCEEDED: set(),
    S.FAILED: set(),
    S.CANCELLED: set(),
}

JOB_MACHINE = StateMachine("training job", JobState, JOB_TRANSITIONS, initial=S.PENDING)

# States in which an admitted job holds its quota and devices.
HOLDING_STATES = (S.ADMITTED, S.STARTING, S.RUNNING, S.RECOVERING)
# Victims must be able to leave by a transition of the table: an admitted job goes back to QUEUED,
# a running one to PREEMPTED. A job STARTING or RECOVERING is left alone until it settles.
PREEMPTIBLE_STATES = frozenset({S.ADMITTED, S.RUNNING})
