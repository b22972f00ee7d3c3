"""Profile a server under closed-loop load on the GPU machine: where does a request's CPU go?

    PYTHONPATH=. python3 bench/profile_server.py OUT_DIR [--target ours|noop] [--form json|raw]
        [--concurrency 32] [--tag NAME] [--process server|engine-process] [server flags...]

The server (ours: `app.cli serve` with the server flags; noop: loadtest/servers/noop.py --lean) on
--server-cores, hey (one body of one image, 12 s) on --loadgen-cores, and py-spy sampling the
server for 6 s from 3 s into the load (the steady state, not hey's first connections), --gil: the
samples are where the thread holding the GIL was, so the event loop's CPU and not its idle
waits; --nonblocking: py-spy pausing the server for each sample halved the no-op's rate (run
15a). Writes, under OUT_DIR with the prefix TAG: -raw.txt (py-spy raw: one line per stack),
-summary.txt (the functions by own and by inclusive share of samples), -hey.csv, -server.log,
-metrics.txt (ours: /metrics after the load, for the batches' rows), and prints hey's figures.
"""

from __future__ import annotations

import argparse
import collections
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import orjson

from bench.harness.process_cpu import role, tree
from loadtest.hey import hey_command, parse_hey_csv, resolve_hey
from loadtest.server_process import HOST, free_port, running

HEY_S, PROFILE_FROM_S, PROFILE_S = 12.0, 3.0, 6
TOP = 45


def summarise(raw: str) -> str:
    """py-spy's raw stacks ("frame;frame;… count" per line, a frame "function (file:line)") → the top
    frames by own and by inclusive share of the samples, and the top functions by inclusive share
    (every line of a function together: what a call of it costs)."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    functions: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        frames, n = stack.split(";"), int(count)
        total += n
        own[frames[-1]] += n
        for frame in set(frames):
            inclusive[frame] += n
        for function in {frame.rpartition(":")[0] for frame in frames}:  # "name (file" without the line
            functions[function] += n
    lines = [f"{total} samples", "--- own"]
    lines += [f"{100 * n / total:5.1f}% {frame}" for frame, n in own.most_common(TOP)]
    lines += ["--- inclusive"]
    lines += [f"{100 * n / total:5.1f}% {frame}" for frame, n in inclusive.most_common(TOP * 2)]
    lines += ["--- inclusive, by function"]
    lines += [f"{100 * n / total:5.1f}% {function})" for function, n in functions.most_common(TOP * 4)]
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out_dir", type=Path)
    p.add_argument("--target", choices=("ours", "noop"), default="ours")
    p.add_argument("--form", choices=("json", "raw"), default="json")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--tag", default="profile", help="prefix of the files written (default %(default)s)")
    p.add_argument("--server-cores", default="0-7", help="taskset list for the server (default %(default)s)")
    p.add_argument("--loadgen-cores", default="8-15", help="taskset list for hey (default %(default)s)")
    p.add_argument("--hey", default=".gpu/bin/hey")
    p.add_argument("--py-spy", default="py-spy")
    p.add_argument(
        "--process",
        choices=("server", "engine-process"),
        default="server",
        help="the process sampled: the one started (with --workers 1, the one that serves) or the engine process "
        "(the server needs its own --engine-process flag)",
    )
    args, server_flags = p.parse_known_args()
    hey = resolve_hey(args.hey)
    if hey is None:
        p.error(f"hey not found at {args.hey}")
    out: Path = args.out_dir
    out.mkdir(parents=True, exist_ok=True)
    prefix = out / args.tag
    if args.form == "json":
        body, content_type = orjson.dumps({"instances": [[0.5] * 784]}), "application/json"
    else:
        body, content_type = np.full((1, 1, 28, 28), 128, np.uint8).tobytes(), "application/octet-stream"
    body_path = prefix.with_name(f"{args.tag}-body.{args.form}")
    body_path.write_bytes(body)

    port = free_port()
    listen = ["--host", HOST, "--port", str(port)]
    if args.target == "ours":
        serve = [sys.executable, "-m", "app.cli", "serve", *listen, "--log-level", "warning"]
    else:
        serve = [sys.executable, "-m", "loadtest.servers.noop", *listen, "--lean"]
    server_argv = ["taskset", "-c", args.server_cores, *serve, *server_flags]  # taskset execs: same pid
    log = prefix.with_name(f"{args.tag}-server.log")
    with running(server_argv, log, port=port, ready_timeout_s=180) as server:
        pid = server.proc.pid
        if args.process == "engine-process":  # found before any load starts: no hey left behind
            engines = [c for c in tree(server.proc.pid) if role(c, server.proc.pid) == "engine-process"]
            if len(engines) != 1:
                p.error(f"--process engine-process: the server has {len(engines)} engine processes (--engine-process?)")
            pid = engines[0]
        load_argv = hey_command(
            hey, f"{server.url}/predict", body_path, content_type=content_type,
            concurrency=args.concurrency, duration_s=HEY_S,
        )  # fmt: skip
        hey_csv = prefix.with_name(f"{args.tag}-hey.csv")
        with hey_csv.open("wb") as csv_out:
            load = subprocess.Popen(["taskset", "-c", args.loadgen_cores, *load_argv], stdout=csv_out)
            time.sleep(PROFILE_FROM_S)
            raw_path = prefix.with_name(f"{args.tag}-raw.txt")
            spy = [args.py_spy, "record", "--gil", "--nonblocking", "--pid", str(pid)]
            spy += ["--duration", str(PROFILE_S), "--rate", "500", "--format", "raw", "--output", str(raw_path)]
            profiled = subprocess.run(spy, capture_output=True, text=True)
            load.wait(timeout=HEY_S + 60)
        if args.target == "ours":
            scraped = httpx.get(f"{server.url}/metrics", timeout=10).text
            prefix.with_name(f"{args.tag}-metrics.txt").write_text(scraped)
    if profiled.returncode != 0:
        print(f"py-spy failed ({profiled.returncode}): {profiled.stderr.strip()[-500:]}", file=sys.stderr)
    else:
        prefix.with_name(f"{args.tag}-summary.txt").write_text(summarise(raw_path.read_text()))
    hey_result = parse_hey_csv(hey_csv.read_text())
    lat = hey_result["latency_ms"]
    print(
        f"{args.tag}: hey {hey_result['requests_per_s']} req/s at c{args.concurrency}, p50 {lat['p50']} ms, "
        f"p99 {lat['p99']} ms, status {hey_result['status_codes']}"
    )
    return profiled.returncode


if __name__ == "__main__":
    sys.exit(main())
