"""Argument types the benchmark commands share: counts, offsets and durations that refuse what cannot mean anything
(a negative --limit sliced all but the last jobs off a trace; a negative --cycles crashed on an empty list), with
argparse's usage message and exit status 2 instead of a traceback or a silently wrong run."""

from __future__ import annotations

import argparse
import math


def at_least(minimum: int):
    """An int option that must be >= ``minimum``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a whole number >= {minimum}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value
    parse.__name__ = f"whole number >= {minimum}"  # (argparse names the type in its messages)
    return parse


def _finite_float(minimum: float, inclusive: bool, wording: str):
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number {wording}, got {text!r}") from None
        if not math.isfinite(value) or value < minimum or (value == minimum and not inclusive):
            raise argparse.ArgumentTypeError(f"must be a finite number {wording}, got {text}")
        return value
    parse.__name__ = f"number {wording}"
    return parse


positive_float = _finite_float(0.0, False, "> 0")  # a duration, a rate, a factor
non_negative_float = _finite_float(0.0, True, ">= 0")  # a sleep, a time per token

COUNT = at_least(1)  # how many: requests, cycles, repetitions, slots
OFFSET = at_least(0)  # where to start, how many more: 0 allowed


def count_list(text: str) -> list[int]:
    """A comma-separated list of counts >= 1 (cluster sizes), at least one."""
    values = [part.strip() for part in text.split(",") if part.strip()]
    if not values:
        raise argparse.ArgumentTypeError(f"must be comma-separated whole numbers >= 1, got {text!r}")
    return [COUNT(value) for value in values]
