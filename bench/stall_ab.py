"""The 70 %-load stalls, A/B: the server with its start-up heap frozen out of gc, and without.

Issue 11 found p99 of 0.2–0.5 s against a p50 of a few ms at 70 % of saturation, in periodic
stalls. app/ops/heap.py's claim is that they were full garbage collections over the start-up heap.
This runs the real server in turn without the freeze (gc.freeze patched to do nothing: the
code before the fix), with it, and without it again (A/B/A, so drift shows), each at the same
open-loop rate — 70 % of the first server's measured saturation — and records latency, the
server's own event-loop lag and gc pause histograms (from /metrics) and the kernel's TCP
retransmission counters. Server and generator are pinned to separate cores where there are
enough.

    python bench/stall_ab.py --device cpu --seconds 30 --out bench/results/<date>-stalls.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from loadtest.cli_run import run_loadtest
from loadtest.server_process import free_port, running, service_env

ROOT = Path(__file__).resolve().parents[1]
# The "before" server: identical but for gc.freeze doing nothing.
NO_FREEZE = "import gc; gc.freeze = lambda: None; from app.cli import main; main()"
HISTOGRAMS = ("cgserve_event_loop_lag_seconds", "cgserve_gc_pause_seconds")


def histogram_counts(metrics_text: str, name: str) -> dict[str, float]:
    """{'le label': cumulative count} of one histogram family, generation labels summed over."""
    counts: dict[str, float] = {}
    for match in re.finditer(rf"^{name}_bucket\{{(.*?)\}} (\S+)$", metrics_text, re.M):
        labels, value = match.groups()
        le = re.search(r'le="([^"]+)"', labels)
        key = le.group(1) if le else "?"
        gen = re.search(r'generation="(\d)"', labels)
        if gen:
            key = f"gen{gen.group(1)} le {key}"
        counts[key] = counts.get(key, 0.0) + float(value)
    return counts


def tcp_counters() -> dict[str, int]:
    """The kernel's TCP retransmission counters (nstat, absolute), where nstat exists."""
    try:
        text = subprocess.run(["nstat", "-az"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    wanted = ("TcpRetransSegs", "TcpExtTCPLossProbes", "TcpExtListenOverflows", "TcpExtListenDrops")
    return {f[0]: int(f[1]) for f in (line.split() for line in text.splitlines()) if f and f[0] in wanted}


def run_variant(label: str, freeze: bool, args: argparse.Namespace, rate: float | None) -> dict[str, Any]:
    port = free_port()
    env = service_env(port, device=args.device)
    command = [sys.executable, "-m", "app.cli", "serve"] if freeze else [sys.executable, "-c", NO_FREEZE, "serve"]
    if args.server_cores:
        command = ["taskset", "-c", args.server_cores, *command]
    work = args.work_dir / label
    work.mkdir(parents=True, exist_ok=True)
    with running(command, work / "server.log", port=port, env=env, cwd=ROOT) as server:
        result: dict[str, Any] = {"label": label, "freeze": freeze}
        if rate is None:
            saturation = run_loadtest(
                server.url,
                work / "saturation.json",
                "--form",
                "raw",
                "--concurrency",
                str(args.concurrency),
                "--duration",
                "10",
                "--processes",
                str(args.processes),
                cores=args.loadgen_cores,
                timeout_s=900,
            )
            result["saturation_rps"] = saturation["throughput_rps"]
            rate = round(args.load * saturation["throughput_rps"], 1)
        before_metrics = httpx.get(f"{server.url}/metrics").text
        tcp_before = tcp_counters()
        window = run_loadtest(
            server.url,
            work / "window.json",
            "--form",
            "raw",
            "--rate",
            str(rate),
            "--duration",
            str(args.seconds),
            "--warmup",
            "2",
            "--processes",
            str(args.processes),
            cores=args.loadgen_cores,
            timeout_s=900,
        )
        tcp_after = tcp_counters()
        after_metrics = httpx.get(f"{server.url}/metrics").text
    result |= {
        "rate_rps": rate,
        "throughput_rps": window["throughput_rps"],
        "latency_ms": {k: window["latency_ms"][k] for k in ("p50", "p90", "p99", "p99_9", "max")},
        "errors": window["errors"],
        "loadgen_cpu_busy": window.get("loadgen_cpu_busy"),
        "tcp_counters_delta": {k: tcp_after[k] - tcp_before.get(k, 0) for k in tcp_after},
    }
    for name in HISTOGRAMS:  # counts during the window: after − before
        before, after = histogram_counts(before_metrics, name), histogram_counts(after_metrics, name)
        result[name] = {k: after[k] - before.get(k, 0.0) for k in after}
    print(json.dumps({k: result[k] for k in ("label", "rate_rps", "throughput_rps", "latency_ms")}), flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seconds", type=int, default=30)
    parser.add_argument("--load", type=float, default=0.7, help="share of the measured saturation")
    parser.add_argument("--concurrency", type=int, default=32, help="closed loop that measures saturation")
    parser.add_argument("--processes", type=int, default=1, help="load-generator processes")
    parser.add_argument("--server-cores", default=None, help="taskset list for the server, e.g. 0")
    parser.add_argument("--loadgen-cores", default=None, help="taskset list for the generator, e.g. 1")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/cgserve-stall-ab"))
    args = parser.parse_args()
    started = time.time()
    first = run_variant("no-freeze", False, args, None)
    rate = first["rate_rps"]
    runs = [first, run_variant("freeze", True, args, rate), run_variant("no-freeze-again", False, args, rate)]
    record = {
        "command": " ".join(["python3", *sys.argv]),
        "cpu_count": os.cpu_count(),
        "seconds": round(time.time() - started),
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
