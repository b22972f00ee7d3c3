"""The engine process: the service's engines and batchers, served to the HTTP workers on a socket.

It runs the same Service as a single-process server (models, engines, one batcher per model,
readiness, metrics into the shared Prometheus folder), without HTTP. Each worker holds one
connection; every INFER frame (one or many of the worker's requests, app/engine_process/client.py)
becomes one batcher.enqueue on a view of the worker's segment (zero copy until the batch is
staged), answered by a RESULT frame from the answer's callback: no task a frame, since this one
event loop's time a frame is the whole service's ceiling. Where the GPU decodes JPEGs (nvJPEG,
app/codecs/gpu_jpeg.py) its decoder is here too: a worker's JPEG upload comes as an UPLOADS frame,
is decoded and inferred here, and its scores go back as any request's (one trip, not two).

Model control (app/model_control.py) runs here too, where the models are built and freed: a worker
forwards a repository call as a CONTROL frame; every change (a load, an unload, a poll's) is sent to
every worker as a MODELS frame before the call is answered. Frames name a served (model, version) by
an id that is never reused, so a frame for a version replaced meanwhile still reaches it while it
answers what it admitted, and one for a version freed since gets a clear 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import itertools
import logging
import mmap
import os
import signal
from collections.abc import Callable, Coroutine
from typing import Any, cast

import numpy as np
import orjson

from app.batching.batcher import Batcher
from app.codecs.uploads import JpegBatchDecoder
from app.config import Settings
from app.engine_process import SOCKET_ENV, frames
from app.engine_process.segments import map_file
from app.errors import GpuDecodeError, NotReadyError, ServiceError
from app.front_door.server import attach as attach_front_door
from app.model_control import ModelControl
from app.ops import daemon_thread, tracing
from app.ops.loop_lag import GcPauses, sample_loop_lag
from app.service import ServedModel, Service

log = logging.getLogger(__name__)
STOP_SIGNAL = signal.SIGUSR1
APPLY_TIMEOUT_S = 30.0  # for every worker to apply a table (its specs come in it: they read no files)


class EngineHost:
    """The engine process's service, its model control, and the workers' connections: the table of
    served (model, version)s by id, sent to every worker whenever it changes."""

    def __init__(self, service: Service) -> None:
        self.service = service
        service.counts_admissions = False  # the workers admit this process's requests
        self.control = ModelControl(service)
        self.connections: set[WorkerConnection] = set()  # those that said HELLO
        self.by_id: dict[int, ServedModel] = {}
        self.generation = 0  # of the table: one more at each change
        self._applied = asyncio.Condition()  # a worker said it serves a newer table
        self._ids: dict[ServedModel, int] = {}
        self._next_id = itertools.count(1)
        service.on_install.append(lambda name: self.broadcast())

    def served(self, model_id: int) -> ServedModel:
        served = self.by_id.get(model_id)
        if served is None:
            raise NotReadyError("that model version was unloaded and freed; calls naming no version get the newest")
        return served

    def table(self) -> dict[str, Any]:
        """MODELS: every served (model, version) with its id, engine, devices and queue limit."""
        models: dict[str, dict[str, Any]] = {}
        for name, versions in self.service.versions.items():
            for version, served in versions.items():
                if served not in self._ids:
                    self._ids[served] = next(self._next_id)
                    self.by_id[self._ids[served]] = served
                models.setdefault(name, {})[version] = {
                    "id": self._ids[served], "engine": served.engines[0].name if served.engines else "",
                    "devices": list(served.options.devices), "queue_limit": self.service.settings.queue_limit,
                    "spec": served.spec.to_wire(),
                }  # fmt: skip
        # A version freed (retired and its batcher gone) is no frame's any more: forget its id.
        for served in [served for served in self._ids if served.retired]:
            self.by_id.pop(self._ids.pop(served))
        return {
            "models": models, "jpeg_decoder": self.service.jpeg_decoder is not None, "generation": self.generation,
            # POST /predict's model as this process decided it: a worker started later takes it, not its own
            "default": self.service.default_name, "default_decided": self.service.default_decided,
        }  # fmt: skip

    def broadcast(self) -> None:
        """The new table to every worker, now: the control call that changed it is answered once every
        worker serves it (`applied`), so that a load answered 200 is what any worker serves next."""
        self.generation += 1
        payload = frames.json_frame(frames.MODELS, self.table())
        for connection in self.connections:
            if not connection.writer.is_closing():
                connection.writer.write(payload)

    async def applied(self, timeout_s: float = APPLY_TIMEOUT_S) -> None:
        """Until every connected worker serves the latest table (or has gone); a worker that does not
        say so within `timeout_s` is logged, not waited for forever."""
        generation = self.generation

        def everyone() -> bool:
            return all(c.applied >= generation or c.writer.is_closing() for c in self.connections)

        try:
            async with self._applied, asyncio.timeout(timeout_s):
                await self._applied.wait_for(everyone)
        except TimeoutError:
            log.warning("a worker did not apply model table %d within %g s", generation, timeout_s)

    async def note_applied(self, connection: WorkerConnection, generation: int) -> None:
        connection.applied = max(connection.applied, generation)
        await self._wake()

    async def left(self, connection: WorkerConnection) -> None:
        """A worker is gone: a control call waiting for its APPLIED waits no more."""
        self.connections.discard(connection)
        await self._wake()

    async def _wake(self) -> None:
        async with self._applied:
            self._applied.notify_all()


class WorkerConnection:
    """One HTTP worker's socket: its segments and its requests in flight."""

    def __init__(self, host: EngineHost, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.host, self.service, self.reader, self.writer = host, host.service, reader, writer
        self.segments: dict[int, mmap.mmap] = {}
        self.waiting: set[asyncio.Future[np.ndarray]] = set()  # INFER and UPLOADS frames' answers and decodes
        self.tasks: set[asyncio.Task[None]] = set()  # control calls
        self.applied = 0  # the generation of the latest table this worker said it serves

    async def run(self) -> None:
        try:
            while True:
                kind, payload = await frames.read_frame(self.reader)
                if kind == frames.INFER:
                    self.infer(payload)
                elif kind == frames.UPLOADS:
                    self.uploads(payload)
                elif kind == frames.CONTROL:
                    task = asyncio.create_task(self.control(payload))
                    self.tasks.add(task)
                    task.add_done_callback(self.tasks.discard)
                elif kind == frames.SEGMENT:
                    fields = orjson.loads(payload)
                    self.segments[fields["index"]] = map_file(fields["path"], fields["size"], create=False)
                elif kind == frames.HELLO:
                    await self.hello()
                elif kind == frames.APPLIED:
                    await self.host.note_applied(self, orjson.loads(payload)["generation"])
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the worker is gone: its requests' answers have nobody to go to
        finally:
            await self.host.left(self)
            for future in self.waiting:
                future.cancel()  # the batcher drops the rows it has not launched; the decoder, its uploads
            for task in self.tasks:
                task.cancel()  # a load it asked for goes on: it is the control's own task
            self.writer.close()
            for memory in self.segments.values():
                with contextlib.suppress(BufferError):  # a view still queued: the mapping goes with it
                    memory.close()

    async def hello(self) -> None:
        """Answer once start-up is over: the models, or why start-up failed."""
        await self.service.wait_started()
        if self.service.failure is not None:
            self.writer.write(frames.json_frame(frames.MODELS, {"failure": self.service.failure}))
            return
        table = self.host.table()
        self.writer.write(frames.json_frame(frames.MODELS, table))
        self.applied = table["generation"]  # the worker serves it before it serves anything
        self.host.connections.add(self)

    async def control(self, payload: bytes) -> None:
        """A worker's model control call, made here; its answer after the MODELS frame of its change."""
        call = orjson.loads(payload)
        answer: dict[str, Any] = {"id": call["id"]}
        try:
            if call["op"] == "index":
                answer["index"] = await self.host.control.index(ready_only=bool(call.get("ready")))
            elif call["op"] == "load":
                await self.host.control.load(call["name"])
            elif call["op"] == "unload":
                await self.host.control.unload(call["name"])
            else:
                raise ServiceError(f"unknown model control call {call['op']!r}")
            await self.host.applied()  # every worker serves what the call changed
        except Exception as error:
            if not isinstance(error, ServiceError):
                log.error("unexpected error in a model control call", exc_info=error)
                error = ServiceError("unexpected server error; it is logged with its traceback")
            answer["error"] = frames.error_fields(error)
        if not self.writer.is_closing():
            self.writer.write(frames.json_frame(frames.CONTROLLED, answer))

    def uploads(self, payload: bytes) -> None:
        """A frame of JPEGs (one request's or several's), decoded on this process's GPU and inferred here:
        one trip a request, where decoding in one frame and inferring in the next would take two.
        Each image goes to the decoder as a view of the worker's segment (read when its decode is
        launched; the worker keeps the segment until RESULT), its pixels written into its row of one
        (k, C, h, w) array, which is enqueued as an INFER frame's rows once the last is decoded. No
        task: the decoder's futures and the batcher's answer by callback."""
        frame_id, deadline, model, k, segment = frames.UPLOADS_HEADER.unpack_from(payload)
        served = self.host.by_id.get(model)
        try:
            if served is None:
                served = self.host.served(model)  # NotReadyError: freed since the worker's table
            # This process's own decoder (a DeferringDecoder is a worker's), which HELLO said there is.
            decoder = cast(JpegBatchDecoder | None, self.service.jpeg_decoder)
            if decoder is None:
                raise ServiceError("this engine process has no GPU JPEG decoder")
            if k == 0:
                raise ServiceError("an UPLOADS frame of no images")
            batcher = served.ready_batcher()
            batcher.admit(deadline)  # as for INFER: refused before its images are decoded
            memory = memoryview(self.segments[segment])
            images = np.empty((k, *served.spec.input_shape), np.uint8)  # (k, C, h, w): the frame's rows
            lengths = frames.upload_lengths(k).unpack_from(payload, frames.UPLOADS_HEADER.size)
            decodes: list[asyncio.Future[np.ndarray]] = []
            start = 0
            for row, length in enumerate(lengths):
                data, start = memory[start : start + length], start + length
                # The GPU decoder answers a future (no task); a decoder whose decode is a coroutine gets one.
                decodes.append(asyncio.ensure_future(decoder.decode(data, served.spec, out=images[row : row + 1])))
        except Exception as error:
            self.answer(frame_id, served, error=error)
            return
        left = len(decodes)

        def decoded(future: asyncio.Future[np.ndarray]) -> None:
            nonlocal left
            self.waiting.discard(future)
            left -= 1
            if left == 0:
                self.infer_decoded(frame_id, served, deadline, images, decodes)

        for future in decodes:
            self.waiting.add(future)  # cancelled if the worker goes: the decoder then skips it
            future.add_done_callback(decoded)

    def infer_decoded(self, frame_id: int, served: ServedModel, deadline: float, images: np.ndarray,
                      decodes: list[asyncio.Future[np.ndarray]]) -> None:  # fmt: skip
        """A frame's images decoded into `images`, (k, C, h, w): the rows nvJPEG decoded to the batcher. The
        images it refused are answered as such, each (PARTLY_REFUSED), or the frame's as a whole where it
        refused them all (REFUSED): the worker decodes those requests with Pillow, as in-process, and one
        bad upload costs its frame-mates nothing."""
        if any(future.cancelled() for future in decodes) or self.writer.is_closing():
            return  # the worker is gone: nobody to answer
        errors = [future.exception() for future in decodes]
        refused = [isinstance(e, GpuDecodeError) for e in errors]
        error = next((e for e in errors if e is not None and not isinstance(e, GpuDecodeError)), None)
        if error is None and all(refused):
            error = errors[0]  # REFUSED: nothing to infer
        if error is None:
            try:
                for row, future in enumerate(decodes):
                    if not refused[row] and (pixels := future.result()).base is not images:
                        images[row : row + 1] = pixels  # a decoder that gave its own array: into its row
                rows = images[[not r for r in refused]] if any(refused) else images  # (decoded, C, h, w)
                # Its batcher again: the version may have retired while the frame was decoded (its batcher
                # stopped, where an enqueue would never be answered): NotReadyError, as for INFER.
                future = served.ready_batcher().enqueue(rows, deadline)
            except Exception as failure:  # pixels of another shape, the queue full meanwhile: this frame's answer
                error = failure
        if error is not None:
            self.answer(frame_id, served, error=error)
            return
        self.waiting.add(future)
        flags = refused if any(refused) else None
        future.add_done_callback(lambda done: self.answered(frame_id, served, done, flags))

    def infer(self, payload: bytes) -> None:
        """Enqueue a frame's rows; answer it now if refused, else from its future's callback."""
        frame_id, deadline, dtype, model, k, c, h, w, segment = frames.INFER_HEADER.unpack(payload)
        served = self.host.by_id.get(model)
        try:
            if served is None:
                served = self.host.served(model)  # NotReadyError: freed since the worker's table
            if (c, h, w) != tuple(served.spec.input_shape):  # the worker read other files: not this batch's rows
                raise ServiceError(
                    f"{served.spec.name}: a worker sent {c}×{h}×{w} images for a model built for "
                    f"{'×'.join(map(str, served.spec.input_shape))}: its files changed since they were loaded",
                    expected="load the model again (model control), so that every process reads the same files",
                )
            batcher = served.ready_batcher()
            batcher.admit(deadline)  # the worker admitted on figures one answer old: check again
            images = np.ndarray((k, c, h, w), frames.DTYPES[dtype], buffer=self.segments[segment])
            future = batcher.enqueue(images, deadline)
        except Exception as error:
            self.answer(frame_id, served, error=error)
            return
        self.waiting.add(future)
        future.add_done_callback(lambda done: self.answered(frame_id, served, done))

    def answered(self, frame_id: int, served: ServedModel, future: asyncio.Future[np.ndarray],
                 refused: list[bool] | None = None) -> None:  # fmt: skip
        self.waiting.discard(future)
        if future.cancelled():
            return  # the worker is gone (run() cancelled it): nobody to answer
        error = future.exception()
        self.answer(frame_id, served, scores=future.result() if error is None else None, error=error, refused=refused)

    def answer(self, frame_id: int, served: ServedModel | None, *, scores: np.ndarray | None = None,
               error: BaseException | None = None, refused: list[bool] | None = None) -> None:  # fmt: skip
        """Write the RESULT frame: the (rows, classes) float32 scores as they are (with the flags of the
        frame's images nvJPEG `refused` first, where it refused some), nvJPEG's refusal of every upload
        (the worker's Pillow decodes them, as in-process), or the error's JSON."""
        body: bytes | memoryview
        rows = classes = 0
        if scores is not None and refused is not None:
            (rows, classes), outcome = scores.shape, frames.PARTLY_REFUSED
            flags = bytearray(frames.refusal_flags_size(len(refused)))
            flags[: len(refused)] = bytes(refused)
            body = bytes(flags) + scores.tobytes()  # a rare answer: one copy of its scores is nothing
        elif scores is not None:
            (rows, classes), outcome, body = scores.shape, frames.ANSWERED, scores.data.cast("B")
        elif isinstance(error, GpuDecodeError):
            outcome, body = frames.REFUSED, b""
        else:
            if not isinstance(error, ServiceError):
                log.error("unexpected error in the engine process", exc_info=error)
                error = ServiceError("unexpected server error; it is logged with its traceback")
            outcome, body = frames.FAILED, frames.error_payload(error)
        # The queue's figures ride on every answer, a refusal's too: the workers admit with them.
        batcher = served.batcher if served is not None else None
        queued, rate = (batcher.queued_rows, batcher.rows_per_s) if isinstance(batcher, Batcher) else (0, 0.0)
        header = frames.RESULT_HEADER.pack(frame_id, outcome, rows, classes, queued, rate)
        # No drain: the worker reads its answers as they come, and one that stops reading is gone
        # (its connection closes, run() ends). The transport buffers what the socket cannot take yet.
        # One writelines, not two writes: uvloop sends each write at once where nothing waits in the socket's
        # queue (a syscall each); its writelines sends both in one writev, the scores uncopied. No empty body
        # in it: Python 3.12's own transport would keep an empty buffer queued and spin its write handler.
        if not self.writer.is_closing():
            head = frames.PREFIX.pack(frames.RESULT, len(header) + len(body)) + header
            if body:
                self.writer.writelines((head, body))
            else:  # REFUSED
                self.writer.write(head)


async def serve_engines(settings: Settings, socket_path: str, on_ready: Callable[[], None],
                        on_fatal: Callable[[], None]) -> None:  # fmt: skip
    """Build the engines and answer the workers until STOP_SIGNAL (or the parent process is gone)."""
    # The GPU's JPEG decoder lives here, with the GPU: the workers send it their uploads (UPLOADS).
    service = Service(settings, on_fatal=on_fatal, on_ready=on_ready)
    host = EngineHost(service)
    attach_front_door(service)  # where front_door_port is set: the workers' requests and its meet one batcher
    service.start()
    host.control.start()

    async def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await WorkerConnection(host, reader, writer).run()

    server = await asyncio.start_unix_server(connected, path=socket_path)
    # This one loop batches every worker's requests: its lag is theirs (the workers sample their own),
    # and its collections are told apart from it (a retired model's memory is freed by a full one).
    gc_pauses = GcPauses(process="engines")
    gc_pauses.install()
    lag_sampler = asyncio.create_task(sample_loop_lag(gc_pauses, process="engines"), name="loop-lag")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(STOP_SIGNAL, stop.set)
    parent = os.getppid()
    try:
        while not stop.is_set() and os.getppid() == parent:  # an orphan (its server killed) stops too
            try:
                async with asyncio.timeout(1.0):
                    await stop.wait()
            except TimeoutError:
                pass
    finally:
        lag_sampler.cancel()
        gc_pauses.remove()
        server.close()
        await host.control.stop()
        await service.stop()
        await asyncio.to_thread(tracing.flush)  # the last batches' spans


PROCESS_NAME = "cgserve-engines"  # what top, ps -o comm and /proc/<pid>/comm show (15 bytes at most)


def name_this_process(name: str) -> None:
    """Tell the engine process apart from the workers (all `python3 -c … spawn_main`) in top and ps."""
    with contextlib.suppress(OSError, AttributeError):  # Linux's prctl(PR_SET_NAME); elsewhere, nothing
        ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)


def engine_process_main(on_ready: Callable[[], None], on_fatal: Callable[[], None]) -> None:
    """The process's entry (spawned by app/runtime/workers.py, which exported the settings as CGSERVE_*)."""
    from app.config import get_settings

    settings = get_settings()
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    name_this_process(PROCESS_NAME)
    # Ctrl-C and a SIGTERM to the process group reach it with the workers, which still drain through
    # it: only the parent's STOP_SIGNAL, sent after the last worker has exited, stops it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        run_loop(serve_engines(settings, os.environ[SOCKET_ENV], on_ready, on_fatal))
    except BaseException:
        daemon_thread.leave_now_if_unfinished(log, failed=True)
        raise
    daemon_thread.leave_now_if_unfinished(log)  # a load's factory still reading its model: neither waited for nor cut


def run_loop(main: Coroutine[Any, Any, None]) -> None:
    """uvloop where installed, as the workers run (uvicorn's loop "auto"): this one loop reads every
    worker's frames, and on uvloop it spends less CPU a request (bench/engine_link_bench.py --host-loop).
    As in the workers, its timers then have uvloop's 1 ms resolution (the batchers' windows below a
    millisecond end at once), and it gives the GIL up around its poll and takes it back in every callback."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
    else:
        uvloop.run(main)
