"""The openb benchmark's node and pod list readers and command on files other than the shipped lists."""

from __future__ import annotations

import pytest


def test_arrivals_of_a_pod_list_that_asks_for_no_gpu_are_an_error_not_an_endless_loop():
    from benchmarks import openb

    with pytest.raises(ValueError, match="no pod asks for a GPU"):
        openb.build_arrivals([openb.Pod("c", 1000, 1024, 0, 0, frozenset())], 2000, seed=1)
    with pytest.raises(ValueError, match="no pod asks for a GPU"):
        openb.build_arrivals([], 2000, seed=1)
