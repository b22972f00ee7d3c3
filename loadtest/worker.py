"""One load-generator process: a driver (lean by default, httpx to check it) sending either
open-loop Poisson arrivals or a closed loop of fixed concurrency, and every request's timestamps.

Drivers: loadtest/lean_driver.py (a bare HTTP/1.1 asyncio Protocol client, `--client lean`) and
loadtest/httpx_driver.py (`--client httpx`); both lend `connections` keep-alive connections last
in, first out, and report the same failure kinds. The v2 form also goes over gRPC
(loadtest/grpc_driver.py, `--client grpc` or `grpc-stream`).

Open loop: every send time is drawn before the run; a request's latency runs from its
scheduled send time, so a slow server (or a busy generator, or a full connection pool) cannot
hide its queueing by delaying the next send (no coordinated omission). Timers fire to the
millisecond, so the dispatcher wakes up to EARLY_S ahead and latency is counted from
min(scheduled, actual send): a request sent late is still charged from its schedule.

Closed loop: `concurrency` coroutines each send, wait for the answer, and send again.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from loadtest.connections import Driver, TransportFailure
from loadtest.httpx_driver import HttpxDriver
from loadtest.lean_driver import LeanDriver
from loadtest.payloads import Payloads
from loadtest.spec import CLIENTS, GRPC_CLIENTS
from loadtest.stats import WorkerResult, poisson_schedule, window_result

try:
    import uvloop
except ImportError:  # pragma: no cover - uvloop is a dependency off Windows
    uvloop = None

# uvloop rounds timers to the nearest ms, asyncio's epoll loop rounds up: wake this early.
EARLY_S = 0.0005 if uvloop is not None else 0.001
PROGRESS_SLOTS = 4  # per process in the shared progress array: sent, done, errors, ready
clock = time.perf_counter  # CLOCK_MONOTONIC on Linux


@dataclass(frozen=True)
class WorkerSpec:
    index: int
    base_url: str
    payloads: Payloads
    mode: str  # "open" or "closed"
    rate: float  # this process's Poisson rate, req/s (open loop)
    concurrency: int  # this process's requests in flight (closed loop)
    connections: int  # connection limit of this process
    warmup_s: float
    duration_s: float
    timeout_s: float
    seed: int
    client: str = "lean"  # one of CLIENTS


def check_answer(
    status: int, body: bytes, expected: tuple[int, ...] | None, n_images: int
) -> tuple[str | None, str, dict[str, Any] | None]:
    """(error kind or None, message, parsed answer) for one HTTP answer.

    Kinds: http_<status>[:<error code>], bad_response, wrong_label.
    """
    if status != 200:
        kind, message = f"http_{status}", body[:200].decode(errors="replace")
        try:
            error = orjson.loads(body)["error"]
            kind, message = f"http_{status}:{error['code']}", str(error.get("message", ""))
        except (orjson.JSONDecodeError, KeyError, TypeError):
            pass
        return kind, message, None
    try:
        answer = orjson.loads(body)
        predictions = answer["predictions"]
        labels = [p["label"] for p in predictions]
        n_scores = {len(p["scores"]) for p in predictions}
    except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
        return "bad_response", f"{type(exc).__name__}: {body[:200]!r}", None
    if len(labels) != n_images or n_scores != {10}:
        return "bad_response", f"{len(labels)} predictions (scores {n_scores}) for {n_images} images", None
    if expected is not None and tuple(labels) != expected:
        return "wrong_label", f"labels {labels}, the eager model says {list(expected)}", answer
    return None, "", answer


def check_v2_answer(
    status: int, body: bytes, expected: tuple[int, ...] | None, n_images: int
) -> tuple[str | None, str, dict[str, Any] | None]:
    """check_answer for the Open Inference Protocol over HTTP: the `probabilities` output, asked for in JSON;
    an error is {"error": "…"}."""
    if status != 200:
        try:
            message = str(orjson.loads(body)["error"])
        except (orjson.JSONDecodeError, KeyError, TypeError):
            message = body[:200].decode(errors="replace")
        return f"http_{status}", message, None
    try:
        answer = orjson.loads(body)
        (output,) = (o for o in answer["outputs"] if o["name"] == "probabilities")
        probabilities = np.asarray(output["data"], dtype=np.float32).reshape(output["shape"])
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        return "bad_response", f"{type(exc).__name__}: {body[:200]!r}", None
    return check_probabilities(probabilities, expected, n_images, {"model": answer.get("model_name")})


def check_probabilities(
    probabilities: np.ndarray, expected: tuple[int, ...] | None, n_images: int, answer: dict[str, Any]
) -> tuple[str | None, str, dict[str, Any] | None]:
    """(k, 10) probabilities of a v2 answer (HTTP or gRPC) against the eager model's labels."""
    if probabilities.shape != (n_images, 10):
        return "bad_response", f"probabilities of shape {probabilities.shape} for {n_images} images", None
    labels = tuple(int(v) for v in probabilities.argmax(axis=1))
    if expected is not None and labels != expected:
        return "wrong_label", f"labels {list(labels)}, the eager model says {list(expected)}", answer
    return None, "", answer


def check_outputs(
    names: list[str], raw: list[bytes], model: str, expected: tuple[int, ...] | None, n_images: int
) -> tuple[str | None, str, dict[str, Any] | None]:
    """A gRPC answer's outputs (`names`, each one's raw little-endian bytes in `raw`): its `probabilities`,
    float32 (k, 10), against the labels."""
    if "probabilities" not in names or len(raw) != len(names):
        return "bad_response", f"outputs {names} with {len(raw)} raw contents", None
    probabilities = np.frombuffer(raw[names.index("probabilities")], dtype="<f4")
    if probabilities.size != n_images * 10:
        return "bad_response", f"{probabilities.size} probabilities for {n_images} images", None
    return check_probabilities(probabilities.reshape(n_images, 10), expected, n_images, {"model": model})


Check = Callable[[int, bytes, "tuple[int, ...] | None", int], "tuple[str | None, str, dict[str, Any] | None]"]


def open_driver(spec: WorkerSpec) -> tuple[Driver, Check]:
    """The driver `spec.client` names, for this process's connections, and the check of its answers."""
    if spec.client not in CLIENTS:
        raise ValueError(f"client must be one of {CLIENTS}, got {spec.client!r}")
    options = {"connections": spec.connections, "timeout_s": spec.timeout_s}
    if spec.client in GRPC_CLIENTS:  # grpcio and the protobuf modules load only here
        from loadtest.grpc_driver import GrpcDriver, check_grpc_answer, check_grpc_stream_answer

        stream = spec.client == "grpc-stream"
        driver = GrpcDriver(spec.base_url, spec.payloads, stream=stream, **options)
        return driver, check_grpc_stream_answer if stream else check_grpc_answer
    driver = LeanDriver if spec.client == "lean" else HttpxDriver
    check = check_v2_answer if spec.payloads.form == "v2" else check_answer
    return driver(spec.base_url, spec.payloads, **options), check


class _Run:
    """The state of one process's run: its connections, the payload cursor and the raw records."""

    def __init__(self, spec: WorkerSpec, t0: float, progress: Any) -> None:
        self.spec, self.t0, self.progress = spec, t0, progress
        self.slot = spec.index * PROGRESS_SLOTS
        p = spec.payloads
        self.driver, self.check = open_driver(spec)  # each request's bytes built once, before the run
        # Processes start at different images, so together they cycle through all of them.
        self.cursor = itertools.count(spec.index * 7919 % len(p.bodies))
        # One row per request: scheduled, sent, done (perf_counter s), error kind (None = ok).
        self.rows: list[tuple[float, float, float, str | None]] = []
        self.examples: dict[str, str] = {}
        self.server: dict[str, str] = {}
        # The first exception a request task raised that is not a counted failure (a driver bug).
        self.crash: BaseException | None = None

    async def request(self, t_sched: float) -> None:
        p = self.spec.payloads
        j = next(self.cursor) % len(p.bodies)
        expected = p.expected[j] if p.expected is not None else None
        self.progress[self.slot] += 1
        t_send = clock()
        kind, message = None, ""
        try:
            status, body = await self.driver.send(j)
            kind, message, answer = self.check(status, body, expected, p.images_per_request)
            if answer is not None and not self.server:
                self.server = {k: str(answer.get(k)) for k in ("model", "engine")}
        except TransportFailure as failure:
            kind, message = failure.kind, failure.message
        except asyncio.CancelledError:
            kind, message = "unfinished", "still waiting when the run ended"
            raise
        finally:
            self.rows.append((t_sched, t_send, clock(), kind))
            self.progress[self.slot + 1] += 1
            if kind is not None:
                self.progress[self.slot + 2] += 1
                self.examples.setdefault(kind, message)

    async def open_loop(self) -> None:
        spec = self.spec
        rng = np.random.default_rng([spec.seed, spec.index])
        schedule = self.t0 + poisson_schedule(spec.rate, spec.warmup_s + spec.duration_s, rng)
        tasks: set[asyncio.Task[None]] = set()
        for t_sched in schedule.tolist():
            delay = t_sched - clock() - EARLY_S
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.create_task(self.request(t_sched))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            task.add_done_callback(self._keep_crash)  # it leaves `tasks` when done: _drain won't see it
        await self._drain(tasks)

    def _keep_crash(self, task: asyncio.Task[None]) -> None:
        if self.crash is None and not task.cancelled():
            self.crash = task.exception()

    async def closed_loop(self) -> None:
        t_end = self.t0 + self.spec.warmup_s + self.spec.duration_s

        async def client_loop() -> None:
            while (t := clock()) < t_end:
                await self.request(t)

        tasks = {asyncio.create_task(client_loop()) for _ in range(self.spec.concurrency)}
        await self._drain(tasks, t_end)

    async def _drain(self, tasks: set[asyncio.Task[None]], t_end: float | None = None) -> None:
        """Wait for the last answers (bounded: the run's end `t_end`, if it is still to come, then the request
        timeout, plus slack), cancel the rest."""
        if tasks:
            last = self.spec.timeout_s * 2 + 1 + max(0.0, (t_end or 0.0) - clock())
            done, pending = await asyncio.wait(set(tasks), timeout=last)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            for task in done:  # a bug in a driver must fail the run, not quietly lose a client
                self._keep_crash(task)
        if self.crash is not None:  # also one from a task that ended (and left `tasks`) earlier
            raise self.crash

    def result(self) -> WorkerResult:
        w0 = self.t0 + self.spec.warmup_s
        res = window_result(self.rows, w0, w0 + self.spec.duration_s)
        res.error_examples, res.server = self.examples, self.server
        res.connection_waits = self.driver.connection_waits
        res.stale_retries = self.driver.stale_retries
        return res


async def run_worker(spec: WorkerSpec, t0: float, progress: Any) -> WorkerResult:
    """Run one process's share of the load, starting at perf_counter time t0."""
    run = _Run(spec, t0, progress)
    try:
        if (delay := t0 - clock()) > 0:
            await asyncio.sleep(delay)
        cpu0, wall0 = time.process_time(), clock()
        if spec.mode == "open":
            await run.open_loop()
        else:
            await run.closed_loop()
        cpu_s, wall_s = time.process_time() - cpu0, clock() - wall0
    finally:
        await run.driver.aclose()
    result = run.result()
    result.cpu_s, result.wall_s = cpu_s, wall_s
    return result


def worker_main(spec: WorkerSpec, progress: Any, start: Any, start_wall: Any, results: Any) -> None:
    """Process entry: report ready, wait for the common start, run, put (index, result, error)."""
    try:
        gc.freeze()  # the payloads are long-lived: keep them out of every collection
        progress[spec.index * PROGRESS_SLOTS + 3] = 1
        if not start.wait(timeout=300):
            raise TimeoutError("no start signal from the parent within 300 s")
        # perf_counter is per-boot monotonic; translate the parent's wall-clock start into it.
        t0 = clock() + (start_wall.value - time.time())
        runner = uvloop.run if uvloop is not None else asyncio.run
        results.put((spec.index, runner(run_worker(spec, t0, progress)), None))
    except BaseException:
        results.put((spec.index, None, traceback.format_exc()))
