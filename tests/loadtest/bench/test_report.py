"""The harness's shared pieces: the saturation rule, the closed-loop table and the run flags."""

from __future__ import annotations

import argparse
from typing import Any

from bench.harness.measure import add_run_args, best_closed_loop
from bench.harness.report import closed_loop_table, num


def closed(c: int, rps: float, errors: int = 0) -> dict[str, Any]:
    return {"concurrency": c, "throughput_rps": rps, "counts": {"errors": errors}}


def test_saturation_is_the_best_error_free_step() -> None:
    assert best_closed_loop([closed(16, 900.0), closed(32, 1200.0, errors=3), closed(64, 1000.0)])["concurrency"] == 64
    assert best_closed_loop([closed(16, 900.0, errors=1), closed(32, 1200.0, errors=2)])["concurrency"] == 32


def test_closed_loop_table_leaves_a_dash_where_a_step_is_missing() -> None:
    servers = {"noop": {"closed_loop": [closed(16, 6300.0), closed(32, 6100.4)]}, "ours": {"error": "not ready"}}
    assert closed_loop_table(servers, [16, 32, 64])[-1] == "| noop | 6,300 | 6,100 | – |"
    assert num(None) == "–" and num(1.234, ".2f") == "1.23"


def test_run_flags_take_each_benchmarks_step_lengths() -> None:
    p = argparse.ArgumentParser()
    add_run_args(p, warmup=1.5, step_duration=4.0)
    args = p.parse_args(["--no-pin", "--processes", "2"])
    assert (args.warmup, args.step_duration, args.timeout, args.no_pin, args.processes) == (1.5, 4.0, 5.0, True, 2)
    assert args.server_cores == args.loadgen_cores == "auto"
