"""A state machine written down as an enum plus one transition table.

The table is data (`{state: {allowed next states}}`) so it can be shown, tested exhaustively and
read by people; `check_transition` is the only place that enforces it.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

from controlplane.common.errors import InvalidTransition


class StateMachine:
    def __init__(self, name: str, states: type[StrEnum], table: Mapping[StrEnum, frozenset], initial):
        missing = set(states) - set(table)
        if missing:
            raise ValueError(f"{name}: states without a row in the transition table: {sorted(missing)}")
        self.name = name
        self.states = states
        self.table = {state: frozenset(targets) for state, targets in table.items()}
        self.initial = initial

    def terminal_states(self) -> frozenset:
        return frozenset(state for state, targets in self.table.items() if not targets)

    def is_terminal(self, state) -> bool:
        return not self.table[self.states(state)]

    def can(self, current, target) -> bool:
        return self.states(target) in self.table[self.states(current)]

    def check_transition(self, current, target) -> None:
        if not self.can(current, target):
            raise InvalidTransition(f"{self.name} cannot go from {current} to {target}", field="state")
