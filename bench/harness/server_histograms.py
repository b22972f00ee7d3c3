"""What the service's own histograms saw during one load step: /metrics scraped before and after,
the difference read as quantiles. For where a client's latency goes: inside the handler
(cgserve_request_duration_seconds: from the handler's start to the answer encoded) or outside it
(reading, the event loop's queue, writing, the generator), and whether the loop stalled or the
garbage collector ran meanwhile.

A quantile here is the upper bound of the histogram bucket that holds it (app/ops/metrics.py's
buckets: 0.5, 0.75, 1, 1.5, 2, 3, 5, 7.5, 10 ms, …), so read it as "at most".
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

# The families read, each summed over its labels: (name in /metrics, key in the view).
FAMILIES = {
    "cgserve_request_duration_seconds": "handler_ms",
    "cgserve_queue_wait_seconds": "queue_wait_ms",
    "cgserve_event_loop_lag_seconds": "loop_lag_ms",
    "cgserve_gc_pause_seconds": "gc_pause_ms",
    "cgserve_batch_rows": "batch_rows",
    "cgserve_batch_compute_seconds": "batch_compute_ms",
    "cgserve_batch_wall_seconds": "batch_wall_ms",
    "cgserve_front_door_wait_seconds": "door_wait_ms",
    "cgserve_engine_link_seconds": "engine_link_ms",
    "cgserve_gpu_jpeg_wait_seconds": "jpeg_wait_ms",
    "cgserve_gpu_jpeg_batch_seconds": "jpeg_batch_ms",
    "cgserve_gpu_jpeg_stage_seconds": "jpeg_stage_ms",
}
# Families read apart by one label's value, each value its own key (`key`_`value`): the workers'
# loops and the engine process's loop lag for different reasons; the engine link's and the JPEG decoder's stages;
# requests by the protocol that served them (rest, v2, grpc, door).
SPLIT_BY = {
    "cgserve_request_duration_seconds": "protocol",
    "cgserve_event_loop_lag_seconds": "process",
    "cgserve_engine_link_seconds": "stage",
    "cgserve_gpu_jpeg_stage_seconds": "stage",
}
ONLY_SPLIT = {"cgserve_engine_link_seconds", "cgserve_gpu_jpeg_stage_seconds"}  # stages: no mean of them all together

Snapshot = dict[str, dict[str, Any]]  # family → {"buckets": {le: cumulative count}, "sum": s, "count": n}


def scrape(url: str, timeout_s: float = 5.0) -> Snapshot | None:
    """The histograms of FAMILIES from `url`/metrics (every worker's, merged); None where there is none."""
    try:
        response = httpx.get(f"{url}/metrics", timeout=timeout_s)
    except httpx.HTTPError:
        return None
    if response.status_code != 200 or not response.headers.get("content-type", "").startswith("text/plain"):
        return None  # no Prometheus text here (a no-op answers every GET with its readiness JSON)
    return snapshot(response.text)


def snapshot(text: str) -> Snapshot:
    """The histograms of FAMILIES in Prometheus's text format (a scrape's, or a process's own registry's through
    prometheus_client.generate_latest)."""
    out: Snapshot = {}
    for family in text_string_to_metric_families(text):
        if family.name not in FAMILIES:
            continue
        label = SPLIT_BY.get(family.name)
        parts: dict[str, dict[str, Any]] = defaultdict(
            lambda: {"buckets": defaultdict(float), "sum": 0.0, "count": 0.0}
        )
        for sample in family.samples:
            # Every sample counts toward the family's whole; a split family's also toward its part.
            keys = [family.name] + ([f"{family.name}:{sample.labels.get(label, '')}"] if label else [])
            for key in keys:
                part = parts[key]
                if sample.name.endswith("_bucket"):
                    part["buckets"][float(sample.labels["le"])] += sample.value
                elif sample.name.endswith("_sum"):
                    part["sum"] += sample.value
                elif sample.name.endswith("_count"):
                    part["count"] += sample.value
        for key, part in parts.items():
            out[key] = {"buckets": dict(part["buckets"]), "sum": part["sum"], "count": part["count"]}
    return out


def quantile(buckets: dict[float, float], q: float) -> float | None:
    """The upper bound of the bucket holding the q-quantile of cumulative `buckets` (le → count)."""
    bounds = sorted(buckets)
    total = buckets[bounds[-1]] if bounds else 0.0
    if total <= 0:
        return None
    rank = q * total
    return next(bound for bound in bounds if buckets[bound] >= rank)


def step_view(before: Snapshot, after: Snapshot) -> dict[str, Any]:
    """What happened between two snapshots: per family its count, mean, p50, p99 (ms for seconds)."""
    view: dict[str, Any] = {}
    names = dict(FAMILIES)
    for name in after:  # a split family's parts: cgserve_event_loop_lag_seconds:engines → loop_lag_ms_engines
        family, _, value = name.partition(":")
        if value:
            names[name] = f"{FAMILIES[family]}_{value}"
    for name, key in names.items():
        if name not in after or name in ONLY_SPLIT:
            continue
        old = before.get(name, {"buckets": {}, "sum": 0.0, "count": 0.0})
        delta = {le: n - old["buckets"].get(le, 0.0) for le, n in after[name]["buckets"].items()}
        count = after[name]["count"] - old["count"]
        scale = 1.0 if key == "batch_rows" else 1000.0

        def scaled(value: float | None, scale: float = scale) -> float | None:
            return None if value is None or math.isinf(value) else round(value * scale, 3)

        view[key] = {
            "count": int(count),
            "mean": scaled((after[name]["sum"] - old["sum"]) / count) if count else None,
            "p50": scaled(quantile(delta, 0.5)),
            "p99": scaled(quantile(delta, 0.99)),
        }
    return view
