"""The engine process: the service's engines and batchers, served to the HTTP workers on a socket.

It runs the same Service as a single-process server (models, engines, one batcher per model,
readiness, metrics into the shared Prometheus folder), without HTTP. Each worker holds one
connection; every INFER frame becomes one batcher.submit on a view of the worker's segment
(zero copy until the batch is staged), answered by a RESULT frame.
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

from app.config import Settings
from app.engine_process import SOCKET_ENV, frames
from app.engine_process.segments import map_file
from app.errors import ServiceError
from app.service import ServedModel, Service

log = logging.getLogger(__name__)
STOP_SIGNAL = signal.SIGUSR1


class WorkerConnection:
    """One HTTP worker's socket: its segments and its requests in flight."""

    def __init__(self, service: Service, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.service, self.reader, self.writer = service, reader, writer
        self.segments: dict[int, mmap.mmap] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        self.models: list[ServedModel] = []  # by the model index the workers send, set at HELLO

    async def run(self) -> None:
        try:
            while True:
                kind, payload = await frames.read_frame(self.reader)
                if kind == frames.INFER:
                    task = asyncio.create_task(self.infer(payload))
                    self.tasks.add(task)
                    task.add_done_callback(self.tasks.discard)
                elif kind == frames.SEGMENT:
                    fields = orjson.loads(payload)
                    self.segments[fields["index"]] = map_file(fields["path"], fields["size"], create=False)
                elif kind == frames.HELLO:
                    await self.hello()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the worker is gone: its requests' answers have nobody to go to
        finally:
            for task in list(self.tasks):
                task.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)
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
        self.writer.write(frames.json_frame(frames.MODELS, {"models": models}))

    async def infer(self, payload: bytes) -> None:
        request_id, deadline, dtype, model, k, c, h, w, segment = frames.INFER_HEADER.unpack(payload)
        served = self.models[model]
        body: bytes | memoryview
        try:
            batcher = served.ready_batcher()
            batcher.admit(deadline)  # the worker admitted on figures one answer old: check again
            images = np.ndarray((k, c, h, w), frames.DTYPES[dtype], buffer=self.segments[segment])
            probabilities = await batcher.submit(images, deadline)
            (rows, classes), ok, body = probabilities.shape, 1, memoryview(probabilities).cast("B")
        except Exception as error:
            if not isinstance(error, ServiceError):
                log.error("unexpected error in the engine process", exc_info=error)
                error = ServiceError("unexpected server error; it is logged with its traceback")
            ok, rows, classes, body = 0, 0, 0, frames.error_payload(error)
        # The queue's figures ride on every answer, a refusal's too: the workers admit with them.
        queued, rate = (served.batcher.queued_rows, served.batcher.rows_per_s) if served.batcher else (0, 0.0)
        header = frames.RESULT_HEADER.pack(request_id, ok, rows, classes, queued, rate)
        self.writer.write(frames.PREFIX.pack(frames.RESULT, len(header) + len(body)) + header)
        self.writer.write(body)  # the probabilities as they are: no concatenated copy
        with contextlib.suppress(ConnectionError):  # the worker is gone: run() ends this connection
            await self.writer.drain()


async def serve_engines(settings: Settings, socket_path: str, on_ready: Callable[[], None],
                        on_fatal: Callable[[], None]) -> None:  # fmt: skip
    """Build the engines and answer the workers until STOP_SIGNAL (or the parent process is gone)."""
    # Uploads are decoded by the workers (Pillow): a GPU JPEG decoder here would cost its
    # torchvision import, device memory and a thread, and never be used.
    service = Service(settings.model_copy(update={"jpeg_decoder": "cpu"}), on_fatal=on_fatal, on_ready=on_ready)
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
