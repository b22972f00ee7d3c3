"""A worker's side of the engine process: one connection, and a batcher stand-in per model.

The routes call `admit` and `submit` (or `enqueue`) as they would a local Batcher. Each copies the request's
(k, C, H, W) pixels into a shared-memory segment, sends an INFER frame (a 40-byte header) and awaits the
RESULT frame that the reader task hands back by request id. Admission uses the engine's queue
figures from the latest answer (one answer old); the engine process checks again on arrival.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from app.engine_process import frames
from app.engine_process.segments import Segment, SegmentPool
from app.errors import NotReadyError, QueueFullError

log = logging.getLogger(__name__)
CONNECT_POLL_S = 0.05
LISTEN_TIMEOUT_S = 120.0  # the engine process listens before it builds engines: this covers its imports


@dataclass(frozen=True)
class RemoteEngine:
    """What a route needs of an engine it does not hold: its name (the answer's `engine`) and device."""

    name: str
    device: str


class EngineLink:
    """This worker's connection to the engine process, shared by every model's RemoteBatcher."""

    def __init__(self, socket_path: str, segment_folder: str, on_dead: Callable[[str], None]) -> None:
        self.socket_path = socket_path
        self.pool = SegmentPool(segment_folder)
        self.on_dead = on_dead
        self.dead: str | None = None
        self.models: dict[str, dict[str, Any]] = {}
        self.queue_figures: list[tuple[int, float]] = []  # per model index: queued rows, rows/s
        self._pending: dict[int, tuple[asyncio.Future[np.ndarray], Segment, int]] = {}  # id → (…, model)
        self._ids = itertools.count()
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None

    async def connect(self, timeout_s: float = LISTEN_TIMEOUT_S) -> None:
        """Connect (the engine process may not listen yet) and wait for its models: its whole start-up."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                reader, self._writer = await asyncio.open_unix_connection(self.socket_path)
                break
            except (FileNotFoundError, ConnectionRefusedError) as error:
                if time.monotonic() > deadline:
                    where = f"{self.socket_path} within {timeout_s:g} s"
                    raise RuntimeError(f"the engine process did not listen on {where}") from error
                await asyncio.sleep(CONNECT_POLL_S)
        self._writer.write(frames.frame(frames.HELLO))
        _, payload = await frames.read_frame(reader)
        answer = orjson.loads(payload)
        if "failure" in answer:
            raise RuntimeError(f"the engine process failed to start: {answer['failure']}")
        self.models = answer["models"]
        self.queue_figures = [(0, 0.0)] * len(self.models)
        self._reader_task = asyncio.create_task(self._read_results(reader), name="engine-link")

    def batcher(self, model: str) -> RemoteBatcher:
        info = self.models[model]
        return RemoteBatcher(self, list(self.models).index(model), info)

    def send(self, model: int, images: np.ndarray, deadline: float) -> asyncio.Future[np.ndarray]:
        """Copy the pixels into a segment and send the INFER frame; the future of the answer. Cancelled
        (the client left), the segment stays lent until the answer comes."""
        if self.dead is not None or self._writer is None:
            raise NotReadyError(f"the engine process is gone ({self.dead}); the service is restarting")
        segment, new = self.pool.take(images.nbytes)
        # One copy, whatever the strides (an nhwc body arrives as a transposed view).
        np.copyto(np.ndarray(images.shape, images.dtype, buffer=segment.memory), images)
        if new:
            where = {"index": segment.index, "path": segment.path, "size": segment.size}
            self._writer.write(frames.json_frame(frames.SEGMENT, where))
        request_id = next(self._ids)
        future: asyncio.Future[np.ndarray] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = (future, segment, model)
        dtype = frames.DTYPES.index(images.dtype)
        header = frames.INFER_HEADER.pack(request_id, deadline, dtype, model, *images.shape, segment.index)
        self._writer.write(frames.frame(frames.INFER, header))
        return future

    async def _read_results(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                _, payload = await frames.read_frame(reader)
                request_id, ok, rows, classes, queued, rate = frames.RESULT_HEADER.unpack_from(payload)
                future, segment, model = self._pending.pop(request_id)
                self.pool.give_back(segment)  # the engine process is done with its pixels
                self.queue_figures[model] = (queued, rate)
                if future.done():
                    continue
                if ok:  # a read-only view of the frame, no copy: the routes only read probabilities
                    probabilities = np.frombuffer(payload, np.float32, rows * classes, frames.RESULT_HEADER.size)
                    future.set_result(probabilities.reshape(rows, classes))
                else:
                    future.set_exception(frames.EngineProcessError(payload[frames.RESULT_HEADER.size :]))
        except (asyncio.IncompleteReadError, ConnectionError) as error:
            self._lost(f"its connection closed ({type(error).__name__})")
        except Exception as error:  # a frame this worker cannot read: nothing after it can be trusted
            log.exception("unreadable answer from the engine process")
            self._lost(f"an unreadable answer ({type(error).__name__}: {error})")

    def _lost(self, why: str) -> None:
        self.dead = why
        log.critical("the engine process is gone: %s; failing %d requests", why, len(self._pending))
        for future, _, _ in self._pending.values():
            if not future.done():
                future.set_exception(NotReadyError(f"the engine process is gone ({why})"))
        self._pending.clear()
        self.on_dead(why)

    async def close(self) -> None:
        if self._reader_task is not None:
            self._reader_task.cancel()
            await asyncio.gather(self._reader_task, return_exceptions=True)
        if self._writer is not None:
            self._writer.close()
        self.pool.close()


class RemoteBatcher:
    """A model's batcher as the routes see it (admit, submit, engines, dead), held by the engine process."""

    def __init__(self, link: EngineLink, index: int, info: dict[str, Any]) -> None:
        self.link, self.index = link, index
        self.engines = tuple(RemoteEngine(info["engine"], device) for device in info["devices"])
        self.queue_limit: int = info["queue_limit"]
        self.dead_device: str | None = None

    @property
    def dead(self) -> str | None:
        return self.link.dead

    def admit(self, deadline: float) -> None:
        """Batcher.admit on the engine's figures of the latest answer: dead, queue full, or too late."""
        if self.link.dead is not None:
            raise NotReadyError(f"the engine process is gone ({self.link.dead}); the service is restarting")
        queued, rate = self.link.queue_figures[self.index]
        wait = queued / rate if rate else 0.0
        if queued >= self.queue_limit:
            raise QueueFullError(queued, self.queue_limit, retry_after_s=wait or 1.0)
        if wait and time.monotonic() + wait > deadline:
            raise QueueFullError(queued, self.queue_limit, retry_after_s=wait, deadline_first=True)

    async def submit(self, images: np.ndarray, deadline: float | None = None) -> np.ndarray:
        return await self.enqueue(images, deadline)

    def enqueue(self, images: np.ndarray, deadline: float | None = None) -> asyncio.Future[np.ndarray]:
        # No deadline: the engine's batcher caps it at its request timeout, as a local one does.
        return self.link.send(self.index, images, deadline if deadline is not None else math.inf)

    def device_figures(self) -> dict[str, dict[str, Any]]:
        return {}  # the engine process's own

    async def stop(self) -> None:
        pass  # the link closes with the service
