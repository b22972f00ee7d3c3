"""One bounded load step against a running server, with the run's shared settings, and the
command-line flags every server benchmark takes for them.

Same payloads and same generator for every server; the servers run on one set of cores
(taskset), the generator's processes on another (pinning.py).
"""

from __future__ import annotations

import argparse
import os
import shlex
from dataclasses import replace
from typing import Any

from bench.harness.pinning import core_list
from loadtest.hey import resolve_hey
from loadtest.payloads import PayloadOptions, Payloads
from loadtest.runner import run_load
from loadtest.spec import LoadSpec


def add_run_args(parser: argparse.ArgumentParser, *, warmup: float, step_duration: float) -> None:
    """The flags Bench and plan_pinning read: cores, generator processes, step lengths, timeouts."""
    add = parser.add_argument
    add("--server-cores", default="auto", help="taskset list for the servers (default: lower half)")
    add("--loadgen-cores", default="auto", help="cores for the load generator (default: upper half)")
    add("--no-pin", action="store_true", help="pin nothing")
    add("--processes", type=int, help="load-generator processes (default: one per load-generator core)")
    add("--warmup", type=float, default=warmup, help="warm-up seconds per step (default %(default)s)")
    add("--step-duration", type=float, default=step_duration, help="measured seconds per step (default %(default)s)")
    add("--timeout", type=float, default=5.0, help="per-request timeout, s (default %(default)s)")
    add("--startup-timeout", type=float, default=180.0, help="seconds to wait for /readyz (default %(default)s)")


class Bench:
    """The run's settings (the CLI's `args`, add_run_args' flags and `hey`), payloads and pinning,
    shared by every server."""

    def __init__(self, args: argparse.Namespace, payloads: Payloads, options: PayloadOptions, pin: dict[str, Any]):
        self.args, self.payloads, self.options, self.pin = args, payloads, options, pin
        loadgen = pin["loadgen_cores"]
        self.processes = args.processes or (len(loadgen) if loadgen else max(1, (os.cpu_count() or 2) // 2))
        self.loadgen_prefix = ["taskset", "-c", core_list(loadgen)] if loadgen else []
        self.server_prefix = ["taskset", "-c", core_list(pin["server_cores"])] if pin["server_cores"] else []
        self.hey = resolve_hey(args.hey)

    def step(self, name: str, url: str, payloads: Payloads, **load: Any) -> dict[str, Any]:
        """One bounded load run (`concurrency=` or `rate=`); its record, and a line on stdout."""
        a = self.args
        spec = LoadSpec(
            url=url,
            processes=self.processes,
            warmup_s=a.warmup,
            duration_s=a.step_duration,
            timeout_s=a.timeout,
            **load,
        )
        options = replace(self.options, check_labels=payloads.expected is not None)
        command = shlex.join([*self.loadgen_prefix, "python", "-m", "loadtest", *spec.to_args(), *options.to_args()])
        what = f"c{load['concurrency']}" if "concurrency" in load else f"{load['rate']:.0f}/s"
        record = run_load(spec, payloads, command=command, label=f"{name} {what}")
        lat = record["latency_ms"]
        print(
            f"  {name:<10} {what:>8}: {record['throughput_rps']:>9,.1f} req/s  p50 {lat['p50'] or 0:7.2f} ms  "
            f"p99 {lat['p99'] or 0:7.2f} ms  errors {record['counts']['errors']}  "
            f"generator busy {record['loadgen_cpu_busy'] or 0:.0%}",
            flush=True,
        )
        return record


def best_closed_loop(closed: list[dict[str, Any]]) -> dict[str, Any]:
    """The saturation step: the highest closed-loop throughput among error-free steps (any, if none is)."""
    return max([r for r in closed if r["counts"]["errors"] == 0] or closed, key=lambda r: r["throughput_rps"])
