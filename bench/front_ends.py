"""HTTP front ends side by side on one machine, seed CNN, JSON and raw bodies (issue 25, item 3).

    PYTHONPATH=. python3 bench/front_ends.py --out $OUT/front-ends --hey .gpu/bin/hey

For each worker count (1, 8) and design, in turn, one server on the server cores (0-7) and hey on the
others (8-15), closed loop at --per-worker × workers connections for --seconds:
  raw-noop    loadtest/servers/raw_noop.py: a raw ASGI app on uvicorn, no model: the server's ceiling
  inline      app.cli serve: small predicts answered inside uvicorn's protocol (its private API)
  fast-asgi   app.cli serve --no-inline-predict: the raw ASGI fast path (app/http/fast_path.py), public API
  granian     the same app (fast path, no inline) on granian, a Rust HTTP server, through its ASGI interface
  front-door  app.cli serve --front-door-port: app/front_door's C threads (--workers of them) on a port of
              their own, batching in Python, one process (raw bodies only; readiness on the HTTP port)
Ours run cuda-graph engines, one per worker process, at --compile none by default (seconds to capture; inductor,
the service's default, takes minutes for all buckets of ResNet-50, about one for the seed CNN).
Writes <out>/front-ends.json (every figure and command) and <out>/front-ends.md.
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

from loadtest.hey import hey_command, run_hey
from loadtest.payloads import build_payloads
from loadtest.server_process import ServerProcess, free_port

OURS = "{python} -m app.cli serve --host {host} --port {port} --workers {workers} --grpc-port 0 --log-level warning "
OURS += "--engine {engine} --device {device} --compile {compile} --drain-seconds 0"
DESIGNS = {
    "raw-noop": ("{python} -m loadtest.servers.raw_noop --host {host} --port {port} --workers {workers}", {}),
    "inline": (OURS, {}),
    "fast-asgi": (OURS + " --no-inline-predict", {}),
    "granian": (
        "{python} -m granian --interface asgi --loop uvloop --host {host} --port {port} --workers {workers} "
        "--no-ws --log-level warning --factory app.main:create_app",
        {"CGSERVE_ENGINE": "{engine}", "CGSERVE_DEVICE": "{device}", "CGSERVE_COMPILE": "{compile}",
         "CGSERVE_GRPC_PORT": "0", "CGSERVE_INLINE_PREDICT": "false"},
    ),
    "front-door": (
        OURS.replace("--port {port} --workers {workers}", "--port {http_port} --workers 1")
        + " --front-door-port {port} --front-door-threads {workers}",
        {},
    ),
}  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--hey", default=".gpu/bin/hey")
    p.add_argument("--workers", default="1,8")
    p.add_argument("--designs", default=",".join(DESIGNS))
    p.add_argument("--per-worker", type=int, default=32, help="connections per server worker (default 32)")
    p.add_argument("--forms", default="json,raw", help="request bodies (the front door takes raw only)")
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--server-cores", default="0-7")
    p.add_argument("--loadgen-cores", default="8-15")
    p.add_argument("--device", default="cuda", help="cuda (cuda-graph engines) or cpu (eager: a check of the harness)")
    p.add_argument("--compile", default="none", choices=["none", "inductor"], help="our engines' kernels")
    p.add_argument(
        "--tree",
        type=Path,
        default=None,
        help="run the servers from this copy of the repository (a tree before a change)",
    )
    p.add_argument("--label", default="", help="prefix of each design's name in the record, e.g. before-")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    bodies = {}
    for form in args.forms.split(","):
        payloads = build_payloads(form, check_labels=False, limit=1)
        path = args.out / f"body.{form}"
        path.write_bytes(payloads.bodies[0])
        bodies[form] = (path, payloads.content_type, payloads.path)
    runs: list[dict[str, Any]] = []
    for workers in [int(w) for w in args.workers.split(",")]:
        for design in args.designs.split(","):
            runs.append(run_design(args, design, workers, bodies) | {"design": args.label + design})
    record = {
        "schema": "cgserve-bench-front-ends/1",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": shlex.join([sys.executable, *sys.argv]),
        "tree": str(args.tree) if args.tree else "this checkout",
        "compile": args.compile,
        "runs": runs,
    }
    (args.out / f"{args.label}front-ends.json").write_bytes(orjson.dumps(record, option=orjson.OPT_INDENT_2))
    (args.out / f"{args.label}front-ends.md").write_text(report(runs, args.label))
    print(report(runs, args.label))
    return 0


def run_design(args: argparse.Namespace, design: str, workers: int, bodies: dict[str, Any]) -> dict[str, Any]:
    template, env = DESIGNS[design]
    port, http_port, engine = free_port(), free_port(), "cuda-graph" if args.device == "cuda" else "eager"
    values = {"python": sys.executable, "host": "127.0.0.1", "port": port, "workers": workers, "http_port": http_port}
    fields = {"engine": engine, "device": args.device, "compile": args.compile}
    argv = shlex.split(template.format(**values, **fields))
    env = {name: value.format(**fields) for name, value in env.items()}
    argv = ["taskset", "-c", args.server_cores, *argv]
    out: dict[str, Any] = {"design": design, "workers": workers, "command": shlex.join(argv), "env": env, "forms": {}}
    print(f"{design} × {workers}: {out['command']}", flush=True)
    if args.tree is not None:  # its own app/ first on the path; `python -m` puts the working folder first
        env = env | {"PYTHONPATH": f"{args.tree.resolve()}:{os.environ.get('PYTHONPATH', '')}"}
    log = args.out / f"{args.label}{design}-{workers}.log"
    door = "{http_port}" in template  # the load goes to the front door's port, readiness is asked of HTTP's
    server = ServerProcess(argv, log, port=http_port if door else port, name=design, env=env, cwd=args.tree)
    try:
        out["ready_s"] = round(server.wait_ready(240.0), 1)
        url = f"http://127.0.0.1:{port}" if door else server.url
        for form, (body, content_type, path) in bodies.items():
            c = args.per_worker * workers
            hey = hey_command(
                args.hey, url + path, body, content_type=content_type, concurrency=c, duration_s=args.seconds
            )
            run_hey(["taskset", "-c", args.loadgen_cores, *hey[:2], "1s", *hey[3:]], timeout_s=30)  # warm-up
            result = run_hey(["taskset", "-c", args.loadgen_cores, *hey], timeout_s=args.seconds + 60)
            out["forms"][form] = result | {"concurrency": c}
            print(f"  {form}: {result.get('requests_per_s')} req/s, status {result.get('status_codes')}", flush=True)
    except Exception as error:  # one design failing must not lose the others' figures
        out["error"] = f"{type(error).__name__}: {error}"
        print(f"  failed: {out['error']}\n{server.log_tail(3000)}", flush=True)
    finally:
        server.stop()
        time.sleep(1)  # the port and the GPU's memory back before the next server
    return out


def report(runs: list[dict[str, Any]], label: str = "") -> str:
    """One table per worker count: req/s, p99, and each design ÷ the raw no-op and ÷ inline."""
    lines = ["# HTTP front ends, seed CNN (hey, closed loop)", ""]
    for workers in sorted({r["workers"] for r in runs}):
        mine = {r["design"]: r for r in runs if r["workers"] == workers}
        lines += [f"## {workers} worker(s)", "", "| design | form | req/s | p99 ms | ÷ raw no-op | ÷ inline | codes |",
                  "|---|---|---:|---:|---:|---:|---|"]  # fmt: skip
        for design, run in mine.items():
            for form, figures in run.get("forms", {}).items():
                rps = figures.get("requests_per_s")
                ratios = []
                for base in ("raw-noop", "inline"):
                    ref = mine.get(label + base, {}).get("forms", {}).get(form, {}).get("requests_per_s")
                    ratios.append(f"{rps / ref:.2f}" if rps and ref else "")
                p99 = (figures.get("latency_ms") or {}).get("p99")
                lines.append(f"| {design} | {form} | {rps} | {p99} | {ratios[0]} | {ratios[1]} | "
                             f"{figures.get('status_codes')} |")  # fmt: skip
            if "error" in run:
                lines.append(f"| {design} | — | failed: {run['error'][:80]} | | | | |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
