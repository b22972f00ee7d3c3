"""The engine process: the service's engines and batchers, served to the HTTP workers on a socket.

It runs the same Service as a single-process server (models, engines, one batcher per model,
readiness, metrics into the shared Prometheus folder), without HTTP. Each worker holds one
connection; every INFER frame (one or many of the worker's requests, app/engine_process/client.py)
becomes one batcher.enqueue on a view of the worker's segment (zero copy until the batch is
staged), answered by a RESULT frame from the answer's callback: no task a frame, since this one
event loop's time a frame is the whole service's ceiling. Where the GPU decodes JPEGs (nvJPEG,
app/codecs/gpu_jpeg.py) its decoder is here too: a worker's upload comes as a DECODE frame, its
pixels go back in the same segment.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import mmap
import os
import signal
from collections.abc import Callable

import numpy as np
import orjson

from app.batching.batcher import Batcher
from app.config import Settings
from app.engine_process import SOCKET_ENV, frames
from app.engine_process.segments import map_file
from app.errors import GpuDecodeError, ServiceError
from app.service import ServedModel, Service

log = logging.getLogger(__name__)
STOP_SIGNAL = signal.SIGUSR1


class WorkerConnection:
    """One HTTP worker's socket: its segments and its requests in flight."""

    def __init__(self, service: Service, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.service, self.reader, self.writer = service, reader, writer
        self.segments: dict[int, mmap.mmap] = {}
        self.waiting: set[asyncio.Future[np.ndarray]] = set()  # frames enqueued, not answered
        self.decodes: set[asyncio.Task[None]] = set()  # uploads being decoded on the GPU
        self.models: list[ServedModel] = []  # by the model index the workers send, set at HELLO

    async def run(self) -> None:
        try:
            while True:
                kind, payload = await frames.read_frame(self.reader)
                if kind == frames.INFER:
                    self.infer(payload)
                elif kind == frames.DECODE:
                    task = asyncio.create_task(self.decode(payload))
                    self.decodes.add(task)
                    task.add_done_callback(self.decodes.discard)
                elif kind == frames.SEGMENT:
                    fields = orjson.loads(payload)
                    self.segments[fields["index"]] = map_file(fields["path"], fields["size"], create=False)
                elif kind == frames.HELLO:
                    await self.hello()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the worker is gone: its requests' answers have nobody to go to
        finally:
            for future in self.waiting:
                future.cancel()  # the batcher drops the rows it has not launched
            for task in self.decodes:
                task.cancel()
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
        self.models = list(self.service.models.values())
        models = {}
        for name, served in self.service.models.items():
            engine = served.engines[0]
            devices = [e.device for e in served.engines]
            models[name] = {"engine": engine.name, "devices": devices, "queue_limit": self.service.settings.queue_limit}
        decodes = self.service.jpeg_decoder is not None
        self.writer.write(frames.json_frame(frames.MODELS, {"models": models, "jpeg_decoder": decodes}))

    async def decode(self, payload: bytes) -> None:
        """An upload's bytes → its pixels on this process's GPU decoder, written back into the worker's
        segment (the worker copies them out, then sends them as any request's rows)."""
        decode_id, model, length, segment = frames.DECODE_HEADER.unpack(payload)
        memory = self.segments[segment]
        outcome, shape, error = frames.DECODED_OK, (0, 0, 0), b""
        try:
            decoder = self.service.jpeg_decoder
            if decoder is None:  # the worker asks only where HELLO said there is one
                raise ServiceError("this engine process has no GPU JPEG decoder")
            pixels = await decoder.decode(bytes(memory[:length]), self.models[model].spec)  # (1, C, H, W)
            if pixels.nbytes > len(memory):
                raise GpuDecodeError(f"{pixels.shape} pixels do not fit the {len(memory)}-byte segment")
            np.copyto(np.ndarray(pixels.shape, np.uint8, buffer=memory), pixels)
            shape = pixels.shape[1:]
        except GpuDecodeError:
            outcome = frames.DECODE_REFUSED  # the worker's Pillow decodes it, as a refusal in-process is
        except Exception as failure:
            if not isinstance(failure, ServiceError):
                log.error("unexpected error decoding an upload in the engine process", exc_info=failure)
                failure = ServiceError("unexpected server error; it is logged with its traceback")
            outcome, error = frames.DECODE_FAILED, frames.error_payload(failure)
        header = frames.DECODED_HEADER.pack(decode_id, outcome, *shape)
        if not self.writer.is_closing():
            self.writer.write(frames.PREFIX.pack(frames.DECODED, len(header) + len(error)) + header + error)

    def infer(self, payload: bytes) -> None:
        """Enqueue a frame's rows; answer it now if refused, else from its future's callback."""
        frame_id, deadline, dtype, model, k, c, h, w, segment = frames.INFER_HEADER.unpack(payload)
        served = self.models[model]
        try:
            batcher = served.ready_batcher()
            batcher.admit(deadline)  # the worker admitted on figures one answer old: check again
            images = np.ndarray((k, c, h, w), frames.DTYPES[dtype], buffer=self.segments[segment])
            future = batcher.enqueue(images, deadline)
        except Exception as error:
            self.answer(frame_id, served, error=error)
            return
        self.waiting.add(future)
        future.add_done_callback(lambda done: self.answered(frame_id, served, done))

    def answered(self, frame_id: int, served: ServedModel, future: asyncio.Future[np.ndarray]) -> None:
        self.waiting.discard(future)
        if future.cancelled():
            return  # the worker is gone (run() cancelled it): nobody to answer
        error = future.exception()
        self.answer(frame_id, served, scores=future.result() if error is None else None, error=error)

    def answer(self, frame_id: int, served: ServedModel, *, scores: np.ndarray | None = None,
               error: BaseException | None = None) -> None:  # fmt: skip
        """Write the RESULT frame: the (rows, classes) float32 scores as they are, or the error's JSON."""
        body: bytes | memoryview
        if scores is not None:
            (rows, classes), ok, body = scores.shape, 1, scores.data.cast("B")
        else:
            if not isinstance(error, ServiceError):
                log.error("unexpected error in the engine process", exc_info=error)
                error = ServiceError("unexpected server error; it is logged with its traceback")
            ok, rows, classes, body = 0, 0, 0, frames.error_payload(error)
        # The queue's figures ride on every answer, a refusal's too: the workers admit with them.
        batcher = served.batcher
        queued, rate = (batcher.queued_rows, batcher.rows_per_s) if isinstance(batcher, Batcher) else (0, 0.0)
        header = frames.RESULT_HEADER.pack(frame_id, ok, rows, classes, queued, rate)
        # No drain: the worker reads its answers as they come, and one that stops reading is gone
        # (its connection closes, run() ends). The transport buffers what the socket cannot take yet.
        if not self.writer.is_closing():
            self.writer.write(frames.PREFIX.pack(frames.RESULT, len(header) + len(body)) + header)
            self.writer.write(body)  # the scores as they are: no concatenated copy


async def serve_engines(settings: Settings, socket_path: str, on_ready: Callable[[], None],
                        on_fatal: Callable[[], None]) -> None:  # fmt: skip
    """Build the engines and answer the workers until STOP_SIGNAL (or the parent process is gone)."""
    # The GPU's JPEG decoder lives here, with the GPU: the workers send it their uploads (DECODE).
    service = Service(settings, on_fatal=on_fatal, on_ready=on_ready)
    service.start()

    async def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await WorkerConnection(service, reader, writer).run()

    server = await asyncio.start_unix_server(connected, path=socket_path)
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
        server.close()
        await service.stop()


def engine_process_main(on_ready: Callable[[], None], on_fatal: Callable[[], None]) -> None:
    """The process's entry (spawned by app/runtime/workers.py, which exported the settings as CGSERVE_*)."""
    from app.config import get_settings

    settings = get_settings()
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # Ctrl-C and a SIGTERM to the process group reach it with the workers, which still drain through
    # it: only the parent's STOP_SIGNAL, sent after the last worker has exited, stops it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    asyncio.run(serve_engines(settings, os.environ[SOCKET_ENV], on_ready, on_fatal))
