"""The SLO tuner's settings against the defaults, at the same p99 bound, on the real server.

    PYTHONPATH=. python bench/tune_bench.py --out DIR --slo-p99-ms 25 --model resnet50 \\
        --model-repository models/examples/repository --compile none

1. `cudagraph-serve tune` for the SLO (its env file and JSON report land in --out).
2. For the defaults, then the tuned settings: the real server (loadtest/server_process.py),
   pinned to the lower half of the cores, the load generator on the upper half (as
   bench/harness/pinning.py pins every server benchmark); the highest open-loop Poisson rate whose p99 ≤ SLO with no
   error: from a first guess (the tuner's prediction) ×1.5 up or ÷2 down to a pass and a fail,
   then bisected (geometric midpoints); the first guess is capped at 80 % of the server's closed-loop
   saturation (64 in flight), measured first. Raw uint8 bodies of one image to /v1/models/NAME/predict.
3. DIR/tune-bench.json: both capacities, their ratio, every step, and the tuner's predictions
   beside the measurements.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from app.config import DEFAULT_REPOSITORY
from app.repository.model_config import read_model_config
from bench.harness.machine import machine_info
from bench.harness.pinning import core_list, pin_generator, plan_pinning
from loadtest.payloads import PayloadOptions, Payloads
from loadtest.runner import run_load
from loadtest.server_process import HOST, ServerProcess, free_port
from loadtest.spec import LoadSpec
from loadtest.sweep import step_verdict

SCHEMA = "cgserve-tune-bench/1"
PROBE_CONCURRENCY = 64  # the closed-loop step that finds a server's saturation


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = p.add_argument
    add("--out", type=Path, required=True, help="folder for tune-bench.json, tuned.env, tune.json and logs/")
    add("--slo-p99-ms", type=float, required=True, help="the p99 bound both settings are held to")
    add("--model", default="fashion-cnn", help="model to tune and load (default fashion-cnn, the seed CNN)")
    add("--model-repository", type=Path, default=DEFAULT_REPOSITORY, help="repository (default: the shipped one)")
    add("--device", default="auto", help="device setting for the tuner and both servers (default auto)")
    add("--compile", default=None, help="compile setting (none saves inductor's compile time)")
    add("--compile-cache-dir", type=Path, default=None, help="inductor's cache, shared by every process here")
    add("--max-bucket", type=int, default=256, help="the tuner's largest candidate bucket (default 256)")
    add("--runs", type=int, default=50, help="the tuner's timed batches per bucket (default 50)")
    add("--step-duration", type=float, default=3.0, help="measured seconds per load step (default 3)")
    add("--warmup", type=float, default=1.0, help="warm-up seconds per load step (default 1)")
    add("--bisect-steps", type=int, default=3, help="bisections after a pass and a fail are found (default 3)")
    add("--processes", type=int, default=None, help="load-generator processes (default: one per generator core)")
    add("--no-pin", action="store_true", help="pin nothing (taskset)")
    add("--startup-timeout", type=float, default=300.0, help="seconds a server may take to get ready")
    return p


def settings_env(args: argparse.Namespace) -> dict[str, str]:
    """The CGSERVE_* variables the tuner and both servers share."""
    env = {"CGSERVE_MODEL_REPOSITORY": str(args.model_repository.resolve()), "CGSERVE_DEVICE": args.device}
    env |= {"CGSERVE_GRPC_PORT": "0", "CGSERVE_LOG_LEVEL": "warning"}
    if args.compile:
        env["CGSERVE_COMPILE"] = args.compile
    if args.compile_cache_dir:
        env["CGSERVE_COMPILE_CACHE_DIR"] = str(args.compile_cache_dir.resolve())
    return env


def read_env_file(path: Path) -> dict[str, str]:
    lines = (line.strip() for line in path.read_text().splitlines())
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


class Capacity:
    """The highest Poisson rate with p99 ≤ SLO and no error, against one running server."""

    def __init__(self, args: argparse.Namespace, payloads: Payloads, processes: int, prefix: list[str]) -> None:
        self.args, self.payloads, self.processes, self.prefix = args, payloads, processes, prefix

    def step(self, url: str, name: str, **load: float) -> dict[str, Any]:
        """One load run, `rate=` (open loop, Poisson) or `concurrency=` (closed loop); its summary."""
        a = self.args
        # A request 10× past the SLO has failed the step anyway: a short timeout keeps overload steps short.
        timeout_s = max(1.0, a.slo_p99_ms / 100)
        spec = LoadSpec(
            url=url,
            processes=self.processes,
            warmup_s=a.warmup,
            duration_s=a.step_duration,
            timeout_s=timeout_s,
            **load,  # type: ignore[arg-type]
        )
        command = shlex.join([*self.prefix, "python", "-m", "loadtest", *spec.to_args()])
        record = run_load(spec, self.payloads, command=command, progress=False, label=name)
        passed, verdict = step_verdict(record, a.slo_p99_ms)
        if spec.rate is None:  # the closed-loop probe: only its throughput is used
            passed, verdict = False, f"saturation probe ({verdict})"
        lat = record["latency_ms"]
        what = f"c{spec.concurrency}" if spec.rate is None else f"{spec.rate:,.0f}/s"
        print(f"  {name:<8} {what:>11}: {record['throughput_rps']:>9,.1f} req/s  p50 {lat['p50'] or 0:7.2f} ms  "
              f"p99 {lat['p99'] or 0:7.2f} ms  errors {record['counts']['errors']}  {verdict}", flush=True)  # fmt: skip
        return {
            "target_rate_rps": spec.rate,
            "concurrency": spec.concurrency,
            "throughput_rps": record["throughput_rps"],
            "latency_ms": lat,
            "errors": record["counts"]["errors"],
            "loadgen_cpu_busy": record.get("loadgen_cpu_busy"),
            "passed": passed,
            "verdict": verdict,
            "command": command,
        }

    def search(self, url: str, guess: float, name: str) -> dict[str, Any]:
        # Where the host, not the device, saturates first the prediction is far too high: a closed-loop
        # step finds the server's saturation, and the search starts at 80 % of it if that is lower.
        probe = self.step(url, name, concurrency=PROBE_CONCURRENCY)
        steps: list[dict[str, Any]] = [probe]
        passed, failed = None, None  # the highest passing and lowest failing rates so far
        rate = max(1.0, min(guess, 0.8 * probe["throughput_rps"]))
        for _ in range(8):  # ramp: ×1.5 up while passing, ÷2 down while failing
            step = self.step(url, name, rate=round(rate, 1))
            steps.append(step)
            if step["passed"]:
                passed, rate = step, rate * 1.5
            else:
                failed, rate = step, rate / 2
            if (passed and failed) or rate < 1:
                break
        for _ in range(self.args.bisect_steps if passed and failed else 0):
            assert passed is not None and failed is not None
            rate = math.sqrt(passed["target_rate_rps"] * failed["target_rate_rps"])
            step = self.step(url, name, rate=round(rate, 1))
            steps.append(step)
            passed, failed = (step, failed) if step["passed"] else (passed, step)
        return {
            "capacity_rps": passed["target_rate_rps"] if passed else None,
            "p99_at_capacity_ms": passed["latency_ms"]["p99"] if passed else None,
            "throughput_at_capacity_rps": passed["throughput_rps"] if passed else None,
            "first_failing_rate_rps": failed["target_rate_rps"] if failed else None,
            "closed_loop_saturation_rps": probe["throughput_rps"],
            "steps": steps,
        }


def measure_server(
    args: argparse.Namespace,
    name: str,
    env: dict[str, str],
    capacity: Capacity,
    prefix: list[str],
    predicted: dict[str, Any],
) -> dict[str, Any]:
    """Start the real server with `env`, find its capacity under the SLO, stop it."""
    port = free_port()
    serve = [*prefix, sys.executable, "-m", "app.cli", "serve", "--host", HOST, "--port", str(port)]
    server = ServerProcess(serve, args.out / "logs" / f"{name}.log", port=port, name=name, env=env)
    try:
        ready_s = server.wait_ready(args.startup_timeout)
        print(f"{name}: ready in {ready_s:.1f} s", flush=True)
        guess = (predicted[name] or predicted["tuned"])["capacity_rps"]
        return {"ready_s": round(ready_s, 1), "command": shlex.join(serve)} | capacity.search(server.url, guess, name)
    finally:
        server.stop()


def run_tuner(args: argparse.Namespace, env: dict[str, str], prefix: list[str]) -> tuple[dict[str, Any], float]:
    argv = [*prefix, sys.executable, "-m", "app.cli", "tune", "--slo-p99-ms", f"{args.slo_p99_ms:g}"]
    argv += ["--model", args.model, "--out", str(args.out / "tuned.env"), "--json", str(args.out / "tune.json")]
    argv += ["--max-bucket", str(args.max_bucket), "--runs", str(args.runs)]
    argv += ["--startup-timeout", f"{args.startup_timeout:g}"]
    print(f"tuner: {shlex.join(argv)}", flush=True)
    started = time.monotonic()
    done = subprocess.run(argv, env={**os.environ, **env}, timeout=2 * args.startup_timeout + 300, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the tuner failed with exit code {done.returncode}")
    return json.loads((args.out / "tune.json").read_text()), time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    started_at, t0 = datetime.now(UTC).isoformat(timespec="seconds"), time.monotonic()
    info = machine_info()
    pin = plan_pinning("auto", "auto", args.no_pin)
    server_prefix = ["taskset", "-c", core_list(pin["server_cores"])] if pin["server_cores"] else []
    pin_generator(pin)  # inherited by the generator's processes
    loadgen_prefix = ["taskset", "-c", core_list(pin["loadgen_cores"])] if pin["loadgen_cores"] else []
    processes = args.processes or (len(pin["loadgen_cores"]) if pin["loadgen_cores"] else 1)
    env = settings_env(args)
    tuned, tuner_s = run_tuner(args, env, server_prefix)

    shape = read_model_config(args.model_repository / args.model / "model.toml").input_shape
    path = f"/v1/models/{args.model}/predict"
    payloads = PayloadOptions(form="raw", check_labels=False, image_shape=shape, path=path).build()
    capacity = Capacity(args, payloads, processes, loadgen_prefix)
    variants = {"default": {}, "tuned": read_env_file(args.out / "tuned.env")}
    predicted = {"default": tuned["current_settings_predicted"], "tuned": tuned["chosen"]}
    results: dict[str, Any] = {}
    report: dict[str, Any] = {
        "schema": SCHEMA,
        "started_at": started_at,
        "command": shlex.join(["python", "bench/tune_bench.py", *(sys.argv[1:] if argv is None else argv)]),
        "slo_p99_ms": args.slo_p99_ms,
        "model": args.model,
        "rule": "highest Poisson rate whose p99 (from the scheduled send) ≤ SLO with 0 errors",
        "tuned_over_default": None,
        "results": results,
        "tuner": tuned | {"wall_s": round(tuner_s, 1)},
        "payloads": payloads.info | {"path": path},
        "load": {"processes": processes, "warmup_s": args.warmup, "duration_s": args.step_duration},
        "machine": info,
        "pinning": pin,
    }
    for name, extra in variants.items():
        settings = extra or {"defaults": tuned["current_settings"]}
        results[name] = {"settings": settings, "predicted": predicted[name]}
        try:
            results[name] |= measure_server(args, name, {**env, **extra}, capacity, server_prefix, predicted)
        except Exception as error:  # one server failing must not lose the other's figures
            results[name]["error"] = f"{type(error).__name__}: {error}"
            print(f"{name} failed: {results[name]['error']}", flush=True)
        default_rps, tuned_rps = (results.get(n, {}).get("capacity_rps") for n in ("default", "tuned"))
        report["tuned_over_default"] = round(tuned_rps / default_rps, 3) if default_rps and tuned_rps else None
        report["wall_s"] = round(time.monotonic() - t0, 1)
        (args.out / "tune-bench.json").write_text(json.dumps(report, indent=2) + "\n")  # after each server
    for name, r in results.items():
        model = r["predicted"]
        measured = f"measured {r.get('capacity_rps') or 0:>9,.0f} req/s (p99 {r.get('p99_at_capacity_ms') or 0:.2f} ms)"
        prediction = (
            f"predicted {model['capacity_rps']:>9,.0f} req/s (p99 ≤ {model['worst_p99_ms']:.2f} ms)"
            if model
            else "no prediction (its buckets were not all timed: --max-bucket)"
        )
        print(f"{name:<8} {measured}  {prediction}")
    print(f"tuned ÷ default: {report['tuned_over_default']}; wrote {args.out / 'tune-bench.json'} "
          f"in {report['wall_s']:.0f} s")  # fmt: skip
    return 0 if all("error" not in r for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
