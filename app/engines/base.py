"""The small interface every engine offers the batcher.

The batcher owns the policy (which rows, which bucket, when); an engine owns the device work.
Per batch in flight the batcher holds one Slot: it writes the rows into one of the slot's two
staging arrays, awaits `engine.run(slot, bucket, dtype)`, reads `slot.outputs`, and only then
reuses the slot. On a GPU the arrays are views of pinned host memory (the copies to and from
the device are async), and the engine keeps its own per-slot objects (events, graphs) by
`slot.index`: a slot belongs to the engine that made it, and with one engine per GPU the
batcher runs each batch on the engine whose slot it holds (app/batching/slot_pool.py).

Two input dtypes, because pixels stay small until the device:
  uint8    8-bit pixels (raw bytes, decoded uploads): a quarter of the host-to-device traffic;
           the cast to [0, 1] happens on the device, inside the graph
  float32  intensities in [0, 1] (JSON, raw float32)
Either way the engine then applies the model's per-channel (x − mean) / std.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np

InputDtype = Literal["uint8", "float32"]
INPUT_DTYPES: tuple[InputDtype, ...] = ("uint8", "float32")


@dataclass(slots=True)
class Slot:
    index: int  # which of the engine's slots: its key for the slot's device objects
    inputs: dict[InputDtype, np.ndarray]  # dtype → (max_bucket, C, H, W) staging; rows past the batch are padding
    # (max_bucket, width) float32: the class probabilities, or every named output of model.toml's
    # [[outputs]] packed into one row an image (app/repository/outputs.py cuts it back)
    outputs: np.ndarray


@dataclass(slots=True)
class EngineReport:
    """What an engine measured while it was built; the service publishes it (metrics, /v1/models)."""

    startup_seconds: float = 0.0
    capture_seconds: dict[int, float] = field(default_factory=dict)  # bucket → warm-up + capture (all slots)
    pool_bytes: int = 0  # device memory held by the graphs' shared pool
    validation_error: dict[int, float] = field(default_factory=dict)  # bucket → max relative error vs fp32 eager
    compile_fallback: str | None = None  # why torch.compile failed, where the engine serves the eager module instead
    facts: dict[str, Any] = field(default_factory=dict)  # dtype, device name, providers … for /v1/models


class Engine(Protocol):
    name: str  # "eager" | "cuda-graph" | "compile" | "onnxruntime"
    device: str  # "cpu" | "cuda:0" …
    buckets: tuple[int, ...]  # ascending batch sizes the engine runs
    slots: tuple[Slot, ...]  # host buffers, one per batch in flight: the engine's `in_flight` argument
    report: EngineReport

    async def run(self, slot: Slot, bucket: int, dtype: InputDtype) -> float:
        """Compute `slot.outputs[:bucket]` from `slot.inputs[dtype][:bucket]`; return device seconds.

        `bucket` is one of `buckets`. Never blocks the event loop. Raises on failure, which
        fails this batch only.
        """
        ...

    def healthy(self) -> bool:
        """False once the device is known broken (readiness reports it)."""
        ...

    def close(self) -> None: ...


def host_slot(index: int, max_bucket: int, input_shape: tuple[int, int, int], width: int) -> Slot:
    """A Slot of plain (unpinned) numpy arrays, for engines that compute on the host."""
    return Slot(
        index=index,
        inputs={dtype: np.zeros((max_bucket, *input_shape), dtype=dtype) for dtype in INPUT_DTYPES},
        outputs=np.zeros((max_bucket, width), dtype=np.float32),
    )
