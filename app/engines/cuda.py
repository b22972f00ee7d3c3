"""The CUDA engine: one graph per bucket replayed on a dedicated stream (or eager, as a baseline).

Per batch, on the engine's own non-default stream and never waiting on the host:

    static_in[:b] ← slot.host_in[:b]     H2D, non_blocking, from pinned memory
    start.record()
    graph[b].replay()                    (eager: module(static_in[:b]))
    end.record()
    slot.host_out[:b] ← output[:b]        D2H, non_blocking, into pinned memory
    done.record()

then the EventWaiter thread resolves the batch's future once `done` completed. Everything a
batch touches on the device is ordered by the one stream: batch N+1's copy into static_in
runs after batch N's replay read it, and each replay's output (which may alias another
bucket's in the shared pool) is copied out before the next replay. The host buffers belong to
the slot, which the batcher reuses only after `done`.
"""

from __future__ import annotations

import copy
import logging
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from app import metrics
from app.engines.base import Slot
from app.engines.event_waiter import EventWaiter
from app.engines.graph_capture import capture_graphs
from app.model_spec import ModelSpec

log = logging.getLogger(__name__)

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
# ‖graph − eager‖ / ‖eager‖ allowed when a bucket is validated at start-up.
TOLERANCE = {"fp32": 1e-5, "fp16": 1e-2, "bf16": 1e-2}


@dataclass(slots=True)
class _CudaSlot:
    host_in: torch.Tensor  # (max_bucket, C, H, W) fp32, pinned
    host_out: torch.Tensor  # (max_bucket, num_classes) fp32, pinned
    start: torch.cuda.Event  # timing events around the forward alone
    end: torch.cuda.Event
    done: torch.cuda.Event  # blocking: the waiter thread sleeps on it


class CudaEngine:
    def __init__(
        self,
        module: nn.Module,
        spec: ModelSpec,
        buckets: tuple[int, ...],
        *,
        device: torch.device,
        use_graphs: bool = True,
        dtype: str = "fp32",
        channels_last: bool = False,
        slots: int = 2,
        keep_graphs: bool = False,
    ) -> None:
        started = time.perf_counter()
        self.name = "cuda-graph" if use_graphs else "eager"
        self.device = str(device)
        self.buckets = buckets
        self.spec = spec
        self.dtype = dtype
        self.channels_last = channels_last
        self._device = device
        self._broken: str | None = None
        torch.cuda.set_device(device)
        # Chosen before any warm-up: cuDNN benchmarks each fixed shape once, then the graph
        # bakes in the winner. fp32 means fp32: no TF32 in convolutions or matmuls.
        torch.backends.cudnn.benchmark = True
        torch.backends.cudnn.allow_tf32 = dtype != "fp32"
        torch.backends.cuda.matmul.allow_tf32 = dtype != "fp32"

        self._reference = copy.deepcopy(module).to(device).eval()  # fp32 eager, for validation
        self._module = module.to(device=device, dtype=DTYPES[dtype]).eval()
        if channels_last:
            self._module = self._module.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        max_bucket = buckets[-1]
        # The one static input buffer; bucket b's graph reads static_in[:b]. (max_bucket, C, H, W) fp32.
        self._static_in = torch.zeros((max_bucket, *spec.input_shape), dtype=torch.float32, device=device)
        self._stream = torch.cuda.Stream(device)
        self._waiter = EventWaiter()
        self.capture_seconds: dict[int, float] = {}
        self.pool_bytes = 0
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._outputs: dict[int, torch.Tensor] = {}
        if use_graphs:
            captured = capture_graphs(self._forward, self._static_in, buckets, self._stream, keep_graph=keep_graphs)
            self._graphs, self._outputs = captured.graphs, captured.outputs
            self.capture_seconds, self.pool_bytes = captured.capture_seconds, captured.pool_bytes
            for bucket, seconds in self.capture_seconds.items():
                metrics.CAPTURE_SECONDS.labels(bucket=str(bucket)).set(seconds)
            metrics.GRAPH_POOL_BYTES.set(self.pool_bytes)
        self.validation_error = self._validate()
        self.startup_seconds = time.perf_counter() - started
        log.info("%s engine on %s ready in %.2f s", self.name, self.device, self.startup_seconds)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        """(b, C, H, W) fp32 → (b, num_classes) fp32 probabilities; what each graph captures."""
        x = x.to(DTYPES[self.dtype])
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return self._module(x).float()

    def _validate(self) -> dict[int, float]:
        """Every bucket against fp32 eager on fresh random input; raises on a mismatch (start-up only)."""
        errors: dict[int, float] = {}
        generator = torch.Generator(device=self._device).manual_seed(int(time.time_ns()) % 2**31)
        with torch.inference_mode(), torch.cuda.stream(self._stream):
            for bucket in self.buckets:
                x = torch.rand((bucket, *self.spec.input_shape), device=self._device, generator=generator)
                self._static_in[:bucket].copy_(x)
                got = self._compute(bucket).clone()
                want = self._reference(x)
                errors[bucket] = float((got - want).norm() / want.norm())
        self._stream.synchronize()
        bad = {b: e for b, e in errors.items() if not e <= TOLERANCE[self.dtype]}
        if bad:
            raise RuntimeError(
                f"{self.name} output differs from fp32 eager beyond {TOLERANCE[self.dtype]:g} "
                f"(relative error by bucket: {bad}); try another dtype or engine eager"
            )
        log.info("validated buckets against eager: max relative error %.2e", max(errors.values()))
        return errors

    def _compute(self, bucket: int) -> torch.Tensor:
        """Queue the model over static_in[:bucket] on the current stream → (bucket, classes) fp32."""
        if self._graphs:
            self._graphs[bucket].replay()
            return self._outputs[bucket]
        with torch.inference_mode():
            return self._forward(self._static_in[:bucket])

    def new_slot(self) -> Slot:
        max_bucket, classes = self.buckets[-1], self.spec.num_classes
        state = _CudaSlot(
            host_in=torch.zeros((max_bucket, *self.spec.input_shape), dtype=torch.float32).pin_memory(),
            host_out=torch.zeros((max_bucket, classes), dtype=torch.float32).pin_memory(),
            start=torch.cuda.Event(enable_timing=True),
            end=torch.cuda.Event(enable_timing=True),
            done=torch.cuda.Event(blocking=True),
        )
        return Slot(inputs=state.host_in.numpy(), outputs=state.host_out.numpy(), device_state=state)

    async def run(self, slot: Slot, bucket: int) -> float:
        state: _CudaSlot = slot.device_state
        try:
            with torch.cuda.stream(self._stream):
                self._static_in[:bucket].copy_(state.host_in[:bucket], non_blocking=True)
                state.start.record(self._stream)
                output = self._compute(bucket)
                state.end.record(self._stream)
                state.host_out[:bucket].copy_(output, non_blocking=True)
                state.done.record(self._stream)
            await self._waiter.completion(state.done)
        except RuntimeError as error:  # CUDA errors are sticky: this device will not recover
            self._broken = f"{type(error).__name__}: {error}"
            raise
        return state.start.elapsed_time(state.end) / 1000

    def healthy(self) -> bool:
        return self._broken is None

    def describe(self) -> dict[str, Any]:
        return {
            "dtype": self.dtype,
            "channels_last": self.channels_last,
            "gpu": torch.cuda.get_device_name(self._device),
            "capture_seconds": {str(b): round(s, 6) for b, s in sorted(self.capture_seconds.items())},
            "graph_pool_bytes": self.pool_bytes,
            "validation_relative_error": {str(b): e for b, e in sorted(self.validation_error.items())},
            "startup_seconds": round(self.startup_seconds, 3),
        }

    def debug_dump(self, bucket: int, path: str) -> None:
        """Write bucket's graph as Graphviz (needs keep_graphs=True and CUDAGraph.enable_debug_mode())."""
        self._graphs[bucket].debug_dump(path)

    def close(self) -> None:
        self._waiter.close()
