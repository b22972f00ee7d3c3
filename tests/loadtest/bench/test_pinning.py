"""Which cores the servers and the load generator get (taskset lists)."""

from __future__ import annotations

import os

import pytest

from bench.harness.pinning import core_list, parse_cores, plan_pinning


def test_core_lists_round_trip() -> None:
    assert parse_cores("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert core_list([0, 1, 2, 3, 8, 10, 11]) == "0-3,8,10-11"
    assert core_list(parse_cores("5")) == "5"


def test_plan_pinning_refuses_missing_cores() -> None:
    assert plan_pinning("auto", "auto", no_pin=True)["server_cores"] is None
    plan = plan_pinning("0", "100000", no_pin=False)
    assert plan["loadgen_cores"] is None and any("not available" in n for n in plan["notes"])


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 usable cores")
def test_auto_gives_the_generator_the_upper_half() -> None:
    available = sorted(os.sched_getaffinity(0))
    plan = plan_pinning("auto", "auto", no_pin=False)
    assert plan["loadgen_cores"] == available[len(available) // 2 :]
    assert plan["server_cores"] in (available[: len(available) // 2], None)  # None: taskset refused here
