"""Server benchmark in one run: the HTTP ceiling, the naive baseline and our service, same load.

    PYTHONPATH=. python3 -m loadtest.bench_server --out-dir bench/results [--hey .gpu/bin/hey]

In turn it starts, loads and stops
  noop        loadtest/servers/noop.py: decodes with app.codecs.bodies, answers without a model (ceiling)
  naive       loadtest/servers/naive.py: one eager forward per request, waited for (baseline)
  eager       our service, --engine eager
  cuda-graph  our service, --engine cuda-graph (skipped with a note where there is no CUDA)
For each: closed-loop runs (16/32/64 in flight) find the saturation throughput, then open-loop
Poisson runs at 50% and 90% of that rate give p99. Servers run on one set of cores (taskset),
the load-generator processes on another. Same payloads, same generator for every server.
Where hey is found (--hey), it runs closed loop at the first concurrency against the no-op
server and ours, beside our generator's figure for the same point: a second opinion on whether
the generator, not the server, set the ceiling (each step's record also gives the generator's
CPU share, `loadgen_cpu_busy`).
Writes <out-dir>/<date>-server.json (every figure and command, machine info) and
<out-dir>/<date>-server.md (the table), and each server's log under <out-dir>/logs/.
The parts are in loadtest/bench/; this module is the command line.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from loadtest.bench.machine import machine_info
from loadtest.bench.measure import Bench
from loadtest.bench.pinning import plan_pinning
from loadtest.bench.report import markdown, ratios
from loadtest.bench.servers import SERVERS, templates
from loadtest.payloads import PayloadOptions

SCHEMA = "cgserve-bench-server/1"


def _floats(text: str) -> list[float]:
    return [float(v) for v in text.split(",") if v.strip()]


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m loadtest.bench_server",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = p.add_argument
    add("--out-dir", type=Path, required=True, help="where the JSON, the markdown and logs/ go")
    add("--servers", default=",".join(SERVERS), help="which to run, in order (default %(default)s)")
    add(
        "--server-cmd",
        action="append",
        default=[],
        metavar="NAME=TEMPLATE",
        help="replace a server's command; {python} {host} {port} are filled in, e.g. "
        "'eager={python} -m app.cli serve --host {host} --port {port} --engine eager' (repeatable)",
    )
    add("--server-cores", default="auto", help="taskset list for servers (default: lower half)")
    add("--loadgen-cores", default="auto", help="cores for the load generator (default: upper half)")
    add("--no-pin", action="store_true", help="pin nothing")
    add("--processes", type=int, help="load-generator processes (default: one per load-generator core)")
    add("--concurrencies", type=_ints, default=[16, 32, 64], help="closed-loop steps (default 16,32,64)")
    add("--load-fractions", type=_floats, default=[0.5, 0.9], help="open-loop steps (default 0.5,0.9)")
    add("--step-duration", type=float, default=8.0, help="measured seconds per step (default 8)")
    add("--warmup", type=float, default=2.0, help="warm-up seconds per step (default 2)")
    add("--timeout", type=float, default=5.0, help="per-request timeout, s (default 5)")
    add("--startup-timeout", type=float, default=180.0, help="seconds to wait for /readyz (default 180)")
    add("--form", choices=("json", "png", "raw"), default="json", help="request body form (default json)")
    add("--hey", default=".gpu/bin/hey", help="hey binary for the cross-check; skipped if absent")
    add("--hey-concurrency", type=int, help="hey's concurrency (default: the first of --concurrencies)")
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    command = shlex.join(["python", "-m", "loadtest.bench_server", *(sys.argv[1:] if argv is None else argv)])
    names = [n.strip() for n in args.servers.split(",") if n.strip()]
    try:
        commands = templates(args.server_cmd)
    except ValueError as error:
        p.error(str(error))
    if unknown := [n for n in names if n not in SERVERS]:
        p.error(f"unknown servers {unknown}; choose from {', '.join(SERVERS)}")

    started = datetime.now(UTC)
    t0 = time.monotonic()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    stamp = started.strftime("%Y-%m-%d")
    if (args.out_dir / f"{stamp}-server.json").exists():
        stamp = started.strftime("%Y-%m-%d-%H%M%S")  # never overwrite an earlier record
    info = machine_info()  # before pinning: it reports the cores this run could use
    pin = plan_pinning(args.server_cores, args.loadgen_cores, args.no_pin)
    if pin["loadgen_cores"]:
        try:
            os.sched_setaffinity(0, pin["loadgen_cores"])  # inherited by the generator processes
        except OSError as error:
            pin["notes"].append(f"load generator unpinned: sched_setaffinity failed ({error})")
            pin["loadgen_cores"] = None
    options = PayloadOptions(form=args.form)
    payloads = options.build()
    # hey runs against the ceiling and ours (cuda-graph where it runs), and each multi-worker server.
    ours = "cuda-graph" if info["cuda_available"] and "cuda-graph" in names else "eager"
    hey_targets = {"noop", ours} | {n for n in names if n.endswith("-4w")}
    bench = Bench(args, payloads, options, pin, hey_targets=hey_targets)
    notes = list(pin["notes"])
    if args.hey and bench.hey is None:
        notes.append(f"hey cross-check skipped: {args.hey} not found")

    steps = len(args.concurrencies) + len(args.load_fractions)
    estimate = len(names) * steps * (args.warmup + args.step_duration + 1.5) + 2 * args.step_duration
    print(f"{len(names)} servers × {steps} steps: about {estimate / 60:.1f} min plus start-ups", flush=True)
    servers: dict[str, dict[str, Any]] = {}
    for name in names:
        sdef = SERVERS[name]
        if sdef.needs_cuda and not info["cuda_available"]:
            reason = "skipped: no CUDA device (torch.cuda.is_available() is False)"
            servers[name] = {"role": sdef.role, "skipped": reason}
            notes.append(f"{name} skipped: no CUDA device")
            continue
        servers[name] = bench.server(name, sdef, commands[name], stamp)

    report: dict[str, Any] = {
        "schema": SCHEMA,
        "started_at": started.isoformat(timespec="seconds"),
        "wall_s": round(time.monotonic() - t0, 1),
        "command": command,
        "machine": info,
        "pinning": pin,
        "settings": {
            "form": args.form,
            "concurrencies": args.concurrencies,
            "load_fractions": args.load_fractions,
            "warmup_s": args.warmup,
            "duration_s": args.step_duration,
            "timeout_s": args.timeout,
            "processes": bench.processes,
            "body_bytes_mean": payloads.info["body_bytes_mean"],
        },
        "payloads": payloads.info,
        "servers": servers,
        "ratios": ratios(servers),
        "notes": notes,
    }
    json_path, md_path = args.out_dir / f"{stamp}-server.json", args.out_dir / f"{stamp}-server.md"
    json_path.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2) + b"\n")
    md_path.write_text(markdown(report))
    print(markdown(report))
    print(f"wrote {json_path} and {md_path} in {report['wall_s']:.0f} s")
    return 1 if any("error" in r for r in servers.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
