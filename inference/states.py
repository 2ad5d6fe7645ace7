"""The deployment state machine (DESIGN.md): one enum and one transition table.

    PENDING -> DEPLOYING -> SERVING <-> UPDATING / DEGRADED
    terminal: DELETED, FAILED (any live state may be deleted or fail)
"""

from __future__ import annotations

from enum import StrEnum

from controlplane.common.state_machine import StateMachine


class DeploymentState(StrEnum):
    PENDING = "PENDING"
    DEPLOYING = "DEPLOYING"
    SERVING = "SERVING"
    UPDATING = "UPDATING"
    DEGRADED = "DEGRADED"
    DELETED = "DELETED"
    FAILED = "FAILED"


S = DeploymentState
DEPLOYMENT_TRANSITIONS = {
    S.PENDING: {S.DEPLOYING, S.FAILED, S.DELETED},
    S.DEPLOYING: {S.SERVING, S.FAILED, S.DELETED},
    S.SERVING: {S.UPDATING, S.DEGRADED, S.FAILED, S.DELETED},
    S.UPDATING: {S.SERVING, S.DEGRADED, S.FAILED, S.DELETED},
    S.DEGRADED: {S.SERVING, S.UPDATING, S.FAILED, S.DELETED},
    S.DELETED: set(),
    S.FAILED: set(),
}

DEPLOYMENT_MACHINE = StateMachine("deployment", DeploymentState, DEPLOYMENT_TRANSITIONS, initial=S.PENDING)
