"""One server's figures: start it, find its saturation with closed-loop steps, then its p99 with
open-loop Poisson steps at fractions of that rate, and where asked hey's second opinion.

Same payloads and same generator for every server; the servers run on one set of cores
(taskset), the generator's processes on another.
"""

from __future__ import annotations

import argparse
import os
import shlex
from dataclasses import replace
from typing import Any

import httpx

from loadtest.bench.pinning import core_list
from loadtest.bench.servers import ServerDef, server_argv
from loadtest.hey import hey_command, resolve_hey, run_hey
from loadtest.payloads import PayloadOptions, Payloads
from loadtest.runner import run_load
from loadtest.server_process import ServerProcess, free_port
from loadtest.spec import LoadSpec


class Bench:
    """The run's settings (the CLI's `args`), payloads and pinning, shared by every server."""

    def __init__(
        self,
        args: argparse.Namespace,
        payloads: Payloads,
        options: PayloadOptions,
        pin: dict[str, Any],
        *,
        hey_targets: set[str],
    ) -> None:
        self.args, self.payloads, self.options, self.pin = args, payloads, options, pin
        self.hey_targets = hey_targets  # the servers hey runs against too
        loadgen = pin["loadgen_cores"]
        self.processes = args.processes or (len(loadgen) if loadgen else max(1, (os.cpu_count() or 2) // 2))
        self.loadgen_prefix = ["taskset", "-c", core_list(loadgen)] if loadgen else []
        self.server_prefix = ["taskset", "-c", core_list(pin["server_cores"])] if pin["server_cores"] else []
        self.hey = resolve_hey(args.hey)

    def step(self, name: str, url: str, payloads: Payloads, **load: Any) -> dict[str, Any]:
        """One bounded load run (`concurrency=` or `rate=`); its record, and a line on stdout."""
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
        """Every figure of one server; an `error` in place of the rest where it failed."""
        a = self.args
        port = free_port()
        argv = [*self.server_prefix, *server_argv(template, port)]
        out: dict[str, Any] = {"role": sdef.role, "command": shlex.join(argv), "labels_checked": sdef.check_labels}
        payloads = self.payloads if sdef.check_labels else replace(self.payloads, expected=None)
        print(f"{name}: {out['command']}", flush=True)
        server = ServerProcess(argv, a.out_dir / "logs" / f"{stamp}-{name}.log", port=port, name=name)
        out["log"] = str(server.log_path)
        try:
            out["ready_s"] = round(server.wait_ready(a.startup_timeout), 2)
            card = httpx.get(f"{server.url}/v1/models", timeout=5, trust_env=False)
            if card.status_code == 200:
                out["model_card"] = card.json()
            out |= self.saturation_and_p99(name, server.url, payloads)
            if name in self.hey_targets and self.hey is not None:
                out["hey"] = self.cross_check(self.hey, server.url, out["closed_loop"])
        except Exception as error:  # one server failing must not lose the others' figures
            out["error"] = f"{type(error).__name__}: {error}"
            print(f"  {name} failed: {out['error']}", flush=True)
        finally:
            out["exit_code_before_stop"] = server.proc.poll()  # None: it was still serving
            server.stop()
        return out

    def saturation_and_p99(self, name: str, url: str, payloads: Payloads) -> dict[str, Any]:
        closed = [self.step(name, url, payloads, concurrency=c) for c in self.args.concurrencies]
        best = max([r for r in closed if r["counts"]["errors"] == 0] or closed, key=lambda r: r["throughput_rps"])
        saturation = {
            "throughput_rps": best["throughput_rps"],
            "concurrency": best["concurrency"],
            "p99_ms": best["latency_ms"]["p99"],
            "rule": "highest closed-loop throughput among error-free steps",
        }
        open_loop = []
        for fraction in self.args.load_fractions:
            rate = round(fraction * best["throughput_rps"], 1)
            if rate > 0:
                record = self.step(name, url, payloads, rate=rate)
                open_loop.append(record | {"fraction_of_saturation": fraction})
        return {"closed_loop": closed, "saturation": saturation, "open_loop": open_loop}

    def cross_check(self, hey: str, url: str, closed: list[dict[str, Any]]) -> dict[str, Any]:
        """hey closed loop at the first concurrency, beside this generator's figure for it."""
        c = self.args.hey_concurrency or self.args.concurrencies[0]
        ours = next((r for r in closed if r["concurrency"] == c), None)
        body_path = self.args.out_dir / "logs" / f"hey-body.{self.payloads.form}"
        body_path.write_bytes(self.payloads.bodies[0])
        duration_s, target = self.args.step_duration, url + self.payloads.path
        content_type = self.payloads.content_type
        argv = hey_command(hey, target, body_path, content_type=content_type, concurrency=c, duration_s=duration_s)
        result = run_hey([*self.loadgen_prefix, *argv], timeout_s=duration_s + 60)
        result |= {"concurrency": c, "loadtest_requests_per_s": ours["throughput_rps"] if ours else None}
        if result["requests_per_s"] and ours:
            result["loadtest_over_hey"] = round(ours["throughput_rps"] / result["requests_per_s"], 3)
        print(f"  hey c{c}: {result['requests_per_s']} req/s (ours {result['loadtest_requests_per_s']})", flush=True)
        return result
