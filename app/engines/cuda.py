"""The CUDA engine: one graph per bucket replayed on a dedicated stream (or eager, as a baseline).

A batch is, on the engine's own non-default stream, never waiting on the host:

    start.record()
    static_in[:b] ← slot.host_in[:b]                     H2D from pinned memory (uint8 or fp32)
    logits = DeviceForward(static_in[:b])               (x / 255 − mean) / std, the model, fp32 logits
                                                        (named outputs packed into one fp32 row an image)
    slot.host_out[:b] ← postprocess(logits)             softmax | sigmoid | none, D2H into pinned memory
    done.record()

With host_io "mapped" the two copies go: the forward reads the slot's pinned pixels and the
softmax writes its probabilities straight into the slot, through device views of the pinned
memory (app/engines/host_mapped.py), a graph of kernels alone; "auto" maps the probabilities
always, and the pixels where the largest bucket's float32 staging is small (MAPPED_INPUT_LIMIT_BYTES),
decided once per engine: ResNet-50's pixels are copied at every bucket.

The copies are captured into the graph with the forward, so a batch costs the host a single
replay() call; their host addresses are baked in, hence one graph per (slot, bucket, input
dtype), all in one memory pool. The stream orders everything a batch touches on the device:
batch N+1's copy into static_in runs after batch N's forward read it, and every output (which
may alias another bucket's in the shared pool) is copied out inside its own replay. The batcher
reuses a slot's host buffers only after its `done` event completed.

With `torch_compile_mode` set, the forward is first compiled by inductor (fused Triton kernels, one static
shape per bucket and input dtype, no CUDA graphs of its own) and those kernels are what each graph
captures. `fuse_input` also compiles the input normalisation with the model; the service leaves it off (only
bench/engine_bench.py sets it): it gained nothing measurable for the seed CNN, and it compiles the model once per
input dtype.

Hand-back, by `event_wait`:
  poll   the event loop polls done.query() between its other work (no thread hop); a batch
         still running after POLL_LIMIT_S is handed to the waiter thread
  spin   the EventWaiter thread waits in the driver, spinning with the GIL released
  block  the EventWaiter thread sleeps until the driver's interrupt
"""

from __future__ import annotations

import asyncio
import copy
import ctypes
import gc
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import torch
from torch import nn

from app.engines import precision
from app.engines.base import INPUT_DTYPES, EngineReport, InputDtype, Slot
from app.engines.device_forward import DeviceForward
from app.engines.device_streams import give_back_stream, take_stream
from app.engines.event_waiter import EventWaiter
from app.engines.graph_capture import capture_graphs
from app.engines.host_mapped import device_view
from app.engines.inductor import CountedInductor, compile_counted, compile_errors
from app.engines.model_input import ModelInput
from app.engines.postprocess import finished, finished_into, packed, relative_error
from app.repository.model_spec import ModelSpec

log = logging.getLogger(__name__)

TORCH_INPUT = {"uint8": torch.uint8, "float32": torch.float32}
# ‖engine logits − fp32 eager logits‖ / ‖fp32 eager logits‖ allowed at start-up validation.
TOLERANCE = {"fp32": 1e-5, "fp16": 1e-2, "bf16": 1e-2}
# Fresh random inputs per (slot, bucket, input dtype) at start-up: enough draws that a dtype
# whose error straddles the tolerance is caught on every start, not one start in a few.
VALIDATION_DRAWS = 4
# host_io "auto": pixels are read in place (no H2D node) where the largest bucket's float32 staging is
# this small (decided once per engine); above it a DMA copy is kept (kernels reading over PCIe were
# measured for the seed CNN's 784-byte rows only).
MAPPED_INPUT_LIMIT_BYTES = 2**20
# Longer than any batch of a small CNN; past it, polling would only burn the event loop's core.
POLL_LIMIT_S = 0.002


class _CompileIncomplete(RuntimeError):
    """Inductor compiled fewer buckets than the engine captured: some graphs hold the eager module."""


_Key = tuple[int, InputDtype]  # (bucket, input dtype): one graph each, per slot


@dataclass(frozen=True)
class LauncherHandles:
    """The raw CUDA objects app/front_door/launch.c drives, as integers (addresses and handles)."""

    stream: int  # CUstream: the engine's
    context: int  # CUcontext: the device's primary one
    buckets: tuple[int, ...]
    ins: list[int]  # per slot: (max_bucket, C, H, W) uint8, pinned
    outs: list[int]  # per slot: (max_bucket, width) fp32, pinned
    graphs: list[int]  # CUgraphExec of slot s, bucket b at s * len(buckets) + b
    starts: list[int]  # CUevent per slot, before and after its batch
    dones: list[int]
    width: int


@dataclass(slots=True)
class _SlotState:
    host_in: dict[InputDtype, torch.Tensor]  # dtype → (max_bucket, C, H, W), pinned; the launcher's: uint8 alone
    host_out: torch.Tensor  # (max_bucket, width) fp32 probabilities (or packed named outputs), pinned
    mapped_in: dict[InputDtype, torch.Tensor]  # pixels read in place: CUDA views of host_in, else empty
    mapped_out: torch.Tensor | None  # probabilities written in place: a CUDA view of host_out
    start: torch.cuda.Event  # timing events bracketing the batch's device work
    done: torch.cuda.Event
    graphs: dict[_Key, torch.cuda.CUDAGraph] = field(default_factory=dict)
    logits: dict[_Key, torch.Tensor] = field(default_factory=dict)  # (bucket, width) fp32, in the pool


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
        torch_compile_mode: str | None = None,
        in_flight: int = 2,
        event_wait: str = "poll",
        host_io: str = "auto",
        fuse_input: bool = False,
        keep_graphs: bool = False,
        compile_strict: bool = False,
        name: str | None = None,
        launcher_slots: int = 0,
    ) -> None:
        started = time.perf_counter()
        self.name = name or ("cuda-graph" if use_graphs else "eager")
        self.device = str(device)
        self.buckets = buckets
        self.spec = spec
        self.dtype = dtype
        self.channels_last = channels_last
        self.event_wait = event_wait
        self.host_io = host_io
        self._device = device
        self._broken: str | None = None
        torch.cuda.set_device(device)
        precision.require(dtype)  # TF32 and cuDNN flags are the process's, decided once for every model
        self._input = ModelInput(spec.preprocess.mean, spec.preprocess.std).to(device)
        # Both in eval mode already (app/repository/loaders.py). The reference runs fp32 eager.
        self._reference = copy.deepcopy(module).to(device)
        self._module = module.to(device)
        if channels_last:
            self._module = self._module.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        self._fuse_input = fuse_input
        self._inductor: CountedInductor | None = None  # counts what inductor compiled, with a compile mode
        self._forward = self._device_forward(torch_compile_mode)
        # The static inputs, one per input dtype: bucket b's graphs read static_in[dtype][:b].
        self._static_in = {
            d: torch.zeros((buckets[-1], *spec.input_shape), dtype=TORCH_INPUT[d], device=device) for d in INPUT_DTYPES
        }
        self._waiter = EventWaiter()
        self._slots = [self._new_slot_state() for _ in range(in_flight)]
        self.slots = tuple(
            Slot(index=i, inputs={d: t.numpy() for d, t in state.host_in.items()}, outputs=state.host_out.numpy())
            for i, state in enumerate(self._slots)
        )
        # The front door's launcher's own slots (app/front_door/launch.c), captured and validated with the batcher's
        # but never in its pool: their graphs are launched from C (launcher_handles). The door hands it uint8 pixels
        # only, so they hold and capture that input alone.
        self._launcher_slots = [self._new_slot_state(("uint8",)) for _ in range(launcher_slots)]
        self._slots += self._launcher_slots
        self.report = EngineReport(
            facts={
                "dtype": dtype,
                "channels_last": channels_last,
                "torch_compile_mode": torch_compile_mode,
                "postprocess": spec.config.postprocess,
                "event_wait": event_wait,
                "host_io": self.host_io,
                "gpu": torch.cuda.get_device_name(device),
            }
        )
        self._stream = take_stream(device)  # a closed engine's, so its cuBLAS workspace is reused (device_streams.py)
        self._stream_given_back = False
        try:
            self._prepare(use_graphs, keep_graphs, torch_compile_mode, compile_strict)
        except BaseException:
            self.close()
            raise
        self.report.startup_seconds = time.perf_counter() - started
        log.info(
            "%s engine for %s on %s ready in %.2f s", self.name, spec.name, self.device, self.report.startup_seconds
        )

    # --- start-up ------------------------------------------------------------------------------

    def _device_forward(self, torch_compile_mode: str | None) -> Callable[[torch.Tensor], torch.Tensor]:
        """The batch's device work as one callable, compiled by inductor where a mode is given.

        Fused, inductor sees the pixels: one graph per (bucket, input dtype). Unfused, the model sees
        fp32 either way, one graph per bucket where the two paths' guards agree (the limits allow both).
        """
        self._inductor = None
        layout = self.spec.layout
        forward = DeviceForward(
            self._input, self._module, dtype=self.dtype, channels_last=self.channels_last, layout=layout
        )
        if torch_compile_mode is None:
            return forward
        shapes = len(self.buckets) * len(INPUT_DTYPES)
        if self._fuse_input:  # inductor sees the normalisation too
            compiled, self._inductor = compile_counted(forward, torch_compile_mode, shapes)
            return compiled
        compiled, self._inductor = compile_counted(self._module, torch_compile_mode, shapes)
        return DeviceForward(self._input, compiled, dtype=self.dtype, channels_last=self.channels_last, layout=layout)  # type: ignore[arg-type]

    def _uncompiled(self) -> list[str]:
        """What ran without inductor's kernels: buckets, or with the input fused (bucket, input dtype)s."""
        assert self._inductor is not None
        compiled = set(self._inductor.compiled)
        if self._fuse_input:
            wanted = [(bucket, TORCH_INPUT[dtype]) for bucket in self.buckets for dtype in INPUT_DTYPES]
            return [f"{bucket} {dtype}" for bucket, dtype in wanted if (bucket, dtype) not in compiled]
        batches = {bucket for bucket, _ in compiled}
        return [str(bucket) for bucket in self.buckets if bucket not in batches]

    def _prepare(self, use_graphs: bool, keep_graphs: bool, torch_compile_mode: str | None, strict: bool) -> None:
        """Capture (with graphs) and validate; where inductor fails, do both again with the eager module.

        Every (bucket, input dtype) runs inductor's kernels or the engine says it does not: the
        compiled graphs' batch sizes are counted against the buckets, and a compile that fails or
        leaves a bucket out makes the engine serve graphs of the eager module, with `compile_fallback`
        saying why, or stops the start-up under compile_strict.
        """
        failures: tuple[type[Exception], ...] = (*compile_errors(), _CompileIncomplete)
        try:
            if use_graphs:
                self._capture(keep_graphs)
            self.report.validation_error = self._validate()
            if self._inductor is not None:
                missing = self._uncompiled()
                if missing:
                    raise _CompileIncomplete(f"buckets {missing} ran without compiled kernels")
                self.report.facts["compiled_graphs"] = len(self._inductor.compiled)
        except failures as error:
            if torch_compile_mode is None or strict:
                raise
            why = " ".join(f"{type(error).__name__}: {error}".split())[:500]
            log.warning(
                "%s: torch.compile (%s) failed, serving graphs of the eager module instead (compile_strict = true "
                "refuses to start): %s",
                self.spec.name,
                torch_compile_mode,
                why,
            )
            self.report.compile_fallback = why
            self.report.capture_seconds.clear()
            for state in self._slots:
                state.graphs.clear()
                state.logits.clear()
            self._forward = self._device_forward(None)
            self._prepare(use_graphs, keep_graphs, None, strict)

    def _new_slot_state(self, dtypes: tuple[InputDtype, ...] = INPUT_DTYPES) -> _SlotState:
        """A slot's pinned rows for each input dtype in `dtypes`, its events, and (captured later) its graphs."""
        rows, classes = self.buckets[-1], self.spec.layout.width
        host_in = {d: torch.zeros((rows, *self.spec.input_shape), dtype=TORCH_INPUT[d]).pin_memory() for d in dtypes}
        host_out = torch.zeros((rows, classes), dtype=torch.float32).pin_memory()
        mapped_in: dict[InputDtype, torch.Tensor] = {}
        mapped_out = None
        fp32_bytes = rows * self.spec.pixels * 4  # one limit for every slot, whatever it holds
        map_input = self.host_io == "mapped" or (self.host_io == "auto" and fp32_bytes <= MAPPED_INPUT_LIMIT_BYTES)
        if self.host_io != "copy":
            try:
                mapped_out = device_view(host_out, self._device)
                if map_input:
                    mapped_in = {d: device_view(t, self._device) for d, t in host_in.items()}
            except ValueError as error:  # keep serving, with the copies
                log.warning(
                    "%s: host_io %s is not possible here (%s); using copies", self.spec.name, self.host_io, error
                )
                self.host_io, mapped_in, mapped_out = "copy", {}, None
        return _SlotState(
            host_in=host_in,
            host_out=host_out,
            mapped_in=mapped_in,
            mapped_out=mapped_out,
            start=torch.cuda.Event(enable_timing=True),
            # Non-blocking events make the waiter thread spin in the driver (GIL released).
            done=torch.cuda.Event(enable_timing=True, blocking=self.event_wait != "spin"),
        )

    def _copy_forward_copy(self, state: _SlotState, dtype: InputDtype, bucket: int) -> torch.Tensor:
        """Queue H2D, model input, forward, postprocess and D2H for `bucket` rows; returns the logits.

        What each graph captures, and what the eager engine runs per batch.
        """
        if state.mapped_in:  # the forward reads the slot's pinned pixels in place
            x = state.mapped_in[dtype][:bucket]
        else:
            x = self._static_in[dtype][:bucket]
            x.copy_(state.host_in[dtype][:bucket], non_blocking=True)
        logits = self._forward(x)  # (b, width) fp32: the class scores' logits, or the packed named outputs
        postprocess, layout = self.spec.config.postprocess, self.spec.layout
        if state.mapped_out is not None:  # the scores are written into the slot's pinned memory in place
            finished_into(logits, layout, postprocess, state.mapped_out[:bucket])
        else:
            state.host_out[:bucket].copy_(finished(logits, layout, postprocess), non_blocking=True)
        return logits

    def _capture(self, keep_graphs: bool) -> None:
        gc.collect()
        torch.cuda.empty_cache()
        reserved_before = torch.cuda.memory_reserved(self._device)
        pool = torch.cuda.graph_pool_handle()  # one pool shared by every graph, as in vLLM
        capture_seconds = self.report.capture_seconds
        for index, state in enumerate(self._slots):
            for dtype in state.host_in:
                run_bucket = partial(self._copy_forward_copy, state, dtype)
                captured = capture_graphs(run_bucket, self.buckets, self._stream, pool, keep_graph=keep_graphs)
                for bucket in self.buckets:
                    state.graphs[bucket, dtype] = captured.graphs[bucket]
                    state.logits[bucket, dtype] = captured.outputs[bucket]
                    capture_seconds[bucket] = capture_seconds.get(bucket, 0.0) + captured.capture_seconds[bucket]
                log.info("%s: captured slot %d, %s input, buckets %s", self.spec.name, index, dtype, list(self.buckets))
        gc.collect()
        torch.cuda.empty_cache()  # what the warm-ups cached outside the pool goes back
        self.report.pool_bytes = torch.cuda.memory_reserved(self._device) - reserved_before
        log.info("%s: graph pool %.2f MiB", self.spec.name, self.report.pool_bytes / 2**20)

    def _validate(self) -> dict[int, float]:
        """Every (slot, bucket, input dtype), full path, against fp32 eager on fresh random input.

        Compares logits: the softmax that follows is the same fp32 code on both sides, and in
        fp16/bf16 it would turn a small logit error into a larger relative probability error.
        """
        errors: dict[int, float] = {}
        generator = torch.Generator(device=self._device).manual_seed(time.time_ns() % 2**31)
        shape = self.spec.input_shape
        # The stream context puts the calling thread's current stream back afterwards.
        with torch.inference_mode(), torch.cuda.stream(self._stream):
            for state in self._slots:
                dtypes = tuple(state.host_in)
                for bucket in self.buckets:
                    for draw in range(VALIDATION_DRAWS * len(dtypes)):
                        dtype = dtypes[draw % len(dtypes)]
                        x = torch.randint(0, 256, (bucket, *shape), device=self._device, generator=generator)
                        x = x.to(torch.uint8) if dtype == "uint8" else x.float() * (1 / 255)
                        want = packed(self._reference(self._input(x)), self.spec.layout, bucket)
                        state.host_in[dtype][:bucket].copy_(x)
                        got = self._queue_batch(state, bucket, dtype)
                        state.done.synchronize()
                        errors[bucket] = max(errors.get(bucket, 0.0), relative_error(got, want, self.spec.layout))
        bad = {b: e for b, e in errors.items() if not e <= TOLERANCE[self.dtype]}
        if bad:
            raise RuntimeError(
                f"{self.spec.name}: {self.name} ({self.dtype}) logits differ from fp32 eager beyond "
                f"{TOLERANCE[self.dtype]:g} (relative error by bucket: {bad}); try another dtype or engine eager"
            )
        log.info("%s: every bucket within tolerance of eager, max error %.2e", self.spec.name, max(errors.values()))
        return errors

    # --- serving -------------------------------------------------------------------------------

    def _queue_batch(self, state: _SlotState, bucket: int, dtype: InputDtype) -> torch.Tensor:
        """Queue one batch on the engine's stream and return at once; the logits are for validation.

        The engine's stream becomes the calling thread's current stream (replay() launches on
        the current stream) and stays so: the event-loop thread does no other CUDA work, and
        a StreamContext's enter and exit would cost a few µs per batch.
        """
        torch.cuda.set_stream(self._stream)
        state.start.record(self._stream)
        if state.graphs:
            state.graphs[bucket, dtype].replay()
            logits = state.logits[bucket, dtype]
        else:
            with torch.inference_mode():
                logits = self._copy_forward_copy(state, dtype, bucket)
        state.done.record(self._stream)
        return logits

    async def run(self, slot: Slot, bucket: int, dtype: InputDtype) -> float:
        state = self._slots[slot.index]
        try:
            self._queue_batch(state, bucket, dtype)
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

    @property
    def launcher_slots(self) -> int:
        """How many slots of its own the front door's launcher has in this engine (0: none)."""
        return len(self._launcher_slots)

    def launcher_handles(self) -> LauncherHandles | None:
        """What app/front_door/launch.c launches for uint8 rows: its slots' pinned memory, their graphs and events, the
        engine's stream and the CUDA context; None where the engine has no launcher slots or no graphs."""
        if not self._launcher_slots or not self._launcher_slots[0].graphs:
            return None
        context = ctypes.c_void_p()
        cuda = ctypes.CDLL("libcuda.so.1")
        torch.cuda.set_device(self._device)  # its primary context current on this thread: the one C makes current
        if cuda.cuCtxGetCurrent(ctypes.byref(context)) != 0 or not context.value:
            return None
        return LauncherHandles(
            stream=self._stream.cuda_stream,
            context=context.value,
            buckets=self.buckets,
            ins=[state.host_in["uint8"].data_ptr() for state in self._launcher_slots],
            outs=[state.host_out.data_ptr() for state in self._launcher_slots],
            graphs=[
                state.graphs[b, "uint8"].raw_cuda_graph_exec() for state in self._launcher_slots for b in self.buckets
            ],
            starts=[state.start.cuda_event for state in self._launcher_slots],
            dones=[state.done.cuda_event for state in self._launcher_slots],
            width=self.spec.layout.width,
        )

    def healthy(self) -> bool:
        return self._broken is None

    def debug_dump(self, bucket: int, path: str, dtype: InputDtype = "float32") -> None:
        """Write bucket's graph (of the first slot) as Graphviz dot.

        Needs the engine built with keep_graphs=True after CUDAGraph.enable_debug_mode(): with
        the default keep_graph=False torch warns and writes nothing.
        """
        self._slots[0].graphs[bucket, dtype].debug_dump(path)

    def close(self) -> None:
        self._waiter.close()
        # Not a broken device's stream, nor one where a batch that never came back may still run.
        if not self._stream_given_back and self._broken is None and self._stream.query():
            self._stream_given_back = True
            give_back_stream(self._device, self._stream)
