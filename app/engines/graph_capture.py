"""Capturing one CUDA graph per bucket, largest first, into one shared memory pool.

As in vLLM's CUDAGraphRunner: the input buffer is allocated once at the largest bucket and
each graph reads a slice of it; every bucket is warmed up on the capture stream right before
its capture (cuDNN picks and caches its algorithms outside the graph); capturing the largest
bucket first lets the smaller ones reuse its blocks in the shared pool.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

log = logging.getLogger(__name__)

WARMUP_ITERATIONS = 3


@dataclass
class CapturedGraphs:
    graphs: dict[int, torch.cuda.CUDAGraph]
    outputs: dict[int, torch.Tensor]  # bucket → (bucket, num_classes) fp32, inside the shared pool
    capture_seconds: dict[int, float]  # warm-up + capture wall time per bucket
    pool_bytes: int  # device memory reserved by the captures (the pool), after freeing the rest


def capture_graphs(
    forward: Callable[[torch.Tensor], torch.Tensor],
    static_in: torch.Tensor,
    buckets: tuple[int, ...],
    stream: torch.cuda.Stream,
    *,
    keep_graph: bool = False,
) -> CapturedGraphs:
    """Capture `forward(static_in[:b])` for every bucket b on `stream`.

    static_in: (max_bucket, C, H, W) fp32 on the device, allocated once and never replaced.
    Start-up only: synchronizes the stream between steps.
    """
    gc.collect()
    torch.cuda.empty_cache()
    reserved_before = torch.cuda.memory_reserved(static_in.device)
    pool = torch.cuda.graph_pool_handle()
    graphs: dict[int, torch.cuda.CUDAGraph] = {}
    outputs: dict[int, torch.Tensor] = {}
    seconds: dict[int, float] = {}
    stream.wait_stream(torch.cuda.current_stream(static_in.device))
    with torch.inference_mode():
        for bucket in sorted(buckets, reverse=True):
            started = time.perf_counter()
            with torch.cuda.stream(stream):
                for _ in range(WARMUP_ITERATIONS):
                    forward(static_in[:bucket])
            stream.synchronize()
            graph = torch.cuda.CUDAGraph(keep_graph=keep_graph)
            with torch.cuda.graph(graph, pool=pool, stream=stream):
                outputs[bucket] = forward(static_in[:bucket])
            if keep_graph:
                graph.instantiate()
            graphs[bucket] = graph
            seconds[bucket] = time.perf_counter() - started
            log.info("captured bucket %d in %.1f ms", bucket, seconds[bucket] * 1e3)
    # Blocks the warm-ups cached outside the pool go back; what stays reserved is the pool.
    gc.collect()
    torch.cuda.empty_cache()
    pool_bytes = torch.cuda.memory_reserved(static_in.device) - reserved_before
    log.info("graph pool for buckets %s: %.2f MiB", sorted(buckets), pool_bytes / 2**20)
    return CapturedGraphs(graphs, outputs, seconds, pool_bytes)
