"""A load run across one or more processes: start them, show progress, merge, make the record.

Each process runs its share (rate/N Poisson arrivals, or concurrency/N clients; the sum of
independent Poisson processes is Poisson at the full rate) against a common start time, so the
merged raw latencies describe one window. The record is plain JSON (see `build_record`).
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from loadtest.payloads import Payloads
from loadtest.stats import WorkerResult, latency_summary_ms, merge_results, percentile, split_evenly
from loadtest.worker import PROGRESS_SLOTS, WorkerSpec, worker_main

ALLOWED_HOSTS = ("127.0.0.1", "localhost", "::1")
MAX_DURATION_S = 3600.0  # a run always ends by itself
MAX_RATE = 200_000.0
MAX_CONCURRENCY = 4096
OPEN_LOOP_CONNECTIONS_PER_PROCESS = 64  # peak in flight, not steady state: Poisson bursts
LAG_WARN_MS = 5.0  # generator p99 send delay above which its figures are suspect
LOADGEN_BUSY_WARN = 0.9  # share of a core per generator process
SCHEMA = "cgserve-loadtest/1"


def validate_url(url: str) -> str:
    """The base URL (scheme://host:port), if it points at this machine over plain HTTP."""
    parts = urlsplit(url)
    if parts.scheme != "http" or parts.hostname not in ALLOWED_HOSTS:
        raise ValueError(f"--url must be http:// on {', '.join(ALLOWED_HOSTS)}, got {url!r}")
    if parts.path not in ("", "/") or parts.query:
        raise ValueError(f"--url is the server's base URL (no path); got {url!r} — use --path")
    return f"{parts.scheme}://{parts.netloc}"


@dataclass(frozen=True)
class LoadSpec:
    url: str
    rate: float | None = None  # open loop: total Poisson rate, req/s
    concurrency: int | None = None  # closed loop: total requests in flight
    processes: int = 1
    connections: int | None = None  # total pool limit; default: concurrency, or 64 per process
    warmup_s: float = 2.0
    duration_s: float = 10.0
    timeout_s: float = 10.0
    seed: int = 0

    @property
    def mode(self) -> str:
        return "open" if self.rate is not None else "closed"

    def validate(self) -> None:
        validate_url(self.url)
        if (self.rate is None) == (self.concurrency is None):
            raise ValueError("give exactly one of --rate (open loop) or --concurrency (closed loop)")
        if self.rate is not None and not 0 < self.rate <= MAX_RATE:
            raise ValueError(f"--rate must be within (0, {MAX_RATE:.0f}], got {self.rate}")
        if self.concurrency is not None and not 1 <= self.concurrency <= MAX_CONCURRENCY:
            raise ValueError(f"--concurrency must be within [1, {MAX_CONCURRENCY}], got {self.concurrency}")
        if not 0 < self.duration_s <= MAX_DURATION_S or not 0 <= self.warmup_s <= MAX_DURATION_S:
            raise ValueError(f"--duration must be within (0, {MAX_DURATION_S:.0f}] s and --warmup ≥ 0")
        if not 0 < self.timeout_s <= 300:
            raise ValueError(f"--timeout must be within (0, 300] s, got {self.timeout_s}")
        if self.processes < 1 or self.processes > 256:
            raise ValueError(f"--processes must be within [1, 256], got {self.processes}")
        if self.connections is not None and self.connections < self.processes:
            raise ValueError(f"--connections ({self.connections}) must be ≥ --processes ({self.processes})")

    def to_args(self) -> list[str]:
        """The CLI flags that reproduce this spec (for the records' `command`)."""
        args = ["--url", self.url]
        args += ["--rate", f"{self.rate:g}"] if self.rate is not None else ["--concurrency", str(self.concurrency)]
        args += ["--processes", str(self.processes)]
        if self.connections is not None:
            args += ["--connections", str(self.connections)]
        args += ["--warmup", f"{self.warmup_s:g}", "--duration", f"{self.duration_s:g}"]
        return [*args, "--timeout", f"{self.timeout_s:g}", "--seed", str(self.seed)]


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
            base_url=validate_url(spec.url),
            payloads=payloads,
            mode=spec.mode,
            rate=(spec.rate or 0.0) / processes,
            concurrency=shares[i],
            connections=max(connections[i], shares[i], 1),
            warmup_s=spec.warmup_s,
            duration_s=spec.duration_s,
            timeout_s=spec.timeout_s,
            seed=spec.seed,
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


def build_record(
    spec: LoadSpec, payloads: Payloads, merged: WorkerResult, *, command: str, started_at: str, processes: int
) -> dict[str, Any]:
    """The JSON record of one run (schema SCHEMA); `summary` is the human version."""
    d = spec.duration_s
    measured, n_errors = merged.measured, sum(merged.errors.values())
    lag_ms = merged.lags_s * 1e3
    record: dict[str, Any] = {
        "schema": SCHEMA,
        "started_at": started_at,
        "command": command,
        "url": spec.url,
        "path": payloads.path,
        "form": payloads.form,
        "images_per_request": payloads.images_per_request,
        "mode": spec.mode,
        "arrivals": "poisson" if spec.mode == "open" else "closed-loop",
        "target_rate_rps": spec.rate,
        "concurrency": spec.concurrency,
        "processes": processes,
        "connections": spec.connections,
        "warmup_s": spec.warmup_s,
        "duration_s": d,
        "timeout_s": spec.timeout_s,
        "offered_rate_rps": round(measured / d, 2),  # the schedule's realised rate in the window
        "achieved_rate_rps": round(merged.sent_in_window / d, 2),  # what the generator really sent
        "throughput_rps": round(merged.ok_in_window / d, 2),  # correct answers per second
        "images_per_s": round(merged.ok_in_window * payloads.images_per_request / d, 2),
        "latency_ms": latency_summary_ms(merged.latencies_s),
        "latency_from": "scheduled send time" if spec.mode == "open" else "send time",
        "loadgen_lag_ms": {
            "p50": _round(percentile(lag_ms, 50)),
            "p99": _round(percentile(lag_ms, 99)),
            "max": _round(float(lag_ms.max()) if len(lag_ms) else None),
        },
        # Mean share of one core each generator process was busy: near 1, the figures may be
        # the generator's limit rather than the server's.
        "loadgen_cpu_busy": round(merged.cpu_s / merged.wall_s, 3) if merged.wall_s else None,
        "counts": {
            "measured": measured,
            "ok": merged.ok,
            "errors": n_errors,
            "warmup_excluded": merged.warmup_requests,
            "sent_in_window": merged.sent_in_window,
            "ok_in_window": merged.ok_in_window,
            "waited_for_connection": merged.connection_waits,
        },
        "errors": dict(sorted(merged.errors.items())),
        "warmup_errors": dict(sorted(merged.warmup_errors.items())),
        "error_examples": merged.error_examples,
        "labels_checked": payloads.expected is not None,
        "payloads": payloads.info,
        "server": merged.server,
        "warnings": _warnings(spec, merged, lag_ms),
    }
    record["summary"] = summary(record)
    return record


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 4)


def _warnings(spec: LoadSpec, merged: WorkerResult, lag_ms: np.ndarray) -> list[str]:
    out = []
    lag_p99 = percentile(lag_ms, 99)
    if spec.mode == "open" and (lag_p99 or 0.0) > LAG_WARN_MS:
        out.append(
            f"the load generator sent late (p99 {lag_p99:.1f} ms after schedule): latencies include "
            "its own delay; add --processes or cores"
        )
    if merged.wall_s and merged.cpu_s / merged.wall_s > LOADGEN_BUSY_WARN:
        out.append(
            f"the load-generator processes were {merged.cpu_s / merged.wall_s:.0%} busy: the figures may be "
            "its limit, not the server's; add --processes or cores"
        )
    if spec.mode == "open" and merged.connection_waits:
        out.append(
            f"{merged.connection_waits} requests found all connections busy and waited in the generator "
            "(counted in their latency); raise --connections if the server should see them at once"
        )
    if merged.measured < 1000:
        out.append(f"{merged.measured} measured requests: p99.9 is not meaningful below 1000")
    if merged.measured == 0:
        out.append("no request fell in the measurement window")
    return out


def summary(record: dict[str, Any]) -> str:
    """A few lines a person reads at the end of a run."""
    lat, c = record["latency_ms"], record["counts"]
    if record["mode"] == "open":
        load = f"open loop, Poisson {record['target_rate_rps']:g} req/s"
    else:
        load = f"closed loop, {record['concurrency']} in flight"
    errors = ", ".join(f"{k} {v}" for k, v in record["errors"].items()) or "none"

    def ms(key: str) -> str:
        return "-" if lat[key] is None else f"{lat[key]:.2f}"

    lines = [
        f"{load}; {record['form']} × {record['images_per_request']}; {record['processes']} process(es); "
        f"{record['duration_s']:g} s measured after {record['warmup_s']:g} s warm-up",
        f"  throughput {record['throughput_rps']:,.1f} req/s ({record['images_per_s']:,.1f} images/s); "
        f"sent {record['achieved_rate_rps']:,.1f} req/s",
        f"  latency ms (from {record['latency_from']}): p50 {ms('p50')}  p90 {ms('p90')}  p99 {ms('p99')}  "
        f"p99.9 {ms('p99_9')}  max {ms('max')}",
        f"  {c['measured']} measured, {c['ok']} ok, errors: {errors}"
        + ("" if record["labels_checked"] else " (labels not checked)"),
    ]
    lines += [f"  warning: {w}" for w in record["warnings"]]
    return "\n".join(lines)


def run_load(
    spec: LoadSpec, payloads: Payloads, *, command: str, progress: bool = True, label: str = ""
) -> dict[str, Any]:
    """One bounded run of `spec` with `payloads`; its record."""
    spec.validate()
    specs = worker_specs(spec, payloads)
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    merged = run_processes(specs, progress=progress, label=label)
    return build_record(spec, payloads, merged, command=command, started_at=started_at, processes=len(specs))
