"""A worker's side of the engine process: one connection, and a batcher stand-in per model.

The data plane calls `admit` and `enqueue` as it would a local Batcher's. A request
waits in this worker's outbox for the next frame: requests of one model and one image shape go
together, their (k, C, H, W) pixels copied one after the other into one shared-memory segment
and sent as one INFER frame (49 bytes: its prefix and header); the RESULT frame's (rows, classes)
scores are cut back into each request's rows. Admission uses the engine's queue figures from the latest answer
(one answer old); the engine process checks again on arrival.

Why frames of many requests: the engine process is one event loop serving every worker, so
what it spends per frame (read, admit, enqueue, answer, write: tens of µs) caps the service's
requests per second, one-image requests most of all: with a frame a request, that cost, not the
GPU, keeps their batches small and the GPU waiting (bench/results/HISTORY.md). A worker keeps at
most FRAMES_IN_FLIGHT frames unanswered: while that many are out, new requests wait in the outbox
and go together when an answer comes back. At low load nothing waits (a lone request is sent in
the loop iteration after it arrived); under load a frame grows with the time its predecessors
take to come back, so the engine process's cost per request falls as the load rises, the way a
batcher's batches grow. JPEGs go in UPLOADS frames, a lane of their own (Lane) with its own limit.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from app.codecs.uploads import DecodeHere
from app.engine_process import frames
from app.engine_process.segments import Segment, SegmentPool
from app.errors import NotReadyError, QueueFullError, ServiceError
from app.ops import metrics
from app.ops.held_copy import copy_holding_gil
from app.ops.metric_buffers import BufferedHistogram
from app.repository.model_spec import ModelSpec

log = logging.getLogger(__name__)
CONNECT_POLL_S = 0.05
LISTEN_TIMEOUT_S = 120.0  # the engine process listens before it builds engines: this covers its imports
# The default of engine_frames_in_flight. A flush starts while fewer frames than this are unanswered
# (it sends every group waiting, one frame each); at this many, requests wait and go together when an
# answer comes back. The engine runs one batch and has the next staged (two slots in flight) while a
# third collects: a frame per worker in each keeps it fed, the fourth covers the answer on its way back.
FRAMES_IN_FLIGHT = 4
# The same for UPLOADS frames, apart from INFER's: an upload's round trip includes its decode (tens of ms
# under load), so INFER's four would hold a worker's uploads back in its outbox at moderate load and feed
# the decoder in bursts; more frames in flight keep it fed while frames still group uploads under load.
UPLOAD_FRAMES_IN_FLIGHT = 16
# A frame's largest share of requests, in rows: more would only wait for a later batch anyway. At most
# a quarter of the model's queue limit too: the engine admits or refuses a frame whole.
FRAME_ROWS = 128
Table = dict[str, dict[str, dict[str, Any]]]  # model → version → its id, engine, devices, queue limit


@dataclass(slots=True, eq=False)
class Outgoing:
    """A request in the outbox: its model index, (k, C, H, W) pixels or k JPEGs, deadline and answer."""

    model: int
    images: np.ndarray | EngineUploads
    deadline: float
    future: asyncio.Future[np.ndarray]
    queued: float  # time.monotonic() at send(): its wait in the outbox is measured


@dataclass(slots=True, eq=False)
class Lane:
    """One kind of frame's requests waiting to go and frames awaiting answers: pixels in INFER frames, JPEGs
    in UPLOADS frames, each with its own limit of frames in flight."""

    frames_in_flight: int
    outbox: list[Outgoing] = field(default_factory=list)  # requests for the next frames
    pending: dict[int, SentFrame] = field(default_factory=dict)  # frame id → what it carries
    flush: asyncio.Handle | None = None  # the outbox's send, once scheduled


@dataclass(slots=True, eq=False)
class SentFrame:
    """An INFER or UPLOADS frame awaiting its RESULT: the segment it lent, and each request's future and rows
    in order."""

    segment: Segment
    model: int
    requests: list[tuple[asyncio.Future[np.ndarray], int]]
    sent: float  # time.monotonic() when written: its round trip is measured
    uploads: list[Outgoing] | None = None  # an UPLOADS frame's requests: decoded here if nvJPEG refused one


@dataclass(frozen=True)
class RemoteEngine:
    """What a route needs of an engine it does not hold: its name (the answer's `engine`) and device."""

    name: str
    device: str


class EngineLink:
    """This worker's connection to the engine process, shared by every model's RemoteBatcher."""

    def __init__(
        self,
        socket_path: str,
        segment_folder: str,
        on_dead: Callable[[str], None],
        frames_in_flight: int = FRAMES_IN_FLIGHT,
        upload_frames_in_flight: int = UPLOAD_FRAMES_IN_FLIGHT,
    ) -> None:
        self.socket_path = socket_path
        self.frames_in_flight = frames_in_flight  # the setting engine_frames_in_flight
        self.pool = SegmentPool(segment_folder)
        self.on_dead = on_dead
        self.dead: str | None = None
        self.table: Table = {}  # what the engine process serves now (MODELS)
        self.default: tuple[str | None, bool] = (None, False)  # its POST /predict model, and whether it is decided
        self.on_models: Callable[[Table], Awaitable[None]] | None = None  # told of each change after connect
        self.queue_figures: dict[int, tuple[int, float]] = {}  # by served model id: queued rows, rows/s
        self._frame_rows: dict[int, int] = {}  # by served model id: a frame's rows at most
        self._decoding_here: set[asyncio.Task[None]] = set()  # uploads nvJPEG refused, decoded with Pillow here
        self._gpu_decodes = metrics.IMAGE_DECODES.labels(decoder="gpu")
        self._controls: dict[int, asyncio.Future[dict[str, Any]]] = {}  # CONTROL id → its answer
        self.decodes_jpeg = False  # the engine process decodes JPEG uploads on its GPU (nvJPEG)
        self._pixels = Lane(frames_in_flight)  # INFER frames
        self._jpegs = Lane(upload_frames_in_flight)  # UPLOADS frames
        self._ids = itertools.count()
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        # Where a request's time goes between this worker and the engine process, a figure a frame.
        self._outbox_wait = BufferedHistogram(metrics.ENGINE_LINK.labels(stage="outbox"))
        self._round_trip = BufferedHistogram(metrics.ENGINE_LINK.labels(stage="round_trip"))

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
        self._take_table(answer)
        self.decodes_jpeg = bool(answer.get("jpeg_decoder"))
        self._reader_task = asyncio.create_task(self._read_results(reader), name="engine-link")

    def _take_table(self, answer: dict[str, Any]) -> None:
        self.table = answer["models"]
        self.default = answer.get("default"), bool(answer.get("default_decided"))  # the engine process's
        for versions in self.table.values():
            for info in versions.values():
                self._frame_rows[info["id"]] = min(FRAME_ROWS, max(1, info["queue_limit"] // 4))

    def batcher(self, info: dict[str, Any]) -> RemoteBatcher:
        """The batcher stand-in of one served (model, version): `info` is its entry in the table."""
        return RemoteBatcher(self, info)

    async def control(self, call: dict[str, Any]) -> dict[str, Any]:
        """A model control call (index, load, unload) answered by the engine process, which builds and
        frees the models; the MODELS frame of the change it made came (and was applied) before it."""
        if self.dead is not None or self._writer is None:
            raise NotReadyError(f"the engine process is gone ({self.dead}); the service is restarting")
        call_id = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._controls[call_id] = future
        self._writer.write(frames.json_frame(frames.CONTROL, {"id": call_id, **call}))
        return await future

    def send(self, model: int, images: np.ndarray | EngineUploads, deadline: float) -> asyncio.Future[np.ndarray]:
        """Put the request (pixels, or JPEGs for the engine process to decode) in the outbox; the future of
        its answer. Sent within the loop iteration unless FRAMES_IN_FLIGHT frames are out; then with the
        others when an answer comes back."""
        if self.dead is not None or self._writer is None:
            raise NotReadyError(f"the engine process is gone ({self.dead}); the service is restarting")
        future: asyncio.Future[np.ndarray] = asyncio.get_running_loop().create_future()
        lane = self._jpegs if isinstance(images, EngineUploads) else self._pixels
        lane.outbox.append(Outgoing(model, images, deadline, future, time.monotonic()))
        self._schedule_flush(lane)
        return future

    def _schedule_flush(self, lane: Lane) -> None:
        if lane.flush is None and lane.outbox and len(lane.pending) < lane.frames_in_flight:
            # call_soon, not now: the requests that arrive in this loop iteration go in the same frame.
            lane.flush = asyncio.get_running_loop().call_soon(self._send_outbox, lane)

    def _send_outbox(self, lane: Lane) -> None:
        """Every waiting request in frames: one per model and image shape (JPEGs: one per model), FRAME_ROWS
        rows at most."""
        lane.flush = None
        if self.dead is not None:
            return  # _lost answered them
        groups: dict[tuple[int, Any, tuple[int, ...]], list[Outgoing]] = {}
        for request in lane.outbox:
            if not request.future.done():  # a client that left before its rows were sent costs nothing
                images = request.images
                key = (request.model, images.dtype, images.shape[1:]) if isinstance(images, np.ndarray) else (
                    request.model, None, ())  # fmt: skip
                groups.setdefault(key, []).append(request)
        lane.outbox.clear()
        writer = self._writer
        assert writer is not None  # send() refuses until connect() set it
        for requests in groups.values():
            limit = self._frame_rows.get(requests[0].model, FRAME_ROWS)
            frame: list[Outgoing] = []
            rows = 0
            for request in requests:
                if frame and rows + len(request.images) > limit:
                    self._send_or_fail(writer, frame, rows, lane)
                    frame, rows = [], 0
                frame.append(request)
                rows += len(request.images)
            self._send_or_fail(writer, frame, rows, lane)

    def _send_or_fail(self, writer: asyncio.StreamWriter, requests: list[Outgoing], rows: int, lane: Lane) -> None:
        """One frame; where it cannot be sent (no shared memory left for a segment), its requests get the
        error now, and the other frames of the flush still go."""
        try:
            self._send_frame(writer, requests, rows, lane)
        except Exception as error:
            log.error("could not send %d requests to the engine process", len(requests), exc_info=error)
            for request in requests:
                if not request.future.done():
                    request.future.set_exception(NotReadyError(f"could not reach the engine process: {error}"))

    def _send_frame(self, writer: asyncio.StreamWriter, requests: list[Outgoing], rows: int, lane: Lane) -> None:
        """One frame of the requests, their pixels (INFER) or their JPEGs (UPLOADS: decoded on the engine
        process's GPU and inferred there) one after the other in one segment; answered by one RESULT."""
        frame_id, model, first = next(self._ids), requests[0].model, requests[0].images
        # The latest deadline: the engine drops a frame's rows only once none of its requests can use
        # them; each request's own deadline is kept by its route (504 here, whatever the engine does).
        deadline = max(request.deadline for request in requests)
        if isinstance(first, np.ndarray):
            shape = (rows, *first.shape[1:])  # (rows, C, H, W)
            segment, new = self.pool.take(rows * first.itemsize * math.prod(shape[1:]))
            staged = np.ndarray(shape, first.dtype, buffer=segment.memory)
            offset = 0
            for request in requests:  # one copy each, whatever the strides (an nhwc body is a transposed view),
                k = len(request.images)  # holding the GIL where it can (app/ops/held_copy.py)
                copy_holding_gil(staged[offset : offset + k], request.images)  # type: ignore[arg-type]  # the lane's
                offset += k
            dtype = frames.DTYPES.index(first.dtype)
            frame = frames.frame(frames.INFER, frames.INFER_HEADER.pack(frame_id, deadline, dtype, model, *shape,
                                                                        segment.index))  # fmt: skip
            uploads = None
        else:
            encoded = [data for r in requests if isinstance(r.images, EngineUploads) for data in r.images.encoded]
            segment, new = self.pool.take(sum(len(data) for data in encoded))
            offset = 0
            for data in encoded:
                segment.memory[offset : offset + len(data)] = data
                offset += len(data)
            header = frames.UPLOADS_HEADER.pack(frame_id, deadline, model, len(encoded), segment.index)
            frame = frames.frame(frames.UPLOADS, header + frames.upload_lengths(len(encoded)).pack(*map(len, encoded)))
            uploads = requests
        if new:
            where = {"index": segment.index, "path": segment.path, "size": segment.size}
            writer.write(frames.json_frame(frames.SEGMENT, where))
        now = time.monotonic()
        self._outbox_wait.observe(now - requests[0].queued)  # the oldest: the outbox keeps arrival order
        answers = [(r.future, len(r.images)) for r in requests]
        lane.pending[frame_id] = SentFrame(segment, model, answers, now, uploads)
        writer.write(frame)

    def _partly_refused(self, sent: SentFrame, payload: bytes, rows: int, classes: int) -> None:
        """nvJPEG refused some images of an UPLOADS frame: the requests of the others get their rows of the
        scores (the decoded images' in order), each with a refused image is decoded here as in `_refused`.
        The RESULT's payload: its header, a flag an image of the frame (padded), then the (rows, classes) scores."""
        if sent.uploads is None:
            self._refused(sent)
            return
        images = sum(k for _, k in sent.requests)
        start = frames.RESULT_HEADER.size
        flags = payload[start : start + images]
        start += frames.refusal_flags_size(images)
        scores = np.frombuffer(payload, np.float32, rows * classes, start).reshape(rows, classes)
        image = row = answered = 0
        for (future, k), request in zip(sent.requests, sent.uploads, strict=True):
            decoded = k - sum(flags[image : image + k])  # its images nvJPEG decoded: their rows were inferred
            if decoded < k:  # all k decoded again here (and counted there)
                self._decode_here(request)
            else:
                answered += k
                if not future.done():
                    future.set_result(scores[row : row + k])
            image, row = image + k, row + decoded
        self._gpu_decodes.inc(answered)

    def _refused(self, sent: SentFrame) -> None:
        """The engine process's nvJPEG refused every image of an UPLOADS frame: each of its requests still
        wanted is decoded here (Pillow) and sent again as pixels."""
        if sent.uploads is None:  # not an UPLOADS frame: nothing here to decode again
            for future, _ in sent.requests:
                if not future.done():
                    future.set_exception(ServiceError("the engine process refused pixels as an undecodable image"))
            return
        for request in sent.uploads:
            self._decode_here(request)

    def _decode_here(self, request: Outgoing) -> None:
        if not request.future.done():
            task = asyncio.create_task(self._decode_here_and_send(request))
            self._decoding_here.add(task)
            task.add_done_callback(self._decoding_here.discard)

    async def _decode_here_and_send(self, request: Outgoing) -> None:
        future = request.future
        try:
            assert isinstance(request.images, EngineUploads)  # an UPLOADS frame's request
            pixels = await request.images.decode_here()
            if future.done():  # its client left, or its deadline passed, meanwhile
                return
            scores = await self.send(request.model, pixels, request.deadline)
        except Exception as error:
            if not future.done():
                future.set_exception(error)
        else:
            if not future.done():
                future.set_result(scores)

    async def _read_results(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                kind, payload = await frames.read_frame(reader)
                if kind == frames.MODELS:  # a load or an unload changed them: applied before anything after it
                    table = orjson.loads(payload)
                    self._take_table(table)
                    if self.on_models is not None:
                        await self.on_models(self.table)
                    if self._writer is not None:  # the control call that changed it is answered once all say so
                        self._writer.write(frames.json_frame(frames.APPLIED, {"generation": table["generation"]}))
                    continue
                if kind == frames.CONTROLLED:
                    answer = orjson.loads(payload)
                    control = self._controls.pop(answer.pop("id"))
                    if not control.done():
                        control.set_result(answer)
                    continue
                frame_id, outcome, rows, classes, queued, rate = frames.RESULT_HEADER.unpack_from(payload)
                lane = self._pixels if frame_id in self._pixels.pending else self._jpegs
                sent = lane.pending.pop(frame_id)
                # Read-only views of the frame, no copy: the routes only read scores.
                scores = np.frombuffer(payload, np.float32, rows * classes, frames.RESULT_HEADER.size)
                scores = scores.reshape(rows, classes)
                self._round_trip.observe(time.monotonic() - sent.sent)
                self.pool.give_back(sent.segment)  # the engine process is done with its pixels
                self.queue_figures[sent.model] = (queued, rate)
                if outcome == frames.ANSWERED:
                    offset = 0
                    for future, k in sent.requests:
                        if not future.done():
                            future.set_result(scores[offset : offset + k])
                        offset += k
                    if sent.uploads is not None:
                        self._gpu_decodes.inc(rows)
                elif outcome == frames.PARTLY_REFUSED:
                    self._partly_refused(sent, payload, rows, classes)
                elif outcome == frames.REFUSED:
                    self._refused(sent)
                else:
                    error = payload[frames.RESULT_HEADER.size :]
                    for future, _ in sent.requests:
                        if not future.done():  # an error object each: a raised one collects its awaiter's traceback
                            future.set_exception(frames.EngineProcessError(error))
                self._schedule_flush(lane)  # a frame fewer in flight: what waited goes now
        except (asyncio.IncompleteReadError, ConnectionError) as error:
            self._lost(f"its connection closed ({type(error).__name__})")
        except Exception as error:  # a frame this worker cannot read: nothing after it can be trusted
            log.exception("unreadable answer from the engine process")
            self._lost(f"an unreadable answer ({type(error).__name__}: {error})")

    def _lost(self, why: str) -> None:
        self.dead = why
        lanes = (self._pixels, self._jpegs)
        waiting: list[asyncio.Future[Any]] = [
            future for lane in lanes for sent in lane.pending.values() for future, _ in sent.requests
        ]
        waiting += [request.future for lane in lanes for request in lane.outbox]
        waiting += self._controls.values()
        log.critical("the engine process is gone: %s; failing %d requests", why, len(waiting))
        for future in waiting:
            if not future.done():
                future.set_exception(NotReadyError(f"the engine process is gone ({why})"))
        for lane in lanes:
            lane.pending.clear()
            lane.outbox.clear()
        self._controls.clear()
        self.on_dead(why)

    async def close(self) -> None:
        if self._reader_task is not None:
            self._reader_task.cancel()
            await asyncio.gather(self._reader_task, return_exceptions=True)
        if self._writer is not None:
            self._writer.close()
        self.pool.close()


class RemoteBatcher:
    """A model's batcher as the data plane sees it (admit, enqueue, engines, dead), held by the engine process."""

    def __init__(self, link: EngineLink, info: dict[str, Any]) -> None:
        self.link, self.model_id = link, int(info["id"])
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
        queued, rate = self.link.queue_figures.get(self.model_id, (0, 0.0))
        wait = queued / rate if rate else 0.0
        if queued >= self.queue_limit:
            raise QueueFullError(queued, self.queue_limit, retry_after_s=wait or 1.0)
        if wait and time.monotonic() + wait > deadline:
            raise QueueFullError(queued, self.queue_limit, retry_after_s=wait, deadline_first=True)

    def enqueue(self, images: np.ndarray, deadline: float | None = None) -> asyncio.Future[np.ndarray]:
        # No deadline: the engine's batcher caps it at its request timeout, as a local one does.
        return self.link.send(self.model_id, images, deadline if deadline is not None else math.inf)

    def device_figures(self) -> dict[str, dict[str, Any]]:
        return {}  # the engine process's own

    async def stop(self) -> None:
        pass  # the link closes with the service


class RemoteJpegDecoder:
    """The engine process's nvJPEG decoder as a worker's routes see it (app/codecs/uploads.py's
    upload_images): a request's JPEGs go to the process that owns the GPU with the request itself, to be
    decoded and inferred there in one trip, so that JPEG uploads are decoded on the GPU with the engine
    process as without it."""

    def __init__(self, link: EngineLink) -> None:
        self.link = link

    def defer(
        self, encoded: Sequence[bytes | bytearray], spec: ModelSpec, decode_here: DecodeHere
    ) -> EngineUploads | None:
        """The request's JPEGs, for the data plane to enqueue in place of pixels; None where the engine
        process does not serve this version now (the caller decodes them here; its enqueue says why)."""
        if spec.version not in self.link.table.get(spec.name, {}):
            return None
        return EngineUploads(self.link, encoded, decode_here)

    def close(self) -> None:
        pass  # the decoder is the engine process's


@dataclass(slots=True, eq=False)
class EngineUploads:
    """A request's encoded JPEGs on their way to the engine process's GPU decoder and batcher: what a
    codec's decode gives the data plane in place of pixels (app/codecs/uploads.py's Uploads)."""

    link: EngineLink
    encoded: Sequence[bytes | bytearray]
    decode_here: DecodeHere  # their (k, C, H, W) pixels by Pillow, where the engine process hands them back

    def __len__(self) -> int:
        return len(self.encoded)  # the rows it becomes

    def enqueue(self, queue: object, deadline: float) -> asyncio.Future[np.ndarray]:
        """To the served version `queue` admitted the request on (a reload meanwhile may have given the
        name another), as its pixels would go."""
        if not isinstance(queue, RemoteBatcher):  # a worker's queues all are
            raise ServiceError(f"JPEGs for the engine process were queued on {type(queue).__name__}")
        return self.link.send(queue.model_id, self, deadline)
