"""Profile the service under closed-loop load on the GPU machine: where does a request's CPU go?

    PYTHONPATH=. python3 bench/profile_server.py OUT_DIR [server flags...]

The server (started through loadtest/server_process.py) on --server-cores, hey (16 connections,
one JSON body, 12 s) on --loadgen-cores, and py-spy sampling the server for 6 s from 3 s into
the load (the steady state, not hey's first connections). Writes OUT_DIR/profile-raw.txt (py-spy,
--gil, raw: one line per stack), profile-hey.csv, profile-server.log, and prints hey's figures.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import orjson

from loadtest.hey import hey_command, parse_hey_csv, resolve_hey
from loadtest.server_process import HOST, free_port, running

HEY_S, PROFILE_FROM_S, PROFILE_S = 12.0, 3.0, 6


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out_dir", type=Path)
    p.add_argument("--server-cores", default="0-7", help="taskset list for the server (default %(default)s)")
    p.add_argument("--loadgen-cores", default="8-15", help="taskset list for hey (default %(default)s)")
    p.add_argument("--hey", default=".gpu/bin/hey")
    p.add_argument("--py-spy", default="py-spy")
    args, server_flags = p.parse_known_args()
    hey = resolve_hey(args.hey)
    if hey is None:
        p.error(f"hey not found at {args.hey}")
    out: Path = args.out_dir
    out.mkdir(parents=True, exist_ok=True)
    body = out / "body.json"
    body.write_bytes(orjson.dumps({"instances": [[0.5] * 784]}))

    port = free_port()
    serve = [sys.executable, "-m", "app.cli", "serve", "--host", HOST, "--port", str(port), "--log-level", "warning"]
    server_argv = ["taskset", "-c", args.server_cores, *serve, *server_flags]  # taskset execs: same pid
    with running(server_argv, out / "profile-server.log", port=port, ready_timeout_s=180) as server:
        load_argv = hey_command(
            hey, f"{server.url}/predict", body, content_type="application/json", concurrency=16, duration_s=HEY_S
        )
        with (out / "profile-hey.csv").open("wb") as csv_out:
            load = subprocess.Popen(["taskset", "-c", args.loadgen_cores, *load_argv], stdout=csv_out)
            time.sleep(PROFILE_FROM_S)
            spy = [args.py_spy, "record", "--gil", "--pid", str(server.proc.pid), "--duration", str(PROFILE_S)]
            spy += ["--rate", "500", "--format", "raw", "--output", str(out / "profile-raw.txt")]
            profiled = subprocess.run(spy, capture_output=True, text=True)
            load.wait(timeout=HEY_S + 60)
    if profiled.returncode != 0:
        print(f"py-spy failed ({profiled.returncode}): {profiled.stderr.strip()[-500:]}", file=sys.stderr)
    hey_result = parse_hey_csv((out / "profile-hey.csv").read_text())
    lat = hey_result["latency_ms"]
    print(
        f"hey: {hey_result['requests_per_s']} req/s, p50 {lat['p50']} ms, p99 {lat['p99']} ms, "
        f"status {hey_result['status_codes']}; profile in {out / 'profile-raw.txt'}"
    )
    return profiled.returncode


if __name__ == "__main__":
    sys.exit(main())
