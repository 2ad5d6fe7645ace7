"""The job and deployment state machines: the tables match DESIGN.md and are enforced."""

import pytest

from controlplane.common.errors import InvalidTransition
from inference.states import DEPLOYMENT_MACHINE, DeploymentState
from jobs.states import JOB_MACHINE, JobState


def test_job_happy_path_and_recovery_loop():
    path = ["PENDING", "QUEUED", "ADMITTED", "STARTING", "RUNNING", "RECOVERING", "RUNNING", "PREEMPTED",
            "QUEUED", "ADMITTED", "STARTING", "RUNNING", "SUCCEEDED"]
    for current, target in zip(path, path[1:], strict=False):
        assert JOB_MACHINE.can(current, target), (current, target)


def test_job_terminal_states_have_no_exit():
    assert JOB_MACHINE.terminal_states() == {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED}
    for terminal in JOB_MACHINE.terminal_states():
        for target in JobState:
            assert not JOB_MACHINE.can(terminal, target)


@pytest.mark.parametrize("current,target", [("PENDING", "RUNNING"), ("QUEUED", "RUNNING"),
                                            ("PREEMPTED", "RUNNING"), ("SUCCEEDED", "QUEUED")])
def test_job_forbidden_transitions_raise(current, target):
    with pytest.raises(InvalidTransition):
        JOB_MACHINE.check_transition(current, target)


def test_every_live_job_state_can_be_cancelled():
    for state in JobState:
        if not JOB_MACHINE.is_terminal(state):
            assert JOB_MACHINE.can(state, JobState.CANCELLED)


def test_deployment_machine_matches_design():
    d = DeploymentState
    assert DEPLOYMENT_MACHINE.can(d.PENDING, d.DEPLOYING)
    assert DEPLOYMENT_MACHINE.can(d.DEPLOYING, d.SERVING)
    for other in (d.UPDATING, d.DEGRADED):
        assert DEPLOYMENT_MACHINE.can(d.SERVING, other) and DEPLOYMENT_MACHINE.can(other, d.SERVING)
    assert DEPLOYMENT_MACHINE.terminal_states() == {d.DELETED, d.FAILED}
    assert not DEPLOYMENT_MACHINE.can(d.PENDING, d.SERVING)
