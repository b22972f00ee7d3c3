"""Soak: the real server under steady load for a long time, its memory and latency sampled.

Measures the server's saturation first (closed loop), then drives it at a share of it (70 % by
default) in consecutive one-minute open-loop windows with the project's load generator, and after
each records the server process tree's RSS and the window's latency and errors. Outside CI.

    python bench/soak.py --minutes 30 --out bench/results/<date>-soak.json [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from loadtest.cli_run import run_loadtest
from loadtest.server_process import free_port, running, service_env

ROOT = Path(__file__).resolve().parents[1]


def rss_mib(pid: int) -> float:
    """Resident memory of `pid` and its children (MiB), from /proc."""
    total_kib = 0
    pids = [pid]
    children = Path(f"/proc/{pid}/task/{pid}/children")
    if children.exists():
        pids += [int(child) for child in children.read_text().split()]
    for each in pids:
        for line in Path(f"/proc/{each}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total_kib += int(line.split()[1])
    return round(total_kib / 1024, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=int, default=30)
    parser.add_argument("--load", type=float, default=0.7, help="share of the measured saturation")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/cgserve-soak"))
    args = parser.parse_args()
    args.work_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = service_env(port, device=args.device, log_level="info")
    command = [sys.executable, "-m", "app.cli", "serve"]
    record: dict[str, Any] = {"command": " ".join(["python3", *sys.argv]), "device": args.device, "windows": []}
    with running(command, args.work_dir / "server.log", port=port, env=env, cwd=ROOT) as server:
        saturation = run_loadtest(
            server.url, args.work_dir / "saturation.json", "--form", "raw", "--concurrency", "32", "--duration", "10"
        )
        rate = round(args.load * saturation["throughput_rps"], 1)
        record |= {
            "saturation_rps": saturation["throughput_rps"],
            "rate_rps": rate,
            "rss_start_mib": rss_mib(server.proc.pid),
        }
        started = time.monotonic()
        for minute in range(args.minutes):
            window = run_loadtest(
                server.url,
                args.work_dir / f"window-{minute}.json",
                "--form",
                "raw",
                "--rate",
                str(rate),
                "--duration",
                "60",
                "--warmup",
                "0",
            )
            sample = {
                "minute": minute + 1,
                "elapsed_s": round(time.monotonic() - started),
                "rss_mib": rss_mib(server.proc.pid),
                "throughput_rps": window["throughput_rps"],
                "latency_ms": {k: window["latency_ms"][k] for k in ("p50", "p99", "p99_9", "max")},
                "errors": window["errors"],
            }
            record["windows"].append(sample)
            print(json.dumps(sample), flush=True)
            args.out.write_text(
                json.dumps(record, indent=2) + "\n"
            )  # after each window: a stopped soak keeps its record
    windows = record["windows"]
    record["summary"] = {
        "rss_mib_first_last_max": [windows[0]["rss_mib"], windows[-1]["rss_mib"], max(w["rss_mib"] for w in windows)],
        "p99_ms_worst_window": max(w["latency_ms"]["p99"] for w in windows),
        "errors_total": sum(sum(w["errors"].values()) for w in windows),
    }
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record["summary"]))


if __name__ == "__main__":
    main()
