"""ResNet-50, one image a request, against the engine's own peak in the same run (issue 26).

Real clients send one image a request. This bench asks how much of the engine's peak (bucket 128,
every slot busy, no HTTP: bench/resnet50_e2e.py's `engine_peak`) the service keeps when every
request carries one 3×224×224 image, with the server on --server-cores and every load generator
on --loadgen-cores:

  raw      our generator (python -m loadtest), POST /v1/models/resnet50/predict, 150 KB uint8 bodies
  hey      hey, the same body and route (a second opinion on the generator)
  v2-http  perf_analyzer, Open Inference Protocol over HTTP, binary UINT8 (what the metadata declares)
  v2-grpc  perf_analyzer, over gRPC, UINT8: its client shares one channel (one TCP connection, so one of
           our workers) among up to 6 of its contexts, as Triton's clients do by default
  v2-grpc-channels  the same with a channel per context (TRITON_CLIENT_GRPC_CHANNEL_MAX_SHARE_COUNT=1),
           so that its connections can spread over every worker
  v2-grpc-stream  the same over ModelStreamInfer (--streaming, asynchronous): a stream a context, its
           requests one after another on it, not a gRPC call each
  jpeg     our generator, multipart uploads of photo-like JPEGs (~500×375), --form photo
  jpeg-body  the same photos, each the whole body (Content-Type image/jpeg), --form jpeg
  gen-v2-http, gen-v2-grpc, gen-v2-grpc-stream  our generator over the Open Inference Protocol, UINT8
           (--form v2): binary tensors over HTTP, ModelInfer calls, ModelStreamInfer streams (a
           channel, so a connection, per request in flight)
  gen-v2-http-twins  gen-v2-http split between two models of one server, the model and its twin (a copy
           under another name, served beside it wherever this kind is asked): two generators at once, half
           the requests in flight each, their images a second summed; several models through one front door

against each of --designs: engine-process (--workers HTTP workers, one engine process), per-process (an
engine a worker), front-door (one process, the front door's --workers C threads: raw, hey, v2-http,
gen-v2-http, gen-v2-http-twins and jpeg-body go to its port, POST /predict and the v2 infer; v2-grpc,
v2-grpc-channels and gen-v2-grpc to its gRPC port, ModelInfer; the streaming kinds to the service's own gRPC
port).

each at every --concurrencies, then open loop at 70 % of each generator kind's best figure for its p99 (raw,
jpeg, jpeg-body, gen-v2-http, gen-v2-grpc). Beside every point: the rows per batch and queue wait the server's own
histograms saw.

    PYTHONPATH=. python3 bench/one_image.py --out $OUT/one-image --designs engine-process,per-process

Writes <out>/one-image.json (every figure and command) as it goes, so a cut run keeps what it did.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from bench import stage_trace
from bench.harness.machine import machine_info
from bench.harness.process_cpu import TreeCpu, role, tree
from bench.harness.server_histograms import scrape, step_view
from bench.resnet50_e2e import EXAMPLE, engine_peak
from loadtest.cli_run import load_summary
from loadtest.hey import hey_command, resolve_hey, run_hey
from loadtest.server_process import free_ports, running, service_env

ROOT = Path(__file__).resolve().parents[1]
ASYNC_ABOVE = 64  # perf_analyzer's synchronous mode up to this many requests in flight
SHARE_COUNT = "TRITON_CLIENT_GRPC_CHANNEL_MAX_SHARE_COUNT"  # contexts a gRPC channel serves (Triton's client: 6)
# Each perf_analyzer kind: its protocol, the share count it sets (None: the client's default), and
# whether it streams (ModelStreamInfer).
PERF_ANALYZER_KINDS = {
    "v2-http": ("http", None, False),
    "v2-grpc": ("grpc", None, False),
    "v2-grpc-channels": ("grpc", 1, False),
    "v2-grpc-stream": ("grpc", 1, True),
}
GENERATOR_FORMS = {"raw": "raw", "jpeg": "photo", "jpeg-body": "jpeg"}  # our generator's kinds: its --form
GENERATOR_V2 = {"gen-v2-http": "lean", "gen-v2-grpc": "grpc", "gen-v2-grpc-stream": "grpc-stream"}  # its --client
TWINS = "gen-v2-http-twins"  # gen-v2-http over the model and its twin at once
KINDS = (*GENERATOR_FORMS, *GENERATOR_V2, TWINS, "hey", *PERF_ANALYZER_KINDS)
DOOR_KINDS = ("raw", "hey", "v2-http", "gen-v2-http", TWINS, "jpeg-body")  # the front-door design's kinds to its port
DOOR_GRPC_KINDS = ("v2-grpc", "v2-grpc-channels", "gen-v2-grpc")  # and to its gRPC port (no streams there)
DOOR_ROUTE = "/predict"  # the door's one route for pixels and uploads (the default model's)


def taskset(cores: str | None, argv: list[str]) -> list[str]:
    return ["taskset", "-c", cores, *argv] if cores and shutil.which("taskset") else argv


def perf_analyzer(binary: str, model: str, protocol: str, address: str, concurrency: int, seconds: float,
                  work: Path, cores: str | None, shape: str = "3,224,224",
                  share_count: int | None = None, streaming: bool = False) -> dict[str, Any]:  # fmt: skip
    """perf_analyzer at one concurrency, one image a request, UINT8 as the model's metadata declares.
    Windows within 100 % of each other count as stable: at 60 % it found none in 72 s at 256 (run 19b).
    Past ASYNC_ABOVE requests in flight, its asynchronous mode (16 threads, each with many requests
    out): synchronously, a thread a request, it ended without a figure at 256 (runs 20a, 22a). Over
    HTTP at 256 the asynchronous mode was killed (rc −9) after ~70 s, three times: perf_analyzer's
    memory is known to grow through a session at high rates until the kernel kills it
    (triton-inference-server/perf_analyzer#84), so each point records the largest resident size of
    this process's finished children, perf_analyzer's among them (a running maximum: a point after a
    larger one repeats its figure)."""
    out = work / f"pa-{protocol}{share_count or ''}{'-stream' if streaming else ''}-{concurrency}.csv"
    # The share count is set (or left at the client's default) on the command line, so the record says it.
    env = {k: v for k, v in os.environ.items() if k != SHARE_COUNT}
    share = ["env", f"{SHARE_COUNT}={share_count}"] if share_count is not None else []
    mode = ["--async", "--max-threads", "16"] if concurrency > ASYNC_ABOVE or streaming else []
    mode += ["--streaming"] if streaming else []  # streams are answered asynchronously whatever the concurrency
    argv = share + taskset(cores, [
        binary, "-m", model, "-u", address, "-i", protocol, "-b", "1", "--shape", f"input:{shape}",
        "--concurrency-range", f"{concurrency}:{concurrency}", "--measurement-interval", str(int(seconds * 1000)),
        "--stability-percentage", "100", "--max-trials", "4", "-f", str(out), *mode,
    ])  # fmt: skip
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60 + 6 * seconds, env=env)
    except (OSError, subprocess.TimeoutExpired) as error:
        return {"error": f"{type(error).__name__}: {error}", "command": shlex.join(argv)}
    # Linux: kB. The largest of every child waited for so far: an rc −9 beside tens of GB is the kernel's OOM kill.
    children_max_rss_mb = round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)
    if done.returncode != 0 or not out.exists():
        # rc too: in run 22a it ended (rc unrecorded) after printing its settings, with no error of its own
        return {"error": (done.stdout + done.stderr)[-1500:], "rc": done.returncode, "command": shlex.join(argv),
                "children_max_rss_mb": children_max_rss_mb}  # fmt: skip
    (row,) = list(csv.DictReader(out.open()))
    return {
        "images_per_s": float(row["Inferences/Second"]),
        "latency_ms": {q: int(row[f"{q} latency"]) / 1000 for q in ("p50", "p90", "p99")},
        "command": shlex.join(argv),
        "children_max_rss_mb": children_max_rss_mb,
    }


def file_safe(name: str) -> str:
    """A design's name (front-door+mb32) as a file's: the device tool brings back no file with a + in its name."""
    return name.replace("+", "_")


def line(result: dict[str, Any]) -> str:
    """One point as the progress line prints it."""
    server = result.get("server", {})
    rows = server.get("batch_rows", {}).get("mean")
    p99 = result.get("latency_ms", {}).get("p99")
    # Mean loop lags: the HTTP workers' and the engine process's (a loop that is late delays the batches).
    lags = "/".join(str(server.get(f"loop_lag_ms_{p}", {}).get("mean")) for p in ("worker", "engines"))
    text = f"{result.get('images_per_s')} img/s, {result.get('ratio_to_engine_peak')} of peak, {rows} rows a batch"
    text += f", p99 {p99} ms, loop lag workers/engines {lags} ms"
    # Where a request's time in the server went, means in ms: the worker's whole (handler), its wait to be
    # sent and its frame's round trip to the engine process; in there the queue and the batch's launch to
    # answers (device time beside it). Not additive: a frame's figures are its oldest request's.
    mean = {k: server.get(k, {}).get("mean") for k in ("handler_ms", "engine_link_ms_outbox",
            "engine_link_ms_round_trip", "queue_wait_ms", "batch_wall_ms", "batch_compute_ms")}  # fmt: skip
    text += (f"; ms: handler {mean['handler_ms']}, outbox {mean['engine_link_ms_outbox']}, round trip "
             f"{mean['engine_link_ms_round_trip']} (queued {mean['queue_wait_ms']}, batch {mean['batch_wall_ms']}, "
             f"device {mean['batch_compute_ms']})")  # fmt: skip
    if (server.get("jpeg_batch_ms") or {}).get("count"):  # the GPU decoder's: the wait for a launch, a batch by stage
        stages = ", ".join(f"{stage} {server.get(f'jpeg_stage_ms_{stage}', {}).get('mean')}"
                           for stage in ("state_wait", "decode", "prepare", "device", "hand_back"))  # fmt: skip
        text += (f"; jpeg ms: wait {server.get('jpeg_wait_ms', {}).get('mean')}, batch "
                 f"{server['jpeg_batch_ms'].get('mean')} ({stages})")  # fmt: skip
    if tail := result.get("tail_over_time"):  # 0.1 for a tail spread over the run, near 1 for a stall
        text += f"; slowest 1 % in the busiest tenth of the run: {tail['slowest_1pct_in_busiest_tenth']}"
    text += f" VOID ({result['void']['images_per_s']} img/s): {result['void']['why']}" if "void" in result else ""
    return text + (f" ERROR {str(result['error'])[:300]}" if "error" in result else "")


def under_load(url: str, *, requests: int = 100, poll_s: float = 0.25, timeout_s: float = 30.0) -> bool:
    """Whether the server at `url` answered `requests` more within one poll (its own handler histogram, every
    protocol), waited for at most `timeout_s`: the point's load is flowing, its generator's start-up and warm-up
    under way or over."""
    latest, last = time.monotonic() + timeout_s, None
    while time.monotonic() < latest:
        snapshot = scrape(url) or {}
        count = snapshot.get("cgserve_request_duration_seconds", {}).get("count", 0.0)
        if last is not None and count - last >= requests:
            return True
        last = count
        time.sleep(poll_s)
    return False


def observed(server: Any, load: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """A load's result with the server's side of it: each process's cores busy and the step of its own
    histograms over the load (queue wait, batch rows, the engine link's and the JPEG decoder's stages)."""
    before = scrape(server.url)
    cpu = TreeCpu(server.proc.pid)
    result = load()
    result["server_cpu"] = cpu.stop()
    after = scrape(server.url)
    if before is not None and after is not None:
        result["server"] = step_view(before, after)
    return result


class OneImage:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args, self.work = args, work
        self.body = work / "image.raw"
        shape = (1, *(int(n) for n in args.image_shape.split(",")))  # one image, (1, C, H, W) uint8
        self.body.write_bytes(np.random.default_rng(0).integers(0, 256, shape, dtype=np.uint8).tobytes())
        self.hey = resolve_hey(args.hey)
        self.record: dict[str, Any] = {"command": shlex.join(["python3", *sys.argv]), "machine": machine_info(),
                                       "designs": {}, "notes": []}  # fmt: skip
        self.model = args.model_folder.name
        self.twin = f"{self.model}-twin"  # served beside it where gen-v2-http-twins is asked
        self.route = f"/v1/models/{self.model}/predict"  # raw and hey's, but at the front door (DOOR_ROUTE)

    def save(self) -> None:
        (self.args.out / "one-image.json").write_text(json.dumps(self.record, indent=2) + "\n")

    def generator(self, url: str, name: str, *load: str, path: str) -> dict[str, Any]:
        a = self.args
        args = ["--warmup", "1", "--duration", str(a.seconds), "--path", path, "--no-check-labels",
                "--image-shape", a.image_shape, *load]  # fmt: skip
        return load_summary(url, self.work / f"{name}.json", *args, cores=a.loadgen_cores, timeout_s=120)

    def generator_load(self, kind: str, route: str) -> tuple[tuple[str, ...], str]:
        """Our generator's options for `kind` (an HTTP one: GENERATOR_FORMS or gen-v2-http) and its path."""
        if kind in GENERATOR_V2:
            return ("--form", "v2", "--client", GENERATOR_V2[kind]), f"/v2/models/{self.model}/infer"
        return ("--form", GENERATOR_FORMS[kind]), route

    def point(self, url: str, route: str, kind: str, concurrency: int, ports: dict[str, int]) -> dict[str, Any]:
        """One closed-loop point of `kind` at `url` (raw's and hey's path: `route`)."""
        a = self.args
        processes = str(min(a.processes, concurrency))
        if kind == TWINS:
            return self.twins(url, concurrency)
        if kind in GENERATOR_FORMS or kind in GENERATOR_V2:
            load, path = self.generator_load(kind, route)
            target = f"grpc://127.0.0.1:{ports['grpc']}" if kind in ("gen-v2-grpc", "gen-v2-grpc-stream") else url
            return self.generator(target, f"{kind}-{concurrency}", *load, "--concurrency", str(concurrency),
                                  "--processes", processes, path=path)  # fmt: skip
        if kind == "hey":
            if self.hey is None:
                return {"error": f"no hey at {a.hey}"}
            argv = hey_command(self.hey, url + route, self.body, content_type="application/octet-stream",
                               concurrency=concurrency, duration_s=a.seconds)  # fmt: skip
            result = run_hey(taskset(a.loadgen_cores, argv), timeout_s=60 + 2 * a.seconds)
            result["images_per_s"] = result.pop("requests_per_s", None)
            return result
        protocol, share_count, streaming = PERF_ANALYZER_KINDS[kind]
        address = f"127.0.0.1:{ports[protocol]}"
        window_s = a.pa_seconds or a.seconds
        return perf_analyzer(a.perf_analyzer, self.model, protocol, address, concurrency, window_s, self.work,
                             a.loadgen_cores, a.image_shape, share_count=share_count,
                             streaming=streaming)  # fmt: skip

    def twins(self, url: str, concurrency: int) -> dict[str, Any]:
        """gen-v2-http against the model and its twin at once, half of `concurrency` (and of the generator's
        processes) each: their images a second summed, and each one's figures."""
        half, processes = max(1, concurrency // 2), str(max(1, min(self.args.processes, concurrency) // 2))
        each: dict[str, dict[str, Any]] = {}

        def run(model: str) -> None:
            each[model] = self.generator(url, f"{TWINS}-{model}-{concurrency}", "--form", "v2", "--client", "lean",
                                         "--concurrency", str(half), "--processes", processes,
                                         path=f"/v2/models/{model}/infer")  # fmt: skip

        threads = [threading.Thread(target=run, args=(model,)) for model in (self.model, self.twin)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        errors = [f"{model}: {result['error']}" for model, result in each.items() if "error" in result]
        if errors:
            return {"error": "; ".join(errors), "each": each}
        p99 = max(result["latency_ms"]["p99"] for result in each.values())
        return {"images_per_s": sum(result["images_per_s"] for result in each.values()), "latency_ms": {"p99": p99},
                "each": each}  # fmt: skip

    def profile(self, server: Any, tag: str) -> tuple[threading.Thread, list[subprocess.Popen[str]], Path]:
        """py-spy on the server and its children (the workers, the engine process), for 3 s once the point's
        load reaches the server (runs 39c and 40c started 1.5 s into the point and caught the processes before the
        generator's requests did: every thread at rest): where every running thread was, without pausing it
        (--nonblocking). Not --gil:
        on the H200's Python 3.12 it kept 15 samples of 9 processes in 3 s (run 19). Non-blocking over
        nine processes kept 55 samples in 3 s and none of the engine process (run 21a): with
        --profile-engine, the engine process alone, native frames too, pausing it for each sample
        (py-spy's native unwinding needs the process stopped): its figures fall while it is watched,
        and it kept 12 samples in 3 s (run 21d). So --profile-engine watches the engine process alone without
        pausing it, every thread apart and idle ones too (--threads --idle: how much of the time its event
        loop's thread has work), Python frames only; --profile-native adds the native frames and the pauses."""
        raw, pid = self.args.out / f"profile-{tag}.txt", server.proc.pid
        target, rate = f"--pid {pid} --subprocesses --nonblocking", 250
        # The process holding the engines: the engine process, or the server itself where it has none (front-door).
        holders = [p for p in tree(pid) if role(p, pid) == "engine-process"] or [pid]
        engine = holders[:1] if self.args.profile_engine else []
        if engine and self.args.profile_native:
            target, rate = f"--pid {engine[0]} --native", 100
        elif engine:
            target, rate = f"--pid {engine[0]} --nonblocking --threads --idle", 250
        spy = f"exec {self.args.py_spy} record {target} --duration 3 --rate {rate} --format raw --output {raw}"
        started: list[subprocess.Popen[str]] = []

        def when_loaded() -> None:
            if under_load(server.url):
                started.append(subprocess.Popen(["sh", "-c", spy], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                text=True))  # fmt: skip

        waiter = threading.Thread(target=when_loaded, daemon=True)
        waiter.start()
        return waiter, started, raw

    @staticmethod
    def profiled(spy: tuple[threading.Thread, list[subprocess.Popen[str]], Path]) -> dict[str, Any]:
        waiter, started, raw = spy
        waiter.join()
        if not started:
            return {"raw": None, "error": "the load never reached the server: no profile"}
        output, _ = started[0].communicate(timeout=30)
        return {"raw": raw.name, "rc": started[0].returncode, "output_tail": output[-500:]}

    def design(self, design: str, peak: float, variant: str = "", settings: dict[str, str] | None = None) -> None:
        """Every kind and concurrency against one server of `design`; a variant: `settings` over the
        defaults (CGSERVE_… variables), its own kinds (--variant-kinds), the same run's peak."""
        a = self.args
        port, grpc_port, door_port, door_grpc_port = free_ports(4)
        repository = self.work / "repository"
        # The front door: one process holding the engines, its --workers C threads on a port of their own.
        door = {}
        if design == "front-door":
            door = {"front_door_port": door_port, "front_door_grpc_port": door_grpc_port}
            door["front_door_threads"] = a.workers
        # Two models in the repository (the twin): the default named, or POST /predict would have none.
        default_model = {"default_model": self.model} if (repository / self.twin).is_dir() else {}
        env = service_env(port, device=a.device, model_repository=repository, buckets=a.buckets, **default_model,
                          workers=1 if door else a.workers, grpc_port=grpc_port, max_body_bytes=64 * 2**20,
                          max_inflight_bytes=1024 * 2**20, engine_process=str(design == "engine-process").lower(),
                          **door)  # fmt: skip
        env |= settings or {}
        points: dict[str, Any] = {}
        name = f"{design}+{variant}" if variant else design
        server_module = "app.cli"
        if a.stage_trace and design != "front-door":  # its patches reach the server process alone, not its children
            self.record["notes"].append(f"{name}: no stage trace (the front door's design only: one process)")
        elif a.stage_trace:  # the same server, its stages on a timeline (bench/stage_trace.py)
            server_module, env["STAGE_TRACE"] = "bench.stage_trace", str(a.out / f"stage-trace-{file_safe(name)}.jsonl")
        serve = taskset(a.server_cores, [sys.executable, "-m", server_module, "serve"])  # taskset execs: same pid
        self.record["designs"][name] = {"env": env, "points": points}
        log = self.work / f"server-{name}.log"
        kinds = a.variant_kinds if variant else a.kinds
        with running(serve, log, port=port, env=env, cwd=ROOT, ready_timeout_s=480) as server:
            for kind in kinds.split(","):
                for concurrency in (int(c) for c in a.concurrencies.split(",")):
                    if time.monotonic() > self.deadline:
                        self.record["notes"].append(f"{name} {kind} c{concurrency} skipped: past the budget")
                        continue
                    tag = f"{name}-{kind}-c{concurrency}"
                    profiled = kind in a.profile.split(",") and not variant
                    spy = self.profile(server, tag) if profiled else None
                    http, route = self.http_target(kind, port, door.get("front_door_port"))
                    to_door = door and kind in DOOR_GRPC_KINDS
                    ports = {"http": http, "grpc": door_grpc_port if to_door else grpc_port}
                    url = f"http://127.0.0.1:{http}"
                    result = observed(server, partial(self.point, url, route, kind, concurrency, ports))
                    if spy is not None:
                        result["profile"] = self.profiled(spy)
                    if spy is not None and a.profile_engine and a.profile_native:  # a fraction of the point's rate
                        # Kept under `void`, out of images_per_s, so that no open loop takes its rate from it.
                        result["void"] = {"why": "py-spy --native paused the process for every sample: not a figure",
                                          "images_per_s": result.pop("images_per_s", None)}  # fmt: skip
                    figure = result.get("images_per_s")
                    result["ratio_to_engine_peak"] = round(figure / peak, 3) if figure else None
                    points[f"{kind}-c{concurrency}"] = result
                    print(f"{name} {kind} c{concurrency}: {line(result)}", flush=True)
                    busy = result["server_cpu"]
                    print(f"  cores busy, mean: {busy['cores_busy']}; busiest 2 s: {busy['cores_busy_peak_2s']}")
                    self.save()
            for kind in kinds.split(",") if a.p99_fraction else ():
                http, route = self.http_target(kind, port, door.get("front_door_port"))
                grpc_target = door_grpc_port if door and kind in DOOR_GRPC_KINDS else grpc_port
                self.open_loop(server, f"http://127.0.0.1:{http}", route, name, kind, points, grpc_target)
            self.record["designs"][name]["log_tail"] = server.log_tail()[-3000:]
        self.save()

    def http_target(self, kind: str, port: int, door_port: int | None) -> tuple[int, str]:
        """The HTTP port `kind` is sent to and raw's and hey's path there: the front door's where it serves
        the kind (DOOR_KINDS), else the service's own."""
        if door_port is not None and kind in DOOR_KINDS:
            return door_port, DOOR_ROUTE
        return port, self.route

    def open_loop(self, server: Any, url: str, route: str, design: str, kind: str, points: dict[str, Any],
                  grpc_port: int) -> None:  # fmt: skip
        """Issue 26's p99 at --p99-fraction of a generator kind's best closed-loop figure: Poisson arrivals at
        that rate, so that requests do not wait for one another's answers to be sent."""
        a = self.args
        if kind not in GENERATOR_FORMS and kind not in ("gen-v2-http", "gen-v2-grpc"):
            return
        best = max((p.get("images_per_s") or 0 for k, p in points.items() if k.startswith(f"{kind}-c")), default=0)
        if not best or time.monotonic() > self.deadline:
            why = "past the budget" if best else "no closed-loop figure to take its rate from"
            self.record["notes"].append(f"{design} {kind} open loop not run: {why}")
            return
        rate = round(best * a.p99_fraction)
        form, path = self.generator_load(kind, route)
        load = (*form, "--rate", str(rate), "--processes", str(a.processes))
        if kind == "gen-v2-grpc":  # the gRPC port its closed loop went to
            url = f"grpc://127.0.0.1:{grpc_port}"
        for repeat in range(a.open_loop_repeats):  # a tail moves from run to run: how far, in one server
            if repeat and time.monotonic() > self.deadline:
                self.record["notes"].append(f"{design} {kind} open loop r{repeat + 1} on: past the budget")
                break
            again = f"-r{repeat + 1}" if repeat else ""
            result = observed(server, partial(self.generator, url, f"{kind}-open-loop{again}", *load, path=path))
            result["rate"] = rate
            points[f"{kind}-open-{a.p99_fraction:g}{again}"] = result
            if a.stage_trace:
                self.stalls(design, f"{kind}-open{again}", result)
            print(f"{design} {kind} open loop{again} at {rate} req/s: {line(result)}", flush=True)
            self.save()

    def stalls(self, design: str, tag: str, result: dict[str, Any]) -> None:
        """The server's stages around the three 0.1 s bins that held most of a load's slowest 1 %, written beside
        its stage trace."""
        tail, start = result.get("tail_over_time"), result.get("window_start_monotonic_s")
        if not tail or start is None:
            return
        worst = sorted(range(len(tail["slowest_1pct"])), key=lambda b: -tail["slowest_1pct"][b])[:3]
        moments = [start + (b + 0.5) * tail["bin_s"] for b in sorted(worst) if tail["slowest_1pct"][b]]
        time.sleep(2 * stage_trace.WRITE_EVERY_S)  # its writer's last events on file
        text = stage_trace.show(self.args.out / f"stage-trace-{file_safe(design)}.jsonl", moments, around_s=0.3)
        (self.args.out / f"stalls-{file_safe(design)}-{tag}.txt").write_text(text + "\n")

    def run(self) -> None:
        a = self.args
        repository = self.work / "repository"
        shutil.copytree(a.model_folder, repository / self.model)
        self.deadline = time.monotonic() + a.budget_s
        peak = engine_peak(repository, a.buckets, a.peak_seconds, device=a.device)
        self.record["engine_peak"] = peak
        print(f"engine peak: {peak['images_per_s']} img/s at bucket {peak['bucket']}", flush=True)
        self.save()
        if TWINS in f"{a.kinds},{a.variant_kinds}":  # every server of the run serves both: the peak is one model's
            shutil.copytree(a.model_folder, repository / self.twin)
            self.record["notes"].append(f"{self.twin}: {self.model} under another name, served beside it")
        for design in a.designs.split(","):
            self.design(design, peak["images_per_s"])
        for entry in filter(None, a.variants.split(";")):  # name=CGSERVE_X=1,CGSERVE_Y=2, on the first design
            variant, _, assignments = entry.partition("=")
            # A value may hold commas (CGSERVE_BUCKETS=1,8): a new pair starts only at ",CGSERVE_".
            settings = dict(pair.split("=", 1) for pair in assignments.replace(",CGSERVE_", "\0CGSERVE_").split("\0"))
            if time.monotonic() > self.deadline:  # said, so that a record without it is not read as a choice
                self.record["notes"].append(f"variant {variant} not run: past the budget")
                self.save()
                continue
            self.design(a.designs.split(",")[0], peak["images_per_s"], variant, settings)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = p.add_argument
    add("--out", type=Path, required=True, help="folder for one-image.json (and profiles)")
    add("--designs", default="engine-process", help="engine-process, per-process, front-door, comma-separated")
    add(
        "--model-folder",
        type=Path,
        default=EXAMPLE,
        help="the model served (default: the resnet50 example)",
    )
    add("--image-shape", default="3,224,224", help="the model's input C,H,W: each request's one image")
    add("--device", default="cuda", help="cpu: a smoke run of the bench itself, not a figure")
    add("--kinds", default="raw,hey,v2-http,v2-grpc,jpeg", help="load kinds, comma-separated (default %(default)s)")
    add("--concurrencies", default="64,256")
    add("--workers", type=int, default=8)
    add("--buckets", default="1,8,32,64,128")
    add("--seconds", type=float, default=4.0, help="measured seconds a point")
    # perf_analyzer keeps about a request's input for every request it sends (runs 26b and 26c: ~120 GB and killed
    # at 1024 in flight, with 4 s windows and 2 s alike): its window on its own, for loads where a shorter one ends
    # it in time. A point's timeout is 60 s + 6 windows.
    add("--pa-seconds", type=float, default=0.0, help="perf_analyzer's window (0: --seconds)")
    add("--peak-seconds", type=float, default=4.0)
    add("--processes", type=int, default=8, help="our generator's processes")
    add("--p99-fraction", type=float, default=0.7, help="open loop at this share of each kind's best (0: none)")
    add("--open-loop-repeats", type=int, default=1, help="that open loop this many times, one after the other")
    add("--server-cores", default="0-7")
    add("--loadgen-cores", default="8-15")
    add("--hey", default=".gpu/bin/hey")
    add("--perf-analyzer", default="/tmp/site/perf_analyzer/bin/perf_analyzer")
    add("--profile", default="", help="kinds whose points py-spy profiles (server and children), e.g. raw")
    add("--profile-engine", action="store_true",
        help="profile the process holding the engines alone (the engine process, or the one process), each thread, "
        "idle too")  # fmt: skip
    add("--profile-native", action="store_true",
        help="with --profile-engine: native frames too (pauses it: the profiled points' figures are void)")  # fmt: skip
    add("--py-spy", default="/tmp/site/bin/py-spy")
    add(
        "--stage-trace",
        action="store_true",
        help="serve through bench/stage_trace.py: a timeline of its stages, and around each open loop's worst bins",
    )
    add(
        "--variants",
        default="",
        help="servers with other settings, 'name=CGSERVE_X=1,CGSERVE_Y=2;name2=…', each "
        "with its own points (open loop included)",
    )
    add("--variant-kinds", default="raw", help="load kinds run against each variant")
    add("--budget-s", type=float, default=400.0, help="start no point after this many seconds")
    args = p.parse_args()
    for option in ("kinds", "variant_kinds"):
        unknown = sorted(set(getattr(args, option).split(",")) - set(KINDS))
        if unknown:  # refused here, not as a KeyError after minutes of start-up
            p.error(f"--{option.replace('_', '-')}: unknown kinds {unknown}; known: {', '.join(KINDS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    OneImage(args, Path(tempfile.mkdtemp(prefix="one-image-"))).run()


if __name__ == "__main__":
    main()
