"""Capacity under a latency SLO, the MLPerf server-scenario way: raise the Poisson rate step by
step, and quote the highest rate whose p99 stays within the SLO with no errors.

Stops after `max_failures` failing steps in a row (a rate past saturation only builds queues),
writes every step to JSON and draws p50/p99 latency against achieved throughput to a PNG.
"""

from __future__ import annotations

import importlib.util
import itertools
import shlex
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from loadtest.payloads import PayloadOptions, Payloads
from loadtest.runner import run_load
from loadtest.spec import LoadSpec

SCHEMA = "cgserve-loadtest-sweep/1"


def step_verdict(record: dict[str, Any], slo_p99_ms: float) -> tuple[bool, str]:
    """(passed, why) for one step: p99 within the SLO and not a single error."""
    p99, errors = record["latency_ms"]["p99"], record["counts"]["errors"]
    if p99 is None:
        return False, "no measured request"
    if errors:
        return False, f"{errors} errors"
    if p99 > slo_p99_ms:
        return False, f"p99 {p99:.2f} ms > SLO {slo_p99_ms:g} ms"
    return True, f"p99 {p99:.2f} ms ≤ SLO {slo_p99_ms:g} ms"


def run_sweep(
    base: LoadSpec,
    payloads: Payloads,
    options: PayloadOptions,
    *,
    rates: list[float],
    slo_p99_ms: float,
    max_failures: int = 1,
    command: str,
    progress: bool = True,
) -> dict[str, Any]:
    """Run the steps in increasing rate; the sweep record (schema SCHEMA)."""
    if not rates or any(b <= a for a, b in itertools.pairwise(rates)):
        raise ValueError(f"--rates must be increasing, got {rates}")
    steps: list[dict[str, Any]] = []
    failures_in_row = 0
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    for i, rate in enumerate(rates):
        spec = replace(base, rate=rate, concurrency=None)
        step_cmd = shlex.join(["python", "-m", "loadtest", *spec.to_args(), *options.to_args()])
        record = run_load(spec, payloads, command=step_cmd, progress=progress, label=f"[{i + 1}/{len(rates)}]")
        record["passed"], record["verdict"] = step_verdict(record, slo_p99_ms)
        steps.append(record)
        print(f"step {i + 1}: {rate:g} req/s → {record['throughput_rps']:,.1f} req/s, {record['verdict']}")
        failures_in_row = 0 if record["passed"] else failures_in_row + 1
        if failures_in_row >= max_failures:
            break
    passing = [s for s in steps if s["passed"]]
    best = max(passing, key=lambda s: s["target_rate_rps"]) if passing else None
    return {
        "schema": SCHEMA,
        "started_at": started_at,
        "command": command,
        "url": base.url,
        "form": payloads.form,
        "slo_p99_ms": slo_p99_ms,
        "rule": "highest target rate whose p99 ≤ SLO with 0 errors (MLPerf server scenario)",
        "capacity_rps": best["target_rate_rps"] if best else None,
        "capacity_throughput_rps": best["throughput_rps"] if best else None,
        "capacity_p99_ms": best["latency_ms"]["p99"] if best else None,
        "rates_planned": rates,
        "stopped_after": f"{max_failures} failing step(s) in a row" if failures_in_row >= max_failures else None,
        "steps": steps,
    }


def sweep_summary(sweep: dict[str, Any]) -> str:
    rows = [
        f"{'target':>9} {'through':>9} {'p50 ms':>8} {'p99 ms':>8} {'errors':>6}  verdict",
        *(
            f"{s['target_rate_rps']:>9g} {s['throughput_rps']:>9,.1f} {s['latency_ms']['p50'] or 0:>8.2f} "
            f"{s['latency_ms']['p99'] or 0:>8.2f} {s['counts']['errors']:>6}  {s['verdict']}"
            for s in sweep["steps"]
        ),
    ]
    if sweep["capacity_rps"] is None:
        rows.append(f"capacity: no rate met p99 ≤ {sweep['slo_p99_ms']:g} ms")
    else:
        rows.append(
            f"capacity: {sweep['capacity_rps']:g} req/s at p99 ≤ {sweep['slo_p99_ms']:g} ms "
            f"(p99 {sweep['capacity_p99_ms']:.2f} ms, {sweep['capacity_throughput_rps']:,.1f} req/s answered)"
        )
    return "\n".join(rows)


def plot_path(asked: Path | None, out: Path | None) -> Path | None:
    """Where the sweep's plot goes: `asked` (--plot), else beside `out` (--out, as .png) where matplotlib is there to
    draw it (`make serve` does not install it: `.[loadtest]` does); None: no plot."""
    if asked is not None:
        return asked
    return out.with_suffix(".png") if out is not None and importlib.util.find_spec("matplotlib") else None


def plot_sweep(sweep: dict[str, Any], path: Path) -> None:
    """p50 and p99 latency (log scale) against achieved throughput, SLO line, capacity marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = sweep["steps"]
    x = [s["throughput_rps"] for s in steps]
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    for key, style in (("p50", "o-"), ("p99", "s-")):
        ax.plot(x, [s["latency_ms"][key] for s in steps], style, label=key)
    for s in steps:  # which target rate each point came from: past saturation, throughput falls back
        if s["latency_ms"]["p99"] is not None:
            ax.annotate(
                f"{s['target_rate_rps']:g}/s",
                (s["throughput_rps"], s["latency_ms"]["p99"]),
                textcoords="offset points",
                xytext=(4, 4),
                fontsize=7,
                color="dimgrey",
            )
    failed = [s for s in steps if not s["passed"]]
    if failed:
        ax.plot(
            [s["throughput_rps"] for s in failed],
            [s["latency_ms"]["p99"] for s in failed],
            "x",
            color="red",
            markersize=10,
            label="step failed",
        )
    ax.axhline(sweep["slo_p99_ms"], color="grey", linestyle="--", label=f"SLO p99 {sweep['slo_p99_ms']:g} ms")
    if sweep["capacity_rps"] is not None:
        ax.axvline(
            sweep["capacity_throughput_rps"],
            color="green",
            linestyle=":",
            label=f"capacity {sweep['capacity_rps']:g} req/s",
        )
    ax.set_yscale("log")
    ax.set_xlabel("achieved throughput (req/s)")
    ax.set_ylabel("latency from scheduled send (ms)")
    ax.set_title(f"{sweep['form']} → {sweep['url']}  (open loop, Poisson)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
