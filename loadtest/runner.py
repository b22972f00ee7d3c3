"""A load run across one or more processes: start them, show progress, merge, make the record.

Each process runs its share (rate/N Poisson arrivals, or concurrency/N clients; the sum of
independent Poisson processes is Poisson at the full rate) against a common start time, so the
merged raw latencies describe one window. The record is plain JSON (loadtest/record.py).
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import sys
import time
from datetime import UTC, datetime
from typing import Any

import numpy as np

from loadtest.payloads import Payloads
from loadtest.record import build_record
from loadtest.spec import LoadSpec
from loadtest.stats import WorkerResult, merge_results, split_evenly
from loadtest.worker import PROGRESS_SLOTS, WorkerSpec, worker_main

OPEN_LOOP_CONNECTIONS_PER_PROCESS = 64  # peak in flight, not steady state: Poisson bursts


def worker_specs(spec: LoadSpec, payloads: Payloads) -> list[WorkerSpec]:
    """Split `spec` into one WorkerSpec per process (never more processes than clients)."""
    processes = spec.processes if spec.concurrency is None else min(spec.processes, spec.concurrency)
    if spec.concurrency is not None:
        shares = split_evenly(spec.concurrency, processes)
        connections = shares if spec.connections is None else split_evenly(spec.connections, processes)
    else:
        total = spec.connections or OPEN_LOOP_CONNECTIONS_PER_PROCESS * processes
        shares, connections = [0] * processes, split_evenly(total, processes)
    return [
        WorkerSpec(
            index=i,
            base_url=spec.base_url,
            payloads=payloads,
            mode=spec.mode,
            rate=(spec.rate or 0.0) / processes,
            concurrency=shares[i],
            connections=max(connections[i], shares[i], 1),
            warmup_s=spec.warmup_s,
            duration_s=spec.duration_s,
            timeout_s=spec.timeout_s,
            seed=spec.seed,
            client=spec.client,
        )
        for i in range(processes)
    ]


class _Progress:
    """The live line on stderr: rewritten in place on a terminal, a line every 5 s otherwise."""

    def __init__(self, enabled: bool, total_s: float, label: str) -> None:
        self.enabled, self.total_s, self.label = enabled, total_s, label
        self.tty = sys.stderr.isatty()
        self.last_t, self.last_done, self.last_line = 0.0, 0, 0.0

    def update(self, elapsed: float, counts: np.ndarray, warmup_s: float) -> None:
        if not self.enabled or elapsed - self.last_t < 0.5:
            return
        sent, done, errors = (int(v) for v in counts.reshape(-1, PROGRESS_SLOTS)[:, :3].sum(0))
        rate = (done - self.last_done) / (elapsed - self.last_t)
        self.last_t, self.last_done = elapsed, done
        phase = "warm-up" if elapsed < warmup_s else "measure" if elapsed < self.total_s else "drain"
        line = (
            f"{self.label} {min(elapsed, 9999):6.1f}/{self.total_s:.0f} s {phase:<7} sent {sent} done {done} "
            f"errors {errors} in-flight {sent - done} {rate:,.0f} req/s"
        )
        if self.tty:
            sys.stderr.write("\r\033[K" + line)
        elif elapsed - self.last_line >= 5.0:
            sys.stderr.write(line + "\n")
            self.last_line = elapsed
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled and self.tty:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


def run_processes(specs: list[WorkerSpec], *, progress: bool = True, label: str = "") -> WorkerResult:
    """Run every WorkerSpec in its own process from a common start; their merged result."""
    ctx = mp.get_context("spawn")  # children import no torch and inherit no threads
    counters = ctx.Array("q", PROGRESS_SLOTS * len(specs), lock=False)
    start, start_wall, results = ctx.Event(), ctx.Value("d", 0.0, lock=False), ctx.Queue()
    procs = [
        ctx.Process(target=worker_main, args=(s, counters, start, start_wall, results), daemon=True) for s in specs
    ]
    first = specs[0]
    total_s = first.warmup_s + first.duration_s
    got: dict[int, WorkerResult] = {}
    try:
        for p in procs:
            p.start()
        deadline = time.monotonic() + 120  # spawn + imports
        while sum(counters[s.index * PROGRESS_SLOTS + 3] for s in specs) < len(specs):
            if time.monotonic() > deadline or any(p.exitcode is not None for p in procs):
                break
            time.sleep(0.02)
        start_wall.value = time.time() + 0.2
        start.set()
        bar = _Progress(progress, total_s, label)
        t_start = time.monotonic() + 0.2
        hard_deadline = t_start + total_s + 2 * first.timeout_s + 30
        while len(got) < len(specs):
            try:
                index, result, error = results.get(timeout=0.25)
            except queue.Empty:
                _check_running(procs, results, hard_deadline - time.monotonic())
                counts = np.frombuffer(counters, dtype=np.int64)
                bar.update(time.monotonic() - t_start, counts, first.warmup_s)
                continue
            if error is not None:
                raise RuntimeError(f"load process {index} failed:\n{error}")
            got[index] = result
        bar.close()
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
    return merge_results([got[s.index] for s in specs])


def _check_running(procs: list[Any], results: Any, time_left_s: float) -> None:
    if time_left_s < 0:
        raise TimeoutError("load processes still running past their deadline")
    dead = [p for p in procs if p.exitcode not in (None, 0)]
    if dead and results.empty():
        raise RuntimeError(f"a load process died (exit code {dead[0].exitcode})")


def run_load(
    spec: LoadSpec, payloads: Payloads, *, command: str, progress: bool = True, label: str = ""
) -> dict[str, Any]:
    """One bounded run of `spec` with `payloads`; its record."""
    spec.validate()
    specs = worker_specs(spec, payloads)
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    merged = run_processes(specs, progress=progress, label=label)
    return build_record(spec, payloads, merged, command=command, started_at=started_at, processes=len(specs))
