"""The JSON record of one load run (schema SCHEMA) and its human summary, from the merged
raw figures of every process.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from loadtest.payloads import Payloads
from loadtest.spec import LoadSpec
from loadtest.stats import WorkerResult, latency_summary_ms, percentile, tail_over_time

LAG_WARN_MS = 5.0  # generator p99 send delay above which its figures are suspect
LOADGEN_BUSY_WARN = 0.9  # share of a core per generator process
SCHEMA = "cgserve-loadtest/1"
TAIL_BIN_S = 0.1  # tail_over_time's bins: a few batches' time, so that a stall shows as a bin of its own


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
        "client": spec.client,
        "connections": spec.connections,
        "warmup_s": spec.warmup_s,
        "duration_s": d,
        "timeout_s": spec.timeout_s,
        "offered_rate_rps": round(measured / d, 2),  # the schedule's realised rate in the window
        "achieved_rate_rps": round(merged.sent_in_window / d, 2),  # what the generator really sent
        "throughput_rps": round(merged.ok_in_window / d, 2),  # correct answers per second
        "images_per_s": round(merged.ok_in_window * payloads.images_per_request / d, 2),
        "latency_ms": latency_summary_ms(merged.latencies_s),
        "latency_ms_by_outcome": {
            outcome: latency_summary_ms(np.asarray(values))
            for outcome, values in sorted(merged.latencies_by_outcome.items())
        },
        "latency_from": "scheduled send time" if spec.mode == "open" else "send time",
        "window_start_monotonic_s": merged.window_start_s,  # where tail_over_time's bins start, on the host's clock
        "tail_over_time": tail_over_time(merged.offsets_s, merged.latencies_s, d, TAIL_BIN_S),
        "loadgen_lag_ms": {
            "p50": _round(percentile(lag_ms, 50)),
            "p99": _round(percentile(lag_ms, 99)),
            "max": _round(float(lag_ms.max()) if len(lag_ms) else None),
        },
        # Mean share of one core each generator process was busy: near 1, the figures may be
        # the generator's limit rather than the server's.
        "loadgen_cpu_busy": round(merged.cpu_s / merged.wall_s, 3) if merged.wall_s else None,
        # The generator's CPU per request (warm-up included, all processes): the driver's cost.
        "loadgen_cpu_us_per_request": round(merged.cpu_s / merged.requests * 1e6, 1) if merged.requests else None,
        "counts": {
            "measured": measured,
            "ok": merged.ok,
            "errors": n_errors,
            "warmup_excluded": merged.warmup_requests,
            "sent_in_window": merged.sent_in_window,
            "ok_in_window": merged.ok_in_window,
            "waited_for_connection": merged.connection_waits,
            "retried_stale_connection": merged.stale_retries,
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
    if c.get("retried_stale_connection"):
        lines[-1] += f"; {c['retried_stale_connection']} sent again: the server had closed their idle connection"
    lines += [f"  warning: {w}" for w in record["warnings"]]
    return "\n".join(lines)
