"""The CUDA engine: one graph per bucket replayed on a dedicated stream (or eager, as a baseline).

A batch is, on the engine's own non-default stream, never waiting on the host:

    start.record()
    static_in[:b] ← slot.host_in[:b]                     H2D from pinned memory
    logits = module(static_in[:b])                      in the compute dtype, then fp32
    slot.host_out[:b] ← softmax(logits)                 D2H into pinned memory
    done.record()

The copies are captured into the graph with the forward, so a batch costs the host a single
replay() call; their host addresses are baked in, hence one graph per (slot, bucket), all in
one memory pool. The stream orders everything a batch touches on the device: batch N+1's copy
into static_in runs after batch N's forward read it, and every output (which may alias another
bucket's in the shared pool) is copied out inside its own replay. The batcher reuses a slot's
host buffers only after its `done` event completed.

Hand-back, by `event_wait`:
  poll   the event loop polls done.query() between its other work (no thread hop); a batch
         still running after POLL_LIMIT_S is handed to the waiter thread
  spin   the EventWaiter thread waits in the driver, spinning with the GIL released
  block  the EventWaiter thread sleeps until the driver's interrupt
"""

from __future__ import annotations

import asyncio
import copy
import gc
import logging
import time
from dataclasses import dataclass, field
from functools import partial
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
# ‖engine logits − fp32 eager logits‖ / ‖fp32 eager logits‖ allowed at start-up validation.
TOLERANCE = {"fp32": 1e-5, "fp16": 1e-2, "bf16": 1e-2}
# Fresh random inputs per (slot, bucket) at start-up: enough draws that a dtype whose error
# straddles the tolerance is caught on every start, not one start in a few.
VALIDATION_DRAWS = 4
# Longer than any batch of a small CNN; past it, polling would only burn the event loop's core.
POLL_LIMIT_S = 0.002


@dataclass(slots=True)
class _SlotState:
    host_in: torch.Tensor  # (max_bucket, C, H, W) fp32, pinned
    host_out: torch.Tensor  # (max_bucket, num_classes) fp32 probabilities, pinned
    start: torch.cuda.Event  # timing events bracketing the batch's device work
    done: torch.cuda.Event
    graphs: dict[int, torch.cuda.CUDAGraph] = field(default_factory=dict)  # bucket → graph
    logits: dict[int, torch.Tensor] = field(default_factory=dict)  # bucket → (bucket, classes) in the pool


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
        event_wait: str = "poll",
        keep_graphs: bool = False,
    ) -> None:
        started = time.perf_counter()
        self.name = "cuda-graph" if use_graphs else "eager"
        self.device = str(device)
        self.buckets = buckets
        self.spec = spec
        self.dtype = dtype
        self.channels_last = channels_last
        self.event_wait = event_wait
        self._device = device
        self._broken: str | None = None
        torch.cuda.set_device(device)
        # Chosen before any warm-up: cuDNN benchmarks each fixed shape once and the graph bakes
        # in the winner. fp32 means fp32: no TF32 in convolutions or matmuls.
        torch.backends.cudnn.benchmark = True
        torch.backends.cudnn.allow_tf32 = dtype != "fp32"
        torch.backends.cuda.matmul.allow_tf32 = dtype != "fp32"
        # fp16/bf16 run under autocast: matmuls and convolutions in the low dtype, normalisation
        # and reductions in fp32; full fp32 accumulation in matmuls keeps logits within 1e-2.
        torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False

        self._reference = copy.deepcopy(module).to(device).eval()  # fp32 eager, for validation
        self._module = module.to(device).eval()
        if channels_last:
            self._module = self._module.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        # The one static input buffer: bucket b's graph reads static_in[:b]. (max_bucket, C, H, W) fp32.
        self._static_in = torch.zeros((buckets[-1], *spec.input_shape), dtype=torch.float32, device=device)
        self._stream = torch.cuda.Stream(device)  # a pool stream: non-blocking w.r.t. the default stream
        self._waiter = EventWaiter()
        self._slots = [self._new_slot_state() for _ in range(slots)]
        self._slots_handed_out = 0
        self.capture_seconds: dict[int, float] = {}
        self.pool_bytes = 0
        if use_graphs:
            self._capture(keep_graphs)
        self.validation_error = self._validate()
        self.startup_seconds = time.perf_counter() - started
        log.info("%s engine on %s ready in %.2f s", self.name, self.device, self.startup_seconds)

    # --- start-up ------------------------------------------------------------------------------

    def _new_slot_state(self) -> _SlotState:
        rows, classes = self.buckets[-1], self.spec.num_classes
        return _SlotState(
            host_in=torch.zeros((rows, *self.spec.input_shape), dtype=torch.float32).pin_memory(),
            host_out=torch.zeros((rows, classes), dtype=torch.float32).pin_memory(),
            start=torch.cuda.Event(enable_timing=True),
            # Non-blocking events make the waiter thread spin in the driver (GIL released).
            done=torch.cuda.Event(enable_timing=True, blocking=self.event_wait != "spin"),
        )

    def _copy_forward_copy(self, state: _SlotState, bucket: int) -> torch.Tensor:
        """Queue H2D, forward, softmax and D2H for `bucket` rows of `state`; returns the logits.

        What each graph captures, and what the eager engine runs per batch.
        """
        self._static_in[:bucket].copy_(state.host_in[:bucket], non_blocking=True)
        x = self._static_in[:bucket]  # (b, C, H, W) fp32
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        # cache_enabled=False: weight casts must be captured into each graph, not cached outside it.
        with torch.autocast("cuda", dtype=DTYPES[self.dtype], enabled=self.dtype != "fp32", cache_enabled=False):
            logits = self._module(x).float()  # (b, classes) fp32
        state.host_out[:bucket].copy_(torch.softmax(logits, dim=1), non_blocking=True)
        return logits

    def _capture(self, keep_graphs: bool) -> None:
        gc.collect()
        torch.cuda.empty_cache()
        reserved_before = torch.cuda.memory_reserved(self._device)
        pool = torch.cuda.graph_pool_handle()  # one pool shared by every graph, as in vLLM
        for state in self._slots:
            captured = capture_graphs(
                partial(self._copy_forward_copy, state), self.buckets, self._stream, pool, keep_graph=keep_graphs
            )
            state.graphs, state.logits = captured.graphs, captured.outputs
            for bucket, seconds in captured.capture_seconds.items():
                self.capture_seconds[bucket] = self.capture_seconds.get(bucket, 0.0) + seconds
        gc.collect()
        torch.cuda.empty_cache()  # what the warm-ups cached outside the pool goes back
        self.pool_bytes = torch.cuda.memory_reserved(self._device) - reserved_before
        for bucket, seconds in self.capture_seconds.items():
            metrics.CAPTURE_SECONDS.labels(bucket=str(bucket)).set(seconds)
            log.info("captured bucket %d (%d slots) in %.1f ms", bucket, len(self._slots), seconds * 1e3)
        metrics.GRAPH_POOL_BYTES.set(self.pool_bytes)
        log.info("graph pool for buckets %s: %.2f MiB", list(self.buckets), self.pool_bytes / 2**20)

    def _validate(self) -> dict[int, float]:
        """Every (slot, bucket), full path, against fp32 eager on fresh random input; start-up only.

        Compares logits: the softmax that follows is the same fp32 code on both sides, and in
        fp16/bf16 it would turn a small logit error into a larger relative probability error.
        """
        errors: dict[int, float] = {}
        generator = torch.Generator(device=self._device).manual_seed(time.time_ns() % 2**31)
        # The stream context puts the calling thread's current stream back afterwards.
        with torch.inference_mode(), torch.cuda.stream(self._stream):
            for state in self._slots:
                for bucket in self.buckets:
                    for _ in range(VALIDATION_DRAWS):
                        x = torch.rand((bucket, *self.spec.input_shape), device=self._device, generator=generator)
                        want = self._reference(x)
                        state.host_in[:bucket].copy_(x)
                        got = self._queue_batch(state, bucket)
                        state.done.synchronize()
                        error = float((got - want).norm() / want.norm())
                        errors[bucket] = max(errors.get(bucket, 0.0), error)
        bad = {b: e for b, e in errors.items() if not e <= TOLERANCE[self.dtype]}
        if bad:
            raise RuntimeError(
                f"{self.name} ({self.dtype}) logits differ from fp32 eager beyond {TOLERANCE[self.dtype]:g} "
                f"(relative error by bucket: {bad}); try another dtype or engine eager"
            )
        log.info("validated every bucket against eager: max relative error %.2e", max(errors.values()))
        return errors

    # --- serving -------------------------------------------------------------------------------

    def new_slot(self) -> Slot:
        if self._slots_handed_out == len(self._slots):
            raise RuntimeError(f"this engine was built with {len(self._slots)} slots; raise in_flight to get more")
        state = self._slots[self._slots_handed_out]
        self._slots_handed_out += 1
        return Slot(inputs=state.host_in.numpy(), outputs=state.host_out.numpy(), device_state=state)

    def _queue_batch(self, state: _SlotState, bucket: int) -> torch.Tensor:
        """Queue one batch on the engine's stream and return at once; the logits are for validation.

        The engine's stream becomes the calling thread's current stream (replay() launches on
        the current stream) and stays so: the event-loop thread does no other CUDA work, and
        a StreamContext's enter and exit would cost a few µs per batch.
        """
        torch.cuda.set_stream(self._stream)
        state.start.record(self._stream)
        if state.graphs:
            state.graphs[bucket].replay()
            logits = state.logits[bucket]
        else:
            with torch.inference_mode():
                logits = self._copy_forward_copy(state, bucket)
        state.done.record(self._stream)
        return logits

    async def run(self, slot: Slot, bucket: int) -> float:
        state: _SlotState = slot.device_state
        try:
            self._queue_batch(state, bucket)
            if self.event_wait == "poll":
                await self._poll(state.done)
            else:
                await self._waiter.completion(state.done)
        except RuntimeError as error:  # CUDA errors are sticky: this context will not recover
            self._broken = f"{type(error).__name__}: {error}"
            raise
        return state.start.elapsed_time(state.done) / 1000

    async def _poll(self, event: torch.cuda.Event) -> None:
        give_up = time.perf_counter() + POLL_LIMIT_S
        while not event.query():
            if time.perf_counter() > give_up:
                await self._waiter.completion(event)
                return
            await asyncio.sleep(0)  # let the loop decode and batch other requests meanwhile

    def healthy(self) -> bool:
        return self._broken is None

    def describe(self) -> dict[str, Any]:
        return {
            "dtype": self.dtype,
            "channels_last": self.channels_last,
            "event_wait": self.event_wait,
            "gpu": torch.cuda.get_device_name(self._device),
            "capture_seconds": {str(b): round(s, 6) for b, s in sorted(self.capture_seconds.items())},
            "graph_pool_bytes": self.pool_bytes,
            "validation_relative_error": {str(b): e for b, e in sorted(self.validation_error.items())},
            "startup_seconds": round(self.startup_seconds, 3),
        }

    def debug_dump(self, bucket: int, path: str) -> None:
        """Write bucket's graph (of the first slot) as Graphviz dot.

        Needs the engine built with keep_graphs=True after CUDAGraph.enable_debug_mode(): with
        the default keep_graph=False torch 2.11 warns and writes nothing.
        """
        self._slots[0].graphs[bucket].debug_dump(path)

    def close(self) -> None:
        self._waiter.close()
