"""Side by side, one run, same model and load: our engines and the servers a user would pick instead.

    python3 bench/side_by_side.py --out DIR [--model resnet50] [--compile-cache-dir /tmp/inductor-cache]

In turn it starts, loads and stops, each on the same copy of the model's repository folder:
  cuda-graph       ours, engine cuda-graph, compile inductor (CUDA only)
  eager            ours, engine eager
  reduce-overhead  ours, engine compile: torch.compile mode reduce-overhead (CUDA only)
  naive            loadtest/servers/naive.py: one eager forward per request, waited for
  litserve         loadtest/servers/litserve_server.py: LitServe 0.2.19, batching on (max_batch_size = our
                   largest bucket, batch_timeout = our max_delay_ms)
  onnxruntime      ours, engine onnxruntime on an ONNX export of the model made now (torch.onnx.export),
                   with the providers its model.toml names: CPUExecutionProvider
Every server decodes the same bodies with app.codecs.bodies and answers the same JSON. Closed-loop steps
at --concurrencies find each server's saturation; one open-loop Poisson step at the fixed --rate
gives p50/p99 at a moderate load, the same for all. Servers on one half of the cores (taskset),
the load generator on the other (bench/harness/pinning.py). resnet50 gets raw uint8 bodies of
one random 3×224×224 image (labels not checked: random weights); the seed CNN real test images,
raw or JSON (--form), each answer's labels checked against the eager model's.
Writes DIR/side-by-side-<model>.json (every figure and command) and .md (the README's table)
after each server, and each server's log under DIR/logs/.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]  # run as a script: the repository's packages and engine_compare

from engine_compare import REPOSITORIES, onnx_twin  # noqa: E402

from bench.harness.machine import machine_info  # noqa: E402
from bench.harness.measure import Bench, add_run_args, best_closed_loop  # noqa: E402
from bench.harness.pinning import pin_generator, plan_pinning  # noqa: E402
from bench.harness.side_by_side_report import markdown  # noqa: E402
from loadtest.payloads import PayloadOptions, Payloads  # noqa: E402
from loadtest.server_process import HOST, ServerProcess, free_port  # noqa: E402

SCHEMA = "cgserve-side-by-side/1"
_SERVE = "{python} -m app.cli serve --host {host} --port {port} --grpc-port 0 --log-level warning"
_REFERENCE = "{python} -m loadtest.servers.%s --host {host} --port {port}"
# name → (what it is, command template, needs CUDA); bench.harness.servers.server_argv fills in
# {python} {host} {port}; the model's repository and the device are appended.
# In the order they run: ONNX Runtime (on the CPU, its export first) last, where a time limit cuts.
SERVERS: dict[str, tuple[str, str, bool]] = {
    "cuda-graph": ("ours: CUDA graphs of inductor's kernels", f"{_SERVE} --engine cuda-graph --compile inductor", True),
    "eager": ("ours: eager engine", f"{_SERVE} --engine eager", False),
    "reduce-overhead": ("ours: torch.compile reduce-overhead", f"{_SERVE} --engine compile", True),
    "naive": ("one request, one forward", _REFERENCE % "naive", False),
    "litserve": ("LitServe 0.2.19, batching on", _REFERENCE % "litserve_server", False),
    "onnxruntime": ("ours: ONNX Runtime", _SERVE, False),
}


class SideBySide(Bench):
    """Closed-loop saturation, then one open-loop step at the run's fixed rate (not a fraction)."""

    def server(self, name: str, what: str, template: str, stamp: str) -> dict[str, Any]:
        """Every figure of one server; an `error` in place of the rest where it failed."""
        port = free_port()
        argv = [*self.server_prefix, *shlex.split(template.format(python=sys.executable, host=HOST, port=port))]
        labels = self.payloads.expected is not None
        out: dict[str, Any] = {"role": what, "command": shlex.join(argv), "labels_checked": labels}
        print(f"{name}: {out['command']}", flush=True)
        server = ServerProcess(argv, self.args.out / "logs" / f"{stamp}-{name}.log", port=port, name=name)
        out["log"] = str(server.log_path)
        try:
            out["ready_s"] = round(server.wait_ready(self.args.startup_timeout), 2)
            card = httpx.get(f"{server.url}/v1/models", timeout=5, trust_env=False)
            if card.status_code == 200:
                out["model_card"] = card.json()
            out |= self.saturation_and_p99(name, server.url, self.payloads)
        except Exception as error:  # one server failing must not lose the others' figures
            out["error"] = f"{type(error).__name__}: {error}"
            print(f"  {name} failed: {out['error']}", flush=True)
        finally:
            out["exit_code_before_stop"] = server.proc.poll()  # None: it was still serving
            server.stop()
        return out

    def saturation_and_p99(self, name: str, url: str, payloads: Payloads) -> dict[str, Any]:
        closed = [self.step(name, url, payloads, concurrency=c) for c in self.args.concurrencies]
        best = best_closed_loop(closed)
        fixed = self.step(name, url, payloads, rate=self.args.rate)
        # Kept up: answered, without error, at least 95% of what was sent in the window; else its p99
        # is a growing queue's. (Poisson arrivals in a short window send less or more than --rate.)
        kept_up = fixed["counts"]["errors"] == 0 and fixed["throughput_rps"] >= 0.95 * fixed["offered_rate_rps"]
        return {
            "closed_loop": closed,
            "saturation": {
                "throughput_rps": best["throughput_rps"],
                "concurrency": best["concurrency"],
                "rule": "highest closed-loop throughput among error-free steps",
            },
            "open_loop": [fixed | {"kept_up": kept_up}],
        }


def model_repository(model: str, work: Path) -> Path:
    """A repository holding a copy of the one model's folder: our service loads nothing else."""
    source = REPOSITORIES[model] / model
    if not source.is_dir():
        raise SystemExit(f"{source}: no such model folder")
    shutil.copytree(source, work / "repository" / model)
    return work / "repository"


def onnx_repository(repository: Path, model: str) -> tuple[Path, tuple[str, ...]]:
    """The model exported to ONNX (torch.onnx.export) into a repository of its own, and the
    execution providers its model.toml gives ONNX Runtime (the default: the CPU's alone)."""
    from app.repository import read_repository

    (spec,) = [s for s in read_repository(repository) if s.name == model]
    twin = onnx_twin(spec)
    return twin.folder.parent, twin.config.providers


def write(report: dict[str, Any], stem: Path) -> None:
    stem.with_suffix(".json").write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2) + b"\n")
    stem.with_suffix(".md").write_text(markdown(report))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = p.add_argument
    add("--out", type=Path, required=True, help="where the JSON, the markdown and logs/ go")
    add("--model", choices=list(REPOSITORIES), default="resnet50")
    add("--servers", default=",".join(SERVERS), help="which, in order (default %(default)s)")
    add("--device", default="auto", help="every server's device: auto | cpu | cuda (default auto)")
    add("--form", choices=("raw", "json"), default="raw", help="body form for the seed CNN (resnet50: raw)")
    add("--concurrencies", default="16,64,256", help="closed-loop steps (default %(default)s)")
    add("--rate", type=float, default=100.0, help="the fixed open-loop rate, req/s (default %(default)s)")
    add("--compile-cache-dir", type=Path, help="inductor's cache (CGSERVE_COMPILE_CACHE_DIR): warm start-ups")
    add_run_args(p, warmup=1.5, step_duration=4.0)
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    names = [n.strip() for n in args.servers.split(",") if n.strip()]
    if unknown := [n for n in names if n not in SERVERS]:
        p.error(f"unknown servers {unknown}; choose from {', '.join(SERVERS)}")
    args.concurrencies = [int(c) for c in args.concurrencies.split(",") if c.strip()]
    if not args.concurrencies or min(args.concurrencies) < 1 or args.rate <= 0:
        p.error("--concurrencies takes positive integers and --rate a positive rate")
    args.hey = None  # what Bench reads: no hey cross-check here
    command = shlex.join(["python3", "bench/side_by_side.py", *(sys.argv[1:] if argv is None else argv)])
    if args.compile_cache_dir:  # inherited by every server process
        os.environ["CGSERVE_COMPILE_CACHE_DIR"] = str(args.compile_cache_dir.resolve())
    started, t0 = datetime.now(UTC), time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    info = machine_info()  # before pinning: it reports the cores this run could use
    pin = plan_pinning(args.server_cores, args.loadgen_cores, args.no_pin)
    pin_generator(pin)  # inherited by the generator processes
    if args.model == "resnet50":
        options = PayloadOptions(form="raw", image_shape=(3, 224, 224), check_labels=False)
    else:
        options = PayloadOptions(form=args.form)
    payloads = options.build()
    bench = SideBySide(args, payloads, options, pin)
    servers: dict[str, dict[str, Any]] = {}
    report: dict[str, Any] = {
        "schema": SCHEMA,
        "started_at": started.isoformat(timespec="seconds"),
        "wall_s": None,
        "complete": False,
        "command": command,
        "model": args.model,
        "machine": info,
        "pinning": pin,
        "settings": {
            "form": payloads.form,
            "concurrencies": args.concurrencies,
            "rate_rps": args.rate,
            "warmup_s": args.warmup,
            "duration_s": args.step_duration,
            "timeout_s": args.timeout,
            "processes": bench.processes,
            "body_bytes": len(payloads.bodies[0]),
            "labels_checked": payloads.expected is not None,
        },
        "servers": servers,
        "notes": list(pin["notes"]),
    }
    stem = args.out / f"side-by-side-{args.model}"
    # A run stopped by its time limit (SIGTERM) stops the server it was loading (SideBySide.server's
    # `finally`) and leaves the servers it had finished: the record is written after each.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with tempfile.TemporaryDirectory(prefix="side-by-side-") as work:
        repository = model_repository(args.model, Path(work))
        for name in names:
            what, template, needs_cuda = SERVERS[name]
            if needs_cuda and not info["cuda_available"]:
                servers[name] = {"role": what, "skipped": "no CUDA device"}
                continue
            folder = repository
            if name == "onnxruntime":
                exported = time.monotonic()
                folder, providers = onnx_repository(repository, args.model)
                report["notes"].append(f"onnxruntime: ONNX export took {time.monotonic() - exported:.0f} s")
                what += f" ({', '.join(providers)})"
            template += f" --model-repository {folder} --device {args.device}"
            servers[name] = bench.server(name, what, template, started.strftime("%H%M%S"))
            if folder != repository:
                shutil.rmtree(folder, ignore_errors=True)  # the repository onnx_twin made in a temporary folder
            report["wall_s"] = round(time.monotonic() - t0, 1)
            write(report, stem)
    report["complete"] = True
    write(report, stem)
    print(markdown(report))
    print(f"wrote {stem}.json and {stem}.md in {report['wall_s']:.0f} s")
    return 1 if any("error" in r for r in servers.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
