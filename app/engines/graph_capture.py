"""Capturing one CUDA graph per bucket, largest first, into a shared memory pool.

As in vLLM's CUDAGraphRunner: the input buffer is allocated once at the largest bucket and
each graph reads a slice of it; every bucket is warmed up on the capture stream right before
its capture (cuDNN picks and caches its algorithms outside the graph); capturing the largest
bucket first lets the smaller ones reuse its blocks in the shared pool.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

log = logging.getLogger(__name__)

WARMUP_ITERATIONS = 3


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
    Start-up only: synchronizes the stream after each warm-up.
    """
    captured = CapturedGraphs()
    with torch.inference_mode():
        for bucket in sorted(buckets, reverse=True):
            started = time.perf_counter()
            with torch.cuda.stream(stream):
                for _ in range(WARMUP_ITERATIONS):
                    run_bucket(bucket)
            stream.synchronize()
            graph = torch.cuda.CUDAGraph(keep_graph=keep_graph)
            with torch.cuda.graph(graph, pool=pool, stream=stream):
                captured.outputs[bucket] = run_bucket(bucket)
            if keep_graph:
                graph.instantiate()
            captured.graphs[bucket] = graph
            captured.capture_seconds[bucket] = time.perf_counter() - started
    return captured
