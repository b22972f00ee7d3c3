"""JPEG uploads decoded together on the GPU: nvJPEG through torchvision, resized there, handed back.

Concurrent uploads queue here; one collector task takes everything waiting (up to `max_batch`)
as soon as fewer than `launches` batches are being launched, so the window is a launch itself:
a lone upload goes at once, and under load batches grow with the load (continuous batching).
Two launches at once (torchvision's default; the direct decoder's is four, over three states) let one batch's host work
(tensors over the uploads, torchvision's Python, the pinned buffer) run while the previous one is in nvJPEG,
which torchvision serialises behind its decoder's lock. Their resizes and copies share one stream,
interleaved in whatever order the two threads queue them: each batch waits on its own event.

One batch, on a worker thread (torchvision's batched decode does host work, the Huffman phase
for progressive JPEGs, and ends in a cudaStreamSynchronize of its own decoder stream: it must
not run on the event loop):

    decode_jpeg([k encoded (bytes,) uint8 tensors], device) → k (C, H_i, W_i) uint8 on the GPU
    per model and decoded size, on our stream: stack → (g, C, H, W) → preprocess_batch → (g, C, h, w)
        uint8 → pinned host (g, C, h, w), non_blocking
    done.record(stream)

nvJPEG writes on torchvision's own decoder stream, which waits for nothing of ours; torchvision
then makes the calling thread's current stream wait for it. So the decoded images are allocated
under a stream of their own that nothing else uses (`_decode_stream`): allocated under ours, they
could take memory a batch freed while its resize, still queued on ours, reads it, and nvJPEG would
overwrite it first. Ours waits for that stream, and the batch holds its decoded images until `done`
has completed, so that their memory is not reused before our resize of them has run (one reference
kept, where a record_stream an image was a torch call, and a wait for the GIL, an image).

With CGSERVE_JPEG_STREAM_PRIORITY=high our streams (and the direct decoder's) are made at a higher priority
than the models' streams: beside a busy device the decoder's few small kernels start ahead of a ResNet-50 batch's
many, so that the decoder which feeds those batches does not queue behind them (beside a device kept 0.6 busy,
nvJPEG decoded at half its idle rate: bench/results/HISTORY.md, run 39).

With CGSERVE_JPEG_NVJPEG=direct (auto's choice for the front door in one process), nvJPEG's hardware decoder is
called without torchvision (app/codecs/nvjpeg.py): a launch thread takes a decoder state, with a stream of its own,
from a pool of DIRECT_STATES, so batches decode at once and none waits on the host for its decode (our stream waits
for its event). The images it does not take (progressive ones) go through torchvision as above.

Where the caller's `out` is a row of an array registered with `pin` (the front door's bulks), the copy out of the
device writes that row itself, a run of consecutive rows one copy (app/codecs/pinned_rows.py); the other rows go
to a pinned block of the batch's. The event loop awaits `done` through an EventWaiter
(a thread sleeping in that one event's synchronize, never the device's), then copies each row of a block into
the caller's `out` or a new (1, C, h, w) array. The batcher sees what Pillow would have given it.
A pinned `out` is written by the device whether or not its future was cancelled meanwhile: `settled()` says when
no batch launched so far can still write one. A batch nvJPEG refuses as a whole (one CMYK or corrupt image fails the
call) is decoded again image by image: those nvJPEG refuses alone answer GpuDecodeError, and
app/codecs/uploads.py hands them to Pillow.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import torch
import torchvision.io

from app.codecs.nvjpeg import UNSUPPORTED, BatchDecoder, NvJpeg, NvJpegError
from app.codecs.pinned_rows import PinnedRows, Place, copy_runs
from app.codecs.preprocess import preprocess_batch
from app.config import JPEG_LAUNCHES, Settings
from app.engines.event_waiter import EventWaiter
from app.errors import GpuDecodeError, NotReadyError
from app.ops import metrics
from app.ops.held_copy import copy_holding_gil
from app.ops.metric_buffers import BufferedHistogram
from app.repository.model_spec import ModelSpec

log = logging.getLogger(__name__)

# The settings' defaults (CGSERVE_JPEG_MAX_BATCH, CGSERVE_JPEG_LAUNCHES: the reasons are there), one source for
# both, for the benches and tests that build a decoder directly: torchvision's decoder, as a server without the
# front door has (CGSERVE_JPEG_NVJPEG=auto).
MAX_BATCH: int = Settings.model_fields["jpeg_max_batch"].default
NVJPEG = "torchvision"
PRIORITY: str = Settings.model_fields["jpeg_stream_priority"].default
# CGSERVE_JPEG_STREAM_PRIORITY → torch.cuda.Stream's priority: lower is sooner. The models' streams are at 0, so
# at -1 the device starts the decoder's kernels ahead of a batch's where both wait for room.
STREAM_PRIORITIES = {"normal": 0, "high": -1}
# Values a group resizes at once: its stack and float copy take 5 bytes a value on the device
# (uint8 + float32), so 2^25 is 168 MB: 59 photos of 500×375, 10 of 1024², where one image
# at a time took 15 MB. Past it a size's images are resized in several groups.
RESIZE_GROUP_VALUES = 1 << 25
RECENT_BATCHES = 1024
# The direct decoder's states, decoding at once at most: beside a busy device three decoded the most photos a second
# (run 61: 19.3k, against 16.3k for two and 18.5k for four). Launch threads past them wait for a free state, so that
# one batch's resize and copies out are queued while three decode.
DIRECT_STATES = 3
READ_MODES = {"RGB": torchvision.io.ImageReadMode.RGB, "L": torchvision.io.ImageReadMode.GRAY}


@dataclass(eq=False)
class _Job:
    data: bytes | bytearray | memoryview
    spec: ModelSpec
    future: asyncio.Future[np.ndarray]
    out: np.ndarray | None  # where the caller wants the (1, C, h, w) pixels written, or None: a new array
    arrived: float = field(default_factory=time.perf_counter)


@dataclass(eq=False)
class _Launched:
    jobs: list[_Job]
    # per job: its row, (C, h, w) uint8, of its group's pinned (g, C, h, w) block; None where nvJPEG refused it
    # or where its pixels are copied straight into its `out` (a pinned row: its index is in `in_out`)
    hosts: list[torch.Tensor | None]
    done: torch.cuda.Event
    started: float  # perf_counter at the launch, for cgserve_gpu_jpeg_batch_seconds
    decode_s: float  # wall time decoding, of the launch's started → launched (cgserve_gpu_jpeg_stage_seconds)
    state_wait_s: float  # of decode_s, the direct decoder's wait for its state's previous batch (0: torchvision's)
    launched: float  # perf_counter once the resizes and copies out were queued
    errors: list[str] = field(default_factory=list)
    # nvJPEG's (C, H_i, W_i) outputs, read by the resize queued on our stream: let go once `done` has completed
    decoded: list[torch.Tensor] = field(default_factory=list)
    in_out: set[int] = field(default_factory=set)  # the jobs whose `out` the device writes (pinned rows)


class GpuJpegDecoder:
    def __init__(
        self,
        device: str,
        *,
        max_batch: int = MAX_BATCH,
        launches: int = 0,
        nvjpeg: str = NVJPEG,
        priority: str = PRIORITY,
        preallocate: tuple[int, int] | None = None,
    ) -> None:
        if max_batch < 1 or launches < 0:
            raise ValueError(f"max_batch must be at least 1 and launches 0 or more; got {max_batch} and {launches}")
        self.device = torch.device(device)
        # nvJPEG's hardware decoder called directly, a pool of states (app/codecs/nvjpeg.py), or None:
        # torchvision's decode_jpeg for every batch.
        self._nvjpeg: NvJpeg | None
        self._direct: queue.SimpleQueue[BatchDecoder] | None
        stream_priority = STREAM_PRIORITIES[priority]
        sized = (max_batch, *preallocate) if preallocate else None
        self._nvjpeg, self._direct = (
            _direct_decoders(
                self.device, min(launches or JPEG_LAUNCHES["direct"], DIRECT_STATES), stream_priority, sized
            )
            if nvjpeg == "direct"
            else (None, None)
        )
        self.nvjpeg = "direct" if self._direct is not None else "torchvision"
        # 0: the count for the decoder started, torchvision's where direct was asked for and this GPU has no engines
        self.launches = launches or JPEG_LAUNCHES[self.nvjpeg]
        self.max_batch = max_batch
        # The latest launched batches' sizes, for tests (bounded: a server launches batches for ever);
        # the running totals, for the benchmark's mean batch.
        self.batch_sizes: deque[int] = deque(maxlen=RECENT_BATCHES)
        self.batches_launched = self.images_launched = 0
        self.images_in_place = 0  # those whose pixels the device wrote straight into their pinned `out`
        self._stream = torch.cuda.Stream(self.device, priority=stream_priority)  # resizes and copies out
        # nvJPEG's outputs are allocated under it (above)
        self._decode_stream = torch.cuda.Stream(self.device, priority=stream_priority)
        self._worker = ThreadPoolExecutor(max_workers=self.launches, thread_name_prefix="gpu-jpeg")
        self._launch_slots = asyncio.Semaphore(self.launches)
        self._waiter = EventWaiter("gpu-jpeg-event-waiter")
        self._pending: list[_Job] = []
        self._pinned = PinnedRows()  # the callers' arrays whose rows the device writes directly
        self._pinned_abandoned = False  # abandon_pinned(): close() leaves them, and waits for nothing
        # One a batch, from its collection until no copy of it can write an `out` any more (settled()).
        self._unsettled: set[asyncio.Future[None]] = set()
        self._arrived = asyncio.Event()
        self._collector: asyncio.Task[None] | None = None
        self._batches: set[asyncio.Task[None]] = set()  # launching or handing back (asyncio keeps weak references)
        # Called soon each time every upload given is in a launch (app/codecs/uploads.py's PacedDecoder): the front
        # door's feeder takes its next bulk of JPEGs then.
        self.on_caught_up: Callable[[], None] | None = None

    def backlog(self) -> int:
        """Uploads given to `decode` and not yet taken into a launch."""
        return len(self._pending)

    def pin(self, rows: np.ndarray) -> bool:
        """Register `rows`, a C-contiguous (n, C, h, w) uint8 array whose rows will be given as `out`, for the device
        to write them directly; False (logged) where CUDA refused. It stays registered until `unpin` or `close`."""
        index = self.device.index if self.device.index is not None else torch.cuda.current_device()
        return self._pinned.pin(rows, index)

    def unpin(self, rows: np.ndarray) -> None:
        """Unregister `rows`, once `settled()`: no copy writes them any more."""
        self._pinned.unpin(rows)

    def abandon_pinned(self) -> None:
        """Leave every pinned array registered, and `close` wait for neither the launches nor the stream: a batch
        outlasted the caller's wait for it (a device that does not answer), and the process is ending."""
        self._pinned_abandoned = True

    async def settled(self) -> None:
        """Once every batch launched so far is done with its `out`s: a pinned row given to a decode since cancelled
        may still be written until then."""
        if self._unsettled:
            await asyncio.wait(list(self._unsettled))

    def decode(
        self, data: bytes | bytearray | memoryview, spec: ModelSpec, out: np.ndarray | None = None
    ) -> asyncio.Future[np.ndarray]:
        """A JPEG → the future of its (1, C, h, w) uint8 pixels per the spec's [preprocess]; GpuDecodeError
        if nvJPEG refused it. A future, not a coroutine: the engine process answers from its callback,
        with no task an upload. Cancelled, its `out` is not written by the hand-back; a pinned `out` whose batch
        was launched is still written by the device (`settled()` says when that is over).

        `data` is read until the decode is launched (and held until the future is done); a bytearray or
        writable memoryview is read in place (an inline body, the worker's segment in the engine process),
        bytes are copied once. `out`, a (1, C, h, w) uint8 array, receives the pixels and is the result (it
        may share `data`'s memory: it is written after the decode has read it); without it a new array is."""
        if self._collector is None or self._collector.done():  # first upload (or a collector that died)
            self._collector = asyncio.create_task(self._collect(), name="gpu-jpeg-collector")
        future: asyncio.Future[np.ndarray] = asyncio.get_running_loop().create_future()
        self._pending.append(_Job(data, spec, future, out))
        self._arrived.set()
        return future

    def close(self) -> None:
        """Stop. Uploads queued or in a batch not yet handed back get 503 (the server is stopping); a
        launch already on its thread finishes first, and the device's copies into pinned rows (after
        abandon_pinned, nothing is waited for: a launch may still be on its thread, with its state)."""
        if self._collector is not None:
            self._collector.cancel()
        _fail(self._pending, _closed())
        self._pending.clear()
        for task in self._batches:  # each fails its own uploads when its cancellation reaches it
            task.cancel()
        waits = not self._pinned_abandoned
        self._worker.shutdown(wait=waits, cancel_futures=True)
        if self._pinned and waits:  # what the launches queued, copies into pinned rows among it, is done first
            with torch.cuda.device(self.device):
                self._stream.synchronize()
            self._pinned.close()
        for settled in self._unsettled:
            settled.set_result(None)
        self._unsettled.clear()
        self._waiter.close()
        if self._nvjpeg is not None and waits:  # every launch has returned its state: destroy them, then the handle
            self._nvjpeg.close()
            self._nvjpeg = self._direct = None

    async def _collect(self) -> None:
        # An observation an upload: buffered on the loop (app/ops/metric_buffers.py), made here, on it.
        waits = BufferedHistogram(metrics.GPU_JPEG_WAIT)
        try:
            while True:
                await self._arrived.wait()
                self._arrived.clear()
                while self._pending:
                    await self._launch_slots.acquire()  # taken here, given back once its batch is launched
                    jobs = [job for job in self._pending[: self.max_batch] if not job.future.done()]
                    del self._pending[: self.max_batch]
                    if not self._pending and self.on_caught_up is not None:
                        asyncio.get_running_loop().call_soon(self.on_caught_up)
                    if not jobs:  # all cancelled (their deadline passed while queued)
                        self._launch_slots.release()
                        continue
                    now = time.perf_counter()
                    for job in jobs:
                        waits.observe(now - job.arrived)
                    settled = asyncio.get_running_loop().create_future()  # from now on a copy may write an `out`
                    self._unsettled.add(settled)
                    task = asyncio.create_task(self._launch_and_hand_back(jobs, settled))
                    self._batches.add(task)
                    task.add_done_callback(self._batches.discard)
        finally:
            waits.flush()  # what it holds when the decoder closes

    async def _launch_and_hand_back(self, jobs: list[_Job], settled: asyncio.Future[None]) -> None:
        try:
            try:
                launched = await asyncio.get_running_loop().run_in_executor(self._worker, self._launch, jobs)
            except Exception as error:  # not nvJPEG's refusal (that is per job): a fault, 500
                log.exception("GPU JPEG batch of %d failed", len(jobs))
                _fail(jobs, error)
                return
            finally:
                self._launch_slots.release()
            self.batch_sizes.append(len(jobs))
            self.batches_launched += 1
            self.images_launched += len(jobs)
            metrics.GPU_JPEG_BATCH_IMAGES.observe(len(jobs))
            await self._hand_back(launched)
        except asyncio.CancelledError:  # close(): nobody will hand these back
            _fail(jobs, _closed())
            raise
        finally:  # its launch returned (or raised, its stream synchronized) and `done` completed: or close() did
            if not settled.done():
                settled.set_result(None)
            self._unsettled.discard(settled)

    def _launch(self, jobs: list[_Job]) -> _Launched:
        """On the worker thread: decode, resize and start the copies out; returns before they finish (or, raising,
        once what it queued has: a copy into a pinned `out` then writes no more)."""
        started = time.perf_counter()
        hosts: list[torch.Tensor | None] = [None] * len(jobs)
        in_out: set[int] = set()
        errors: list[str] = []
        kept: list[torch.Tensor] = []
        decode_s = 0.0
        state_waits: list[float] = []  # the direct decoder's, a batch a colour
        with torch.cuda.device(self.device), torch.cuda.stream(self._stream):
            try:
                for color, indices in _by_color(jobs).items():
                    decode_started = time.perf_counter()
                    # [(job index, (C, H_i, W_i) uint8 on the GPU)]
                    decoded = self._decode(jobs, indices, color, errors, state_waits)
                    decode_s += time.perf_counter() - decode_started
                    kept.extend(image for _, image in decoded)
                    for spec, group in _by_model_and_size(jobs, decoded):
                        # Photos from one camera or one client share a size: one resize for all of them.
                        images = torch.stack([image for _, image in group])  # (k, C, H, W) uint8
                        pixels = preprocess_batch(images, spec)  # (k, C, h, w) uint8 on the GPU
                        self._copy_out(jobs, group, pixels, hosts, in_out)
                done = torch.cuda.Event(blocking=True)  # its waiter thread sleeps instead of spinning a core
                done.record(self._stream)
            except BaseException:
                if self._pinned:  # a copy into a pinned `out` may be queued: done before its caller hears
                    self._stream.synchronize()
                raise
        return _Launched(jobs, hosts, done, started, decode_s, sum(state_waits), time.perf_counter(), errors, kept,
                         in_out)  # fmt: skip

    def _copy_out(self, jobs: list[_Job], group: list[tuple[int, torch.Tensor]], pixels: torch.Tensor,
                  hosts: list[torch.Tensor | None], in_out: set[int]) -> None:  # fmt: skip
        """Queue a group's (k, C, h, w) pixels' copies out: straight into the pinned `out`s, a run of consecutive rows
        a copy, and the others' into one pinned block of the group's."""
        placed: list[tuple[int, Place]] = []  # (group row, where its `out` is pinned)
        others: list[int] = []
        # None where none is pinned (no front door here, or jpeg_pinned_rows off): no look an image then.
        find = self._pinned.place if self._pinned else None
        for row, (i, _) in enumerate(group):
            out = jobs[i].out
            place = find(out) if find is not None and out is not None else None
            if place is not None and place.region.rows.shape[1:] == pixels.shape[1:]:
                placed.append((row, place))
                in_out.add(i)
            else:
                others.append(row)
        for region, first, source, n in copy_runs(placed):
            region.rows[first : first + n].copy_(pixels[source : source + n], non_blocking=True)
        if others:
            host = torch.empty(pixels.shape, dtype=torch.uint8, pin_memory=True)
            host.copy_(pixels, non_blocking=True)  # one copy out for the group
            for row in others:
                hosts[group[row][0]] = host[row]

    def _decode(
        self, jobs: list[_Job], indices: list[int], color: str, errors: list[str], state_waits: list[float]
    ) -> list[tuple[int, torch.Tensor]]:
        """(job index, (C, H, W) uint8 on the GPU) for each image nvJPEG decodes; its refusals in `errors`, and the
        direct decoder's wait for its state's previous batch in `state_waits`. Ordered before what is queued next on
        our stream."""
        if self._direct is None:
            return self._decode_torchvision(jobs, indices, color, errors)
        buffers = [_writable(jobs[i].data) for i in indices]
        for i, buffer in zip(indices, buffers, strict=True):  # nvJPEG may read them until `done`: each held by
            jobs[i].data = buffer  # its job until the hand-back
        waiting = time.perf_counter()
        decoder = self._direct.get()  # waits while every state decodes (more launch threads than DIRECT_STATES)
        free = time.perf_counter() - waiting
        try:
            try:
                images, done = decoder.decode(buffers, gray=color == "L")
                state_waits.append(free + decoder.waited_s)  # read before the state goes back to the pool
            except RuntimeError:  # NvJpegError (a corrupt image, say), the device's memory: torchvision's way for it
                log.debug("nvJPEG's hardware decoder refused a batch of %d; torchvision decodes it", len(indices))
                return self._decode_torchvision(jobs, indices, color, errors)
        finally:
            self._direct.put(decoder)
        self._stream.wait_event(done)
        decoded, others = [], []
        for i, image in zip(indices, images, strict=True):
            if isinstance(image, torch.Tensor):
                decoded.append((i, image))  # a view of the batch's block: held by the batch until `done` (above)
            elif image == UNSUPPORTED:  # progressive and such: torchvision decodes them (on the GPU, not by hardware)
                others.append(i)
            else:  # its header did not parse: Pillow will say what is wrong with it
                errors.append(image)
        return decoded + (self._decode_torchvision(jobs, others, color, errors) if others else [])

    def _decode_torchvision(
        self, jobs: list[_Job], indices: list[int], color: str, errors: list[str]
    ) -> list[tuple[int, torch.Tensor]]:
        """_decode through torchvision's decode_jpeg: one batch at a time in the process, behind its lock."""
        encoded = [torch.frombuffer(_writable(jobs[i].data), dtype=torch.uint8) for i in indices]
        try:
            with torch.cuda.stream(self._decode_stream):
                decoded = torchvision.io.decode_jpeg(encoded, mode=READ_MODES[color], device=self.device)
        except RuntimeError as error:  # nvJPEG refused one of them, and so the whole call
            if len(indices) == 1:
                errors.append(str(error))
                return []
            # One at a time, so that one bad upload sends only itself to Pillow, not its batch-mates.
            return [pair for i in indices for pair in self._decode_torchvision(jobs, [i], color, errors)]
        self._stream.wait_stream(self._decode_stream)  # which waits for torchvision's decoder stream
        return list(zip(indices, decoded, strict=True))  # held by the batch until `done` (above)

    async def _hand_back(self, launched: _Launched) -> None:
        try:
            await self._waiter.completion(launched.done)
        except Exception as error:  # a CUDA error: every request of the batch gets it (500)
            _fail(launched.jobs, error)
            return
        launched.decoded.clear()  # the resize has read them: their memory may go to the next decode
        self.images_in_place += len(launched.in_out)
        completed = time.perf_counter()
        metrics.GPU_JPEG_BATCH_SECONDS.observe(completed - launched.started)
        refused = "; ".join(launched.errors)
        for i, (job, host) in enumerate(zip(launched.jobs, launched.hosts, strict=True)):
            if job.future.done():  # cancelled meanwhile: nothing is copied into its `out` (the worker may be gone)
                continue
            if i in launched.in_out:  # the device wrote it
                job.future.set_result(job.out)  # type: ignore[arg-type]
                continue
            if host is None:
                job.future.set_exception(GpuDecodeError(refused or "nvJPEG did not decode this image"))
                continue
            try:
                if job.out is not None:  # the caller's buffer: in the engine process, its UPLOADS frame's row
                    copy_holding_gil(job.out, host.numpy()[None])  # a copy a photo: app/ops/held_copy.py
                    job.future.set_result(job.out)
                else:  # a copy: the group's pinned block goes back to torch's host cache once its last row is let go
                    job.future.set_result(np.array(host.numpy())[None])  # (1, C, h, w)
            except Exception as error:  # an `out` of another shape: this upload's 500, not its batch-mates' hang
                job.future.set_exception(error)
        _observe_stages(launched, completed)


# cgserve_gpu_jpeg_stage_seconds's children, looked up once rather than per batch
_STATE_WAIT, _DECODE, _PREPARE, _DEVICE, _HAND_BACK = (
    metrics.GPU_JPEG_STAGE.labels(stage) for stage in ("state_wait", "decode", "prepare", "device", "hand_back")
)


def _observe_stages(launched: _Launched, completed: float) -> None:
    """Where one batch's time went (cgserve_gpu_jpeg_stage_seconds): five observations a batch, not an upload."""
    _STATE_WAIT.observe(launched.state_wait_s)
    _DECODE.observe(launched.decode_s - launched.state_wait_s)
    _PREPARE.observe(launched.launched - launched.started - launched.decode_s)
    _DEVICE.observe(completed - launched.launched)
    _HAND_BACK.observe(time.perf_counter() - completed)


def _direct_decoders(
    device: torch.device, states: int, priority: int, preallocate: tuple[int, int, int] | None = None
) -> tuple[NvJpeg, queue.SimpleQueue[BatchDecoder]] | tuple[None, None]:
    """nvJPEG's hardware backend and a pool of `states` decoder states for the launch threads (each's stream at
    `priority`, its buffers sized now for `preallocate`'s (batch, width, height) where given), or (None, None)
    (logged: why) where this GPU or library has none. ValueError where the states cannot be sized as asked: the operator
    asked for it, and a server quietly decoding otherwise is what they would not see. The states share one
    handle: a handle each decoded no faster (run 61)."""
    nvjpeg: NvJpeg | None = None
    pool: queue.SimpleQueue[BatchDecoder] = queue.SimpleQueue()
    try:
        with torch.cuda.device(device):  # a handle and its states belong to the device current when made
            nvjpeg = NvJpeg()
            for _ in range(states):
                pool.put(nvjpeg.decoder(device, priority))
    except (NvJpegError, OSError, AttributeError) as error:  # no hardware decoder, no library, an old library
        log.info("JPEG uploads: nvJPEG's hardware decoder is not available here (%s); torchvision's decoder", error)
        if nvjpeg is not None:
            nvjpeg.close()
        return None, None
    if preallocate is not None:
        batch, width, height = preallocate
        try:
            with torch.cuda.device(device):
                for _ in range(states):  # each state once: taken from the pool and put back
                    decoder = pool.get()
                    decoder.preallocate(batch, width, height)
                    pool.put(decoder)
        except NvJpegError as error:  # the device's memory, or a library without the call
            nvjpeg.close()
            raise ValueError(
                f"CGSERVE_JPEG_PREALLOCATE={width}x{height}: nvJPEG could not size its {states} decoder states "
                f"for {batch} photos that large ({error}); set 0 to let them grow as batches come, or a smaller "
                "size where the device's memory ran short"
            ) from error
    return nvjpeg, pool


def _writable(data: bytes | bytearray | memoryview) -> bytearray | memoryview:
    """What torch.frombuffer takes without a warning: a writable buffer, `data` itself where it is one."""
    if isinstance(data, bytearray) or (isinstance(data, memoryview) and not data.readonly):
        return data
    return bytearray(data)


def _by_color(jobs: list[_Job]) -> dict[str, list[int]]:
    """Job indices by the colour their model wants: one decode_jpeg call each (its mode is per call)."""
    groups: dict[str, list[int]] = {}
    for i, job in enumerate(jobs):
        groups.setdefault(job.spec.config.color, []).append(i)
    return groups


def _by_model_and_size(
    jobs: list[_Job], decoded: list[tuple[int, torch.Tensor]], *, max_values: int = RESIZE_GROUP_VALUES
) -> list[tuple[ModelSpec, list[tuple[int, torch.Tensor]]]]:
    """Decoded images by (model, decoded size), each group resized together as one (k, C, H, W) batch of
    at most `max_values` values (one image at least)."""
    open_groups: dict[tuple[int, tuple[int, ...]], list[tuple[int, torch.Tensor]]] = {}
    groups: list[tuple[ModelSpec, list[tuple[int, torch.Tensor]]]] = []
    for i, image in decoded:
        spec, key = jobs[i].spec, (id(jobs[i].spec), tuple(image.shape))
        group = open_groups.get(key)
        if group is None or (len(group) + 1) * image.numel() > max_values:
            group = open_groups[key] = []
            groups.append((spec, group))
        group.append((i, image))
    return groups


def _closed() -> NotReadyError:
    return NotReadyError("the GPU JPEG decoder has closed: the server is stopping")


def _fail(jobs: list[_Job], error: BaseException) -> None:
    for job in jobs:
        if not job.future.done():
            job.future.set_exception(error)
