"""Server benchmark in one run: the HTTP ceiling, the naive baseline and our service, same load.

    PYTHONPATH=. python3 -m loadtest.bench_server --out-dir bench/results [--hey .gpu/bin/hey]

In turn it starts, loads and stops
  noop        loadtest/servers/noop.py: decodes with app.codecs, answers without a model (ceiling)
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
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import orjson

from loadtest.bench_report import markdown, ratios
from loadtest.payloads import PayloadOptions, Payloads
from loadtest.pinning import core_list, plan_pinning
from loadtest.runner import run_load
from loadtest.server_process import HOST, ServerProcess, free_port
from loadtest.spec import LoadSpec

SCHEMA = "cgserve-bench-server/1"


@dataclass(frozen=True)
class ServerDef:
    role: str  # "ceiling", "baseline" or "ours"
    template: str  # {python}, {host}, {port} are filled in
    check_labels: bool = True
    needs_cuda: bool = False


SERVERS = {
    "noop": ServerDef("ceiling", "{python} -m loadtest.servers.noop --host {host} --port {port}", check_labels=False),
    "noop-lean": ServerDef(
        "ceiling, plain route",
        "{python} -m loadtest.servers.noop --host {host} --port {port} --lean",
        check_labels=False,
    ),
    "naive": ServerDef("baseline", "{python} -m loadtest.servers.naive --host {host} --port {port} --device auto"),
    "eager": ServerDef(
        "ours", "{python} -m app.cli serve --host {host} --port {port} --engine eager --device auto --log-level warning"
    ),
    "cuda-graph": ServerDef(
        "ours",
        "{python} -m app.cli serve --host {host} --port {port} --engine cuda-graph --device cuda --log-level warning",
        needs_cuda=True,
    ),
    # The process model: several uvicorn workers on one port, each with its own graphs; compared
    # with the no-op server given the same number of workers.
    "noop-4w": ServerDef(
        "ceiling, 4 workers",
        "{python} -m loadtest.servers.noop --host {host} --port {port} --workers 4",
        check_labels=False,
    ),
    "cuda-graph-4w": ServerDef(
        "ours, 4 workers",
        "{python} -m app.cli serve --host {host} --port {port} --engine cuda-graph --device cuda --log-level warning"
        " --workers 4",
        needs_cuda=True,
    ),
}


def resolve_hey(path: str | None) -> str | None:
    """hey's absolute path, or None where it is absent."""
    if not path:
        return None
    if Path(path).is_file():
        return str(Path(path).resolve())
    return shutil.which(path)


def machine_info() -> dict[str, Any]:
    import fastapi
    import torch
    import uvicorn

    cpu_model = ""
    with contextlib.suppress(OSError, StopIteration):
        cpu_model = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    info: dict[str, Any] = {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_model": cpu_model,
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "fastapi": fastapi.__version__,
        "uvicorn": uvicorn.__version__,
        "httpx": httpx.__version__,
    }
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        dirty = subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True, timeout=5)
        info["git_commit"] = commit.stdout.strip() if commit.returncode == 0 else None
        info["git_dirty"] = bool(dirty.stdout.strip()) if dirty.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        info["git_commit"] = None
    return info


def run_hey(
    hey: str, url: str, body_path: Path, *, concurrency: int, duration_s: float, prefix: list[str]
) -> dict[str, Any]:
    """hey at `concurrency` for `duration_s`, every request with the JSON body in `body_path`."""
    argv = [*prefix, hey, "-z", f"{duration_s:g}s", "-c", str(concurrency), "-m", "POST"]
    argv += ["-T", "application/json", "-D", str(body_path), f"{url}/predict"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=duration_s + 60).stdout
    return parse_hey(out) | {"command": shlex.join(argv)}


def parse_hey(out: str) -> dict[str, Any]:
    """Requests/s, latency percentiles (ms) and status codes from hey's text summary."""
    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    latency = {f"p{q}": round(float(v) * 1e3, 3) for q, v in re.findall(r"\s(\d+)% in ([\d.]+) secs", out)}
    return {
        "requests_per_s": float(rps.group(1)) if rps else None,
        "latency_ms": {k: latency[k] for k in ("p50", "p90", "p99") if k in latency},
        "status_codes": {code: int(n) for code, n in re.findall(r"\[(\d+)\]\s+(\d+) responses", out)},
        "raw_tail": out[-1500:] if rps is None else None,
    }


class Bench:
    def __init__(self, args: argparse.Namespace, payloads: Payloads, options: PayloadOptions, pin: dict[str, Any]):
        self.args, self.payloads, self.options, self.pin = args, payloads, options, pin
        loadgen = pin["loadgen_cores"]
        self.processes = args.processes or (len(loadgen) if loadgen else max(1, (os.cpu_count() or 2) // 2))
        self.loadgen_prefix = ["taskset", "-c", core_list(loadgen)] if loadgen else []
        self.server_prefix = ["taskset", "-c", core_list(pin["server_cores"])] if pin["server_cores"] else []
        self.hey = resolve_hey(args.hey)
        self.hey_targets = {"noop", "eager"}  # set by main(): the ceiling and ours (cuda-graph where it runs)

    def step(self, name: str, url: str, payloads: Payloads, **load: Any) -> dict[str, Any]:
        a = self.args
        spec = LoadSpec(
            url=url,
            processes=self.processes,
            warmup_s=a.warmup,
            duration_s=a.step_duration,
            timeout_s=a.timeout,
            **load,
        )
        options = replace(self.options, check_labels=payloads.expected is not None)
        command = shlex.join([*self.loadgen_prefix, "python", "-m", "loadtest", *spec.to_args(), *options.to_args()])
        what = f"c{load['concurrency']}" if "concurrency" in load else f"{load['rate']:.0f}/s"
        record = run_load(spec, payloads, command=command, label=f"{name} {what}")
        lat = record["latency_ms"]
        print(
            f"  {name:<10} {what:>8}: {record['throughput_rps']:>9,.1f} req/s  p50 {lat['p50'] or 0:7.2f} ms  "
            f"p99 {lat['p99'] or 0:7.2f} ms  errors {record['counts']['errors']}  "
            f"generator busy {record['loadgen_cpu_busy'] or 0:.0%}",
            flush=True,
        )
        return record

    def server(self, name: str, sdef: ServerDef, template: str, stamp: str) -> dict[str, Any]:
        a = self.args
        port = free_port()
        argv = [*self.server_prefix, *shlex.split(template.format(python=sys.executable, host=HOST, port=port))]
        out: dict[str, Any] = {"role": sdef.role, "command": shlex.join(argv), "labels_checked": sdef.check_labels}
        payloads = self.payloads if sdef.check_labels else replace(self.payloads, expected=None)
        print(f"{name}: {out['command']}", flush=True)
        server = ServerProcess(argv, a.out_dir / "logs" / f"{stamp}-{name}.log", port=port, name=name)
        out["log"] = str(server.log_path)
        try:
            url = server.url
            out["ready_s"] = round(server.wait_ready(a.startup_timeout), 2)
            card = httpx.get(f"{url}/v1/models", timeout=5, trust_env=False)
            if card.status_code == 200:
                out["model_card"] = card.json()
            out["closed_loop"] = [self.step(name, url, payloads, concurrency=c) for c in a.concurrencies]
            clean = [r for r in out["closed_loop"] if r["counts"]["errors"] == 0] or out["closed_loop"]
            best = max(clean, key=lambda r: r["throughput_rps"])
            out["saturation"] = {
                "throughput_rps": best["throughput_rps"],
                "concurrency": best["concurrency"],
                "p99_ms": best["latency_ms"]["p99"],
                "rule": "highest closed-loop throughput among error-free steps",
            }
            out["open_loop"] = []
            for fraction in a.load_fractions:
                rate = round(fraction * best["throughput_rps"], 1)
                if rate <= 0:
                    continue
                record = self.step(name, url, payloads, rate=rate)
                record["fraction_of_saturation"] = fraction
                out["open_loop"].append(record)
            if name in self.hey_targets and self.hey:
                out["hey"] = self.cross_check(url, out["closed_loop"])
        except Exception as error:  # one server failing must not lose the others' figures
            out["error"] = f"{type(error).__name__}: {error}"
            print(f"  {name} failed: {out['error']}", flush=True)
        finally:
            out["exit_code_before_stop"] = server.proc.poll()  # None: it was still serving
            server.stop()
        return out

    def cross_check(self, url: str, closed: list[dict[str, Any]]) -> dict[str, Any]:
        c = self.args.hey_concurrency or self.args.concurrencies[0]
        ours = next((r for r in closed if r["concurrency"] == c), None)
        body_path = self.args.out_dir / "logs" / "hey-body.json"
        body_path.write_bytes(self.payloads.bodies[0])
        result = run_hey(
            self.hey,
            url,
            body_path,
            concurrency=c,
            duration_s=self.args.step_duration,
            prefix=self.loadgen_prefix,
        )
        result |= {"concurrency": c, "loadtest_requests_per_s": ours["throughput_rps"] if ours else None}
        if result["requests_per_s"] and ours:
            result["loadtest_over_hey"] = round(ours["throughput_rps"] / result["requests_per_s"], 3)
        print(f"  hey c{c}: {result['requests_per_s']} req/s (ours {result['loadtest_requests_per_s']})", flush=True)
        return result


def _floats(text: str) -> list[float]:
    return [float(v) for v in text.split(",") if v.strip()]


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m loadtest.bench_server",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out-dir", type=Path, required=True, help="where the JSON, the markdown and logs/ go")
    p.add_argument("--servers", default=",".join(SERVERS), help="which to run, in order (default %(default)s)")
    p.add_argument(
        "--server-cmd",
        action="append",
        default=[],
        metavar="NAME=TEMPLATE",
        help="replace a server's command; {python} {host} {port} are filled in, e.g. "
        "'eager={python} -m app.cli serve --host {host} --port {port} --engine eager' (repeatable)",
    )
    p.add_argument("--server-cores", default="auto", help="taskset list for servers (default: lower half)")
    p.add_argument("--loadgen-cores", default="auto", help="cores for the load generator (default: upper half)")
    p.add_argument("--no-pin", action="store_true", help="pin nothing")
    p.add_argument("--processes", type=int, help="load-generator processes (default: one per load-generator core)")
    p.add_argument("--concurrencies", type=_ints, default=[16, 32, 64], help="closed-loop steps (default 16,32,64)")
    p.add_argument("--load-fractions", type=_floats, default=[0.5, 0.9], help="open-loop steps (default 0.5,0.9)")
    p.add_argument("--step-duration", type=float, default=8.0, help="measured seconds per step (default 8)")
    p.add_argument("--warmup", type=float, default=2.0, help="warm-up seconds per step (default 2)")
    p.add_argument("--timeout", type=float, default=5.0, help="per-request timeout, s (default 5)")
    p.add_argument("--startup-timeout", type=float, default=180.0, help="seconds to wait for /readyz (default 180)")
    p.add_argument("--form", choices=("json", "png", "raw"), default="json", help="request body form (default json)")
    p.add_argument("--hey", default=".gpu/bin/hey", help="hey binary for the cross-check; skipped if absent")
    p.add_argument("--hey-concurrency", type=int, help="hey's concurrency (default: the first of --concurrencies)")
    args = p.parse_args(argv)
    command = shlex.join(["python", "-m", "loadtest.bench_server", *(sys.argv[1:] if argv is None else argv)])

    names = [n.strip() for n in args.servers.split(",") if n.strip()]
    templates = {n: d.template for n, d in SERVERS.items()}
    for item in args.server_cmd:
        name, sep, template = item.partition("=")
        if not sep or name not in SERVERS:
            p.error(f"--server-cmd takes NAME=TEMPLATE with NAME in {', '.join(SERVERS)}; got {item!r}")
        templates[name] = template
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
    bench = Bench(args, payloads, options, pin)
    bench.hey_targets = {"noop", "cuda-graph" if info["cuda_available"] and "cuda-graph" in names else "eager"}
    bench.hey_targets |= {n for n in names if n.endswith("-4w")}
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
        servers[name] = bench.server(name, sdef, templates[name], stamp)

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
