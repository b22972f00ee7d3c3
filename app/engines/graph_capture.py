"""Capturing one CUDA graph per bucket, largest first, into a shared memory pool.

As in vLLM's CUDAGraphRunner: the input buffer is allocated once at the largest bucket and
each graph reads a slice of it; every bucket is warmed up on the capture stream right before
its capture (cuDNN picks and caches its algorithms outside the graph); capturing the largest
bucket first lets the smaller ones reuse its blocks in the shared pool.

A capture never disturbs the models already serving on the device. torch.cuda.graph's context
captures in the driver's "global" mode, where a stream query, an event record or a pinned
allocation from *any* thread fails with cudaErrorStreamCaptureUnsupported while a capture is
underway — so a model that served on the event loop while the next one was captured lost its
batch and its device. Here the capture is "thread_local": only this thread's own unsafe calls
are refused. The context's device-wide synchronize and cache flush are skipped too (they would
stall every stream of the device); the warm-up synchronizes the capture stream alone. One capture
at a time per process, as torch requires: CAPTURE_LOCK.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

log = logging.getLogger(__name__)

WARMUP_ITERATIONS = 3
CAPTURE_ERROR_MODE = "thread_local"  # cudaStreamCaptureModeThreadLocal; "global" breaks other threads' launches
CAPTURE_LOCK = threading.Lock()  # torch allows one capture underway in a process


@dataclass
class CapturedGraphs:
    graphs: dict[int, torch.cuda.CUDAGraph] = field(default_factory=dict)
    outputs: dict[int, torch.Tensor] = field(default_factory=dict)  # bucket → (bucket, classes), in the pool
    capture_seconds: dict[int, float] = field(default_factory=dict)  # warm-up + capture wall time


def capture_graphs(
    run_bucket: Callable[[int], torch.Tensor],
    buckets: tuple[int, ...],
    stream: torch.cuda.Stream,
    pool: Any,  # torch.cuda.graph_pool_handle()
    *,
    keep_graph: bool = False,
) -> CapturedGraphs:
    """Capture `run_bucket(b)` for every bucket b, largest first, on `stream` into `pool`.

    run_bucket(b) queues the work for b rows on the current stream and returns its output.
    Start-up or load only: synchronizes `stream` (never the device) after each warm-up.
    """
    captured = CapturedGraphs()
    with torch.inference_mode(), torch.cuda.stream(stream):
        for bucket in sorted(buckets, reverse=True):
            started = time.perf_counter()
            for _ in range(WARMUP_ITERATIONS):
                run_bucket(bucket)
            stream.synchronize()
            graph = torch.cuda.CUDAGraph(keep_graph=keep_graph)
            with CAPTURE_LOCK:
                graph.capture_begin(pool=pool, capture_error_mode=CAPTURE_ERROR_MODE)
                try:
                    captured.outputs[bucket] = run_bucket(bucket)
                finally:
                    graph.capture_end()
            if keep_graph:
                graph.instantiate()
            captured.graphs[bucket] = graph
            captured.capture_seconds[bucket] = time.perf_counter() - started
    return captured
