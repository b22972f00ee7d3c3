"""Every Prometheus metric the service exports, in one place.

Base units (seconds, rows), histograms rather than summaries so that replicas aggregate,
prefix `cgserve_`. deploy/ (recording rules, alerts, the Grafana dashboard) and the tests
that check them read the names from here.
"""

from __future__ import annotations

import asyncio
import functools
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, generate_latest, multiprocess

from app.ops import metric_buffers
from app.ops.gpu_metrics import GpuCollector
from app.ops.metric_buffers import BufferedHistogram, BufferedSum
from app.ops.process_metrics import WorkerProcesses

# 50 µs … 10 s: a replay of the seed CNN is ~30 µs, an overloaded queue is seconds. Between 25 and 250 ms, where a
# photo's p99 lies (issue 26: ≤ 50 ms at 70 % load), 35, 75 and 150 ms as well: with 50, 100 and 250 alone every
# stage's tail there read as one of three values, and which stage holds a request past 50 ms could not be told.
LATENCY_BUCKETS = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003, 0.005,
    0.0075, 0.01, 0.015, 0.025, 0.035, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
# Powers of two up to 1024 rows: the default buckets are 1…128, requests may carry more.
ROW_BUCKETS = tuple(float(2**i) for i in range(11))

REQUEST_LATENCY = Histogram(
    "cgserve_request_duration_seconds",
    "Inference requests end to end, from the body received to the answer encoded.",
    ["model", "protocol", "format"],
    buckets=LATENCY_BUCKETS,
)
REQUESTS = Counter(
    "cgserve_requests",
    "Inference answers by model, protocol (rest: /predict; v2: the Open Inference Protocol over HTTP; "
    "grpc: over gRPC; door: the front door's port), input format and status (HTTP code, or the gRPC status name). "
    "model is empty for a request that named no served model: a client's name never becomes a label.",
    ["model", "protocol", "format", "code"],
)
QUEUE_WAIT = Histogram(
    "cgserve_queue_wait_seconds",
    "Time a request's rows waited in the batcher's queue before their batch was launched.",
    ["model"],
    buckets=LATENCY_BUCKETS,
)
BATCH_COMPUTE = Histogram(
    "cgserve_batch_compute_seconds",
    "Device time of one batch by bucket: CUDA timing events around the replay on a GPU, "
    "the forward call's wall time on the CPU.",
    ["model", "bucket"],
    buckets=LATENCY_BUCKETS,
)
BATCH_WALL = Histogram(
    "cgserve_batch_wall_seconds",
    "One batch from its launch by the batcher to its answers (or its error) handed back: the wait for the "
    "event loop, staging its rows, waiting on the device for the batch before it, the device's own time "
    "(cgserve_batch_compute_seconds) and the copy back. Not a batch whose device broke.",
    ["model"],
    buckets=LATENCY_BUCKETS,
)
ENGINE_LINK = Histogram(
    "cgserve_engine_link_seconds",
    "A worker's frames to the engine process (CGSERVE_ENGINE_PROCESS=true), by stage. outbox: how long a "
    "frame's oldest request waited in the worker before the frame was written (engine_frames_in_flight "
    "frames were out); round_trip: from the frame written to its answer read (the engine process's queue "
    "wait and batch, its loop, and the socket both ways).",
    ["stage"],
    buckets=LATENCY_BUCKETS,
)
FRONT_DOOR_WAIT = Histogram(
    "cgserve_front_door_wait_seconds",
    "A front-door request's time in the door before Python took its bulk: from its last byte read to the bulk "
    "queued on the batcher (the door waits for the batcher's launch moment while a bulk is out). The rest of its "
    "cgserve_request_duration_seconds is the batcher's queue, its batch and its answer.",
    ["model"],
    buckets=LATENCY_BUCKETS,
)
BATCH_ROWS = Histogram(
    "cgserve_batch_rows",
    "Real (non-padding) rows in one launched batch.",
    ["model"],
    buckets=ROW_BUCKETS,
)
BATCHES = Counter("cgserve_batches", "Batches launched (graph replays) by bucket.", ["model", "bucket"])
PADDING_ROWS = Counter(
    "cgserve_padding_rows",
    "Rows of padding added to reach a captured bucket size, by bucket.",
    ["model", "bucket"],
)
IMAGE_DECODES = Counter(
    "cgserve_image_decodes",
    "Image uploads by decoder: gpu (nvJPEG, batched), cpu (Pillow), cpu_fallback (a JPEG nvJPEG refused).",
    ["decoder"],
)
GPU_JPEG_BATCH_IMAGES = Histogram(
    "cgserve_gpu_jpeg_batch_images",
    "JPEG uploads decoded together in one nvJPEG batch.",
    buckets=ROW_BUCKETS,
)
GPU_JPEG_WAIT = Histogram(
    "cgserve_gpu_jpeg_wait_seconds",
    "From an upload's arrival at the GPU JPEG decoder to the launch of the batch that decodes it.",
    buckets=LATENCY_BUCKETS,
)
GPU_JPEG_BATCH_SECONDS = Histogram(
    "cgserve_gpu_jpeg_batch_seconds",
    "One GPU JPEG batch from its launch to its pixels in host memory: decode, resize, copy out, and any wait "
    "for the other batch being launched (torchvision decodes one batch at a time).",
    buckets=LATENCY_BUCKETS,
)
GPU_JPEG_STAGE = Histogram(
    "cgserve_gpu_jpeg_stage_seconds",
    "One GPU JPEG batch's time by stage, each batch once: state_wait (the direct decoder's wait for a state: a free "
    "one, then its previous batch to finish on the device; 0 with torchvision's), decode (the rest of the decoding "
    "on the launch thread: torchvision's decode_jpeg calls, a wait for its decoder's lock, nvJPEG's host phase, its "
    "device phase and the wait for it; the direct decoder's headers and nvJPEG's call), prepare (the rest of the "
    "launch: stacking, resizing and the copy out queued), device (the launch's return to its resize and copy out "
    "done on the device, and the loop's turn to see it), hand_back (every upload's rows copied out of pinned memory "
    "and answered, on the loop).",
    ["stage"],
    buckets=LATENCY_BUCKETS,
)
# multiprocess_mode says how /metrics merges a gauge across workers (ignored with one process).
# A model's versions each have their batcher and graphs: the gauges those set are per version (a name
# the operator's repository chose, never a client's), and their sums stay the model's.
QUEUE_DEPTH = Gauge(
    "cgserve_queue_depth_rows",
    "Rows waiting in the batcher's queue, as each batch is taken and every 0.5 s.",
    ["model", "version"],
    multiprocess_mode="livesum",
)
IN_FLIGHT = Gauge(
    "cgserve_in_flight_batches",
    "Batches launched whose results are not yet handed back.",
    ["model"],
    multiprocess_mode="livesum",
)
# Per device (cuda:0, cuda:1 … or cpu), for a model served by one engine per GPU: new families,
# so that the model-level ones above keep their labels (deploy/ rules and dashboards read them).
DEVICE_BATCHES = Counter(
    "cgserve_device_batches",
    "Batches launched on each device (each goes to the least-loaded one).",
    ["model", "device"],
)
DEVICE_ROWS = Counter("cgserve_device_rows", "Real (non-padding) rows launched on each device.", ["model", "device"])
DEVICE_IN_FLIGHT = Gauge(
    "cgserve_device_in_flight_batches",
    "Batches launched on each device whose results are not yet handed back.",
    ["model", "device"],
    multiprocess_mode="livesum",
)
DEVICE_READY = Gauge(
    "cgserve_device_ready",
    "1 when the model's engine on this device is built and its device healthy, 0 while starting, broken or unloaded.",
    ["model", "device"],
    multiprocess_mode="livemin",
)
REJECTIONS = Counter(
    "cgserve_rejections",
    "Requests answered with an error (or not at all), by reason: invalid_input, body_too_large, queue_full, "
    "bytes_in_flight, deadline_exceeded, request_timeout, engine_error, not_ready, unknown_model, invalid_route, "
    "unauthorized, client_closed (model is empty where no served model was named).",
    ["model", "reason"],
)
CAPTURE_SECONDS = Gauge(
    "cgserve_graph_capture_seconds",
    "Wall time to warm up and capture each bucket's CUDA graphs (all slots and input dtypes).",
    ["model", "bucket"],
    multiprocess_mode="max",
)
GRAPH_POOL_BYTES = Gauge(
    "cgserve_graph_pool_bytes",
    "Device memory held by the shared CUDA-graph memory pool after capture (0 once a version is freed).",
    ["model", "version"],
    multiprocess_mode="livesum",
)
COMPILE_FALLBACK = Gauge(
    "cgserve_compile_fallback",
    "1 where a model's torch.compile failed and its engine serves graphs of the eager module instead "
    "(GET /v1/models/{name} says why), 0 where every bucket runs the compiled kernels.",
    ["model", "device"],
    multiprocess_mode="max",
)
READY = Gauge(
    "cgserve_ready",
    "1 when every model is ready to serve, 0 while starting or broken.",
    multiprocess_mode="livemin",
)
MODEL_READY = Gauge(
    "cgserve_model_ready",
    "1 when this model's engine is ready to serve, 0 while starting or broken.",
    ["model"],
    multiprocess_mode="livemin",
)
ENGINE_INFO = Gauge(
    "cgserve_engine_info",
    "1; the labels name the engine serving each model (0 once the model is unloaded).",
    ["engine", "device", "dtype", "model"],
    multiprocess_mode="max",
)

# 100 µs … 2.5 s: a healthy loop wakes within a ms of asking; an unfrozen heap's full gc took 0.1–0.5 s.
PAUSE_BUCKETS = (0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
EVENT_LOOP_LAG = Histogram(
    "cgserve_event_loop_lag_seconds",
    "How late the event loop woke a task that asked to sleep 50 ms: time the loop was held by other work. "
    "process: worker (an HTTP worker, or the only process) or engines (the engine process's loop, which "
    "batches for every worker).",
    ["process"],
    buckets=PAUSE_BUCKETS,
)
GC_PAUSE = Histogram(
    "cgserve_gc_pause_seconds",
    "Duration of each garbage collection, by generation (2: a full collection) and process (worker | engines).",
    ["generation", "process"],
    buckets=PAUSE_BUCKETS,
)

# nv_gpu_* per visible GPU, read from NVML at each render (app/ops/gpu_metrics.py); nothing without a GPU.
GPU = GpuCollector()
REGISTRY.register(GPU)


def exposition() -> bytes:
    """The text format of this process's metrics, or every worker's when several run, rendered on the caller's thread
    (GET /metrics renders it off the loop: exposition_off_loop)."""
    metric_buffers.flush()  # this process's hot-path figures, up to now
    return _render()


def _render() -> bytes:
    if "PROMETHEUS_MULTIPROC_DIR" in os.environ:
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        registry.register(GPU)  # read by this worker alone: one set of GPU series, not one per worker
        registry.register(WorkerProcesses(os.environ["PROMETHEUS_MULTIPROC_DIR"]))  # process_*{pid}, each process
        return generate_latest(registry)
    return generate_latest()


# One thread renders: a render walks every series (and, with several workers, reads every worker's
# files), tens of ms to seconds that on the event loop kept /healthz and inference waiting.
_renderer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="metrics")
_rendering: asyncio.Future[bytes] | None = None


async def exposition_off_loop() -> bytes:
    """exposition() with the render on a thread; scrapes that arrive while one renders share its text."""
    global _rendering
    if _rendering is None or _rendering.done():
        metric_buffers.flush()  # on the loop: the buffers are the loop's alone
        _rendering = asyncio.get_running_loop().run_in_executor(_renderer, _render)
    return await asyncio.shield(_rendering)  # a scraper that leaves does not cancel the others' render


@functools.cache
def _request_children(model: str, protocol: str, form: str, code: str) -> tuple[BufferedSum, BufferedHistogram]:
    """The labelled children, looked up once per label set and buffered (app/ops/metric_buffers.py)."""
    return (
        BufferedSum(REQUESTS.labels(model=model, protocol=protocol, format=form, code=code)),
        BufferedHistogram(REQUEST_LATENCY.labels(model=model, protocol=protocol, format=form)),
    )


def device_children(model: str, device: str) -> tuple[BufferedSum, BufferedSum, BufferedSum]:
    """One device's (batches, rows, in flight), looked up once per batcher and buffered."""
    return (
        BufferedSum(DEVICE_BATCHES.labels(model=model, device=device)),
        BufferedSum(DEVICE_ROWS.labels(model=model, device=device)),
        BufferedSum(DEVICE_IN_FLIGHT.labels(model=model, device=device)),
    )


def observe_request(model: str, protocol: str, form: str, code: str, seconds: float) -> None:
    """One answered inference request, from any ingress."""
    counter, latency = _request_children(model, protocol, form, code)
    counter.inc()
    latency.observe(seconds)


@functools.cache
def front_door_wait(model: str) -> BufferedHistogram:
    """The front door's wait histogram for `model` (a served one), buffered: a bulk's rows observed at once."""
    return BufferedHistogram(FRONT_DOOR_WAIT.labels(model=model))


def observe_requests(model: str, protocol: str, form: str, code: str, seconds: np.ndarray) -> None:
    """Several answered requests at once, one latency each."""
    counter, latency = _request_children(model, protocol, form, code)
    counter.inc(len(seconds))
    latency.observe_many(seconds)


def reject(model: str, reason: str, requests: int = 1) -> None:
    REJECTIONS.labels(model=model, reason=reason).inc(requests)
