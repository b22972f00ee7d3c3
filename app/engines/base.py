"""The small interface every engine offers the batcher.

The batcher owns the policy (which rows, which bucket, when); an engine owns the device work.
Per batch in flight the batcher holds one Slot: it writes the rows into `slot.inputs`, awaits
`engine.run(slot, bucket)`, reads `slot.outputs`, and only then reuses the slot. On a GPU the
slot's arrays are views of pinned host memory, so the copies to and from the device are async.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np


@dataclass(slots=True)
class Slot:
    inputs: np.ndarray  # (max_bucket, C, H, W) float32 host staging; rows past the batch are padding
    outputs: np.ndarray  # (max_bucket, num_classes) float32 host results
    device_state: Any = None  # engine-private per-slot objects (e.g. CUDA events)


class Engine(Protocol):
    name: str  # "eager" | "cuda-graph"
    device: str  # "cpu" | "cuda:0" …
    buckets: tuple[int, ...]  # ascending batch sizes the engine runs

    def new_slot(self) -> Slot:
        """Host buffers for one batch in flight; called at start-up only."""
        ...

    async def run(self, slot: Slot, bucket: int) -> float:
        """Compute `slot.outputs[:bucket]` from `slot.inputs[:bucket]`; return device seconds.

        `bucket` is one of `buckets`. Never blocks the event loop. Raises on failure, which
        fails this batch only.
        """
        ...

    def healthy(self) -> bool:
        """False once the device is known broken (readiness reports it)."""
        ...

    def describe(self) -> dict[str, Any]:
        """Facts for GET /v1/models: dtype, capture times, pool memory …"""
        ...

    def close(self) -> None: ...
