"""Bulks from the front door to their models' batchers, and their answers back: Python's whole share.

Python works once per bulk, not once per request (run 34: bench/results/2026-12-03-run34-h200-front-door.md).
Taken at every wake-up, bulks held a few rows each, and each cost a future, a callback and an answer call;
so a bulk is taken only while fewer than `in_flight` are out, and rows gather in C while the GPU works.
And while another bulk is out, a partial one waits for the batcher's own launch moment (just in time
before the running batch ends): taken at once, it would leave behind the clients whose answers just
went out and who are about to send again, and they would wait a whole batch more (run 34's ResNet-50).
A bulk holding JPEGs for the GPU decoder is paced by the decoder as well: taken whenever the decoder has caught
up (every upload it was given is in a launch), whatever else is out, with any other rows it holds. Held until a
bulk was answered, JPEGs waited in C through a whole bulk's decode and inference while the decoder had room
(run 41: 17 of an upload's 55 ms at 70 % load).
A bulk's rows are grouped by the model each names (models.py), and each group queued on its model's batcher a
largest bucket at a time, each piece answered as its batch is done. Its image uploads are
decoded over their rows, and queued a decoder batch at a time as they are handed back (images.py); its v2
requests' headers and its gRPC calls' requests are checked (v2_headers.py, grpc_calls.py); one the service's port
would refuse is answered so at once, and its row left out.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from contextlib import aclosing
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, cast

import numpy as np

from app.batching.batcher import Batcher
from app.codecs.uploads import JpegBatchDecoder
from app.config import Settings
from app.dataplane import counted
from app.errors import NotReadyError, ServiceError
from app.front_door.answers import Answers, head_lines, status_line
from app.front_door.door import GRPC, IMAGE, JPEG, PREDICT, V2, Bulk, Door
from app.front_door.images import BulkImages
from app.front_door.models import DoorModel, DoorModels, Group
from app.http.answer import error_answer
from app.ops import metrics
from app.protocols.v2.rest import Asked, V2Codec
from app.service import ServedModel, Service

if TYPE_CHECKING:  # loaded where the door serves gRPC (server.py): the protocol's messages
    from app.front_door.grpc_calls import GrpcAnswers, GrpcRows

PROTOCOL, FORM, V2_FORM, GRPC_FORM, IMAGE_FORM, OK = "door", "raw", "v2-binary", "grpc", "image", b"200 OK"
# A row's kind → its metrics' format (an upload's, as the service's port counts it, whichever decoder took it).
FORMS = {PREDICT: FORM, V2: V2_FORM, GRPC: GRPC_FORM, JPEG: IMAGE_FORM, IMAGE: IMAGE_FORM}
PATH = "the front door"  # where counted() logs an unexpected error
# The event loop's timers fire on whole milliseconds (libuv's, uvloop's): a shorter wait would last one, and
# the seed CNN's batches, a fraction of one, would wait for it each time. Such a wait is looked at again on
# each turn of the loop instead (which polls the running batch's CUDA event meanwhile: CGSERVE_EVENT_WAIT=poll).
TIMER_RESOLUTION_S = 0.001


@dataclass(frozen=True, slots=True)
class Requests:
    """Some of a bulk's requests: where each answer goes, when each arrived, their kinds and what they ask."""

    ids: np.ndarray  # (k,) uint64: door.h's answer ids
    arrived: np.ndarray  # (k,) float64: time.monotonic()
    kinds: np.ndarray | None = None  # (k,) uint8: door.PREDICT, V2, GRPC, JPEG or IMAGE; None: each a POST /predict
    asked: list[Asked | None] | None = None  # each v2 or gRPC request's answer as it asks (None: POST /predict's)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, rows: slice | np.ndarray) -> Requests:
        if self.kinds is None:
            return Requests(self.ids[rows], self.arrived[rows])
        asked = None if self.asked is None else [self.asked[i] for i in np.arange(len(self))[rows].tolist()]
        return Requests(self.ids[rows], self.arrived[rows], self.kinds[rows], asked)

    def forms(self) -> list[tuple[int, slice | np.ndarray]]:
        """(kind, its rows) for each kind present: the metrics count them apart, and their answers differ."""
        if self.kinds is None:
            return [(PREDICT, slice(None))]
        return [(kind, rows) for kind in FORMS if len(rows := np.flatnonzero(self.kinds == kind))]


class Feeder:
    def __init__(self, door: Door, service: Service, shape: tuple[int, int, int], settings: Settings,
                 grpc: GrpcRows | None = None) -> None:  # fmt: skip
        self.door, self.grpc = door, grpc
        self.in_flight, self.timeout_s = settings.in_flight, settings.request_timeout_s
        self.full = max(settings.buckets)  # a largest bucket's rows: a bulk's pieces
        self.pieces: dict[int, int] = {}  # a taken bulk's buffer → its pieces not yet answered
        self.timer: asyncio.Handle | None = None  # the next pump's, while a partial bulk waits
        self.batcher: Batcher | None = None  # the batcher of the model with most of the last bulk's rows: its clock
        # says when to take a partial one
        self.models = DoorModels(service, shape, V2Codec(service), grpc)  # which model each row is for, its parts
        # The door runs where the engines are: the service's decoder is its own GPU one (or None: Pillow's).
        self.images = BulkImages(cast(JpegBatchDecoder | None, service.jpeg_decoder), settings.max_image_pixels,
                                 caught_up=self.pump)  # fmt: skip
        self.decoding: set[asyncio.Task[None]] = set()  # bulks whose uploads are being decoded
        self.unstarted: set[int] = set()  # taken bulks' buffers whose uploads are not yet given to the decoder
        self.closed = False  # close(): no bulk is taken any more

    def pump(self) -> None:
        """Take bulks while fewer than in_flight are out (a partial one, while another is out, at the batcher's
        launch moment), and one holding JPEGs whenever the GPU decoder has caught up; while the door has a buffer."""
        while not self.closed:
            rows, jpegs = self.door.waiting()
            if not rows:
                return
            held = self.out >= self.in_flight or (self.out and rows < self.full and self._later())
            if held and not (jpegs and self._decoder_caught_up()):
                return
            bulk = self.door.take()
            if bulk is None:
                return
            self._queue(bulk)

    def close(self) -> None:
        """Take no bulk from now on (the door is stopping, its drain over): what was taken is still answered."""
        self.closed = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _decoder_caught_up(self) -> bool:
        """The GPU decoder has taken every upload it was given into a launch, and no bulk taken is yet to give it
        its own: pump takes the bulk being filled then if it holds any JPEG, not only a bulk of them (one other row,
        a PNG, pixels, a v2 request, would otherwise hold every JPEG after it to the in_flight rule, behind the
        bulks the decoder paced: a review's simulation, 0.6 % of PNGs cost a fifth of the photos a second)."""
        decoder = self.images.paced
        return decoder is not None and not self.unstarted and not decoder.backlog()

    @property
    def out(self) -> int:
        """Bulks taken and not yet wholly answered."""
        return len(self.pieces)

    def idle(self) -> bool:
        return self.out == 0 and self.door.waiting()[0] == 0

    def _later(self) -> bool:
        """True where a partial bulk should wait for the batcher's launch moment; a timer then pumps again."""
        if self.batcher is None:
            return False
        delay = self.batcher.launch_moment() - time.monotonic()
        if delay <= 0:
            return False
        if self.timer is None:
            loop = asyncio.get_running_loop()
            # Shorter than a timer can wait: again on the loop's next turn, until the moment comes.
            self.timer = (
                loop.call_later(delay, self._on_time) if delay >= TIMER_RESOLUTION_S else loop.call_soon(self._on_time)
            )
        return True

    def _on_time(self) -> None:
        self.timer = None
        self.pump()

    def _queue(self, bulk: Bulk) -> None:
        """A bulk of (k, C, H, W) rows, read in place until its buffer is released, onto its models' batchers in
        pieces (models.py groups its rows by the model each names); its image uploads once each decoder batch has
        written their pixels over them."""
        requests = Requests(bulk.ids, bulk.arrived, bulk.kinds)
        # Held (a piece of its own) until every row is queued or answered: in_flight counts the bulk meanwhile.
        self.pieces[bulk.buffer] = 1
        try:
            groups, headers = self.models.groups(len(requests), bulk.kinds, bulk.headers)
        except Exception as error:  # a fault: every request answered 500, none left out for ever
            self._refuse(requests, error, model="")
            self._piece_done(bulk.buffer, pump=False)
            return
        images = np.flatnonzero(bulk.kinds >= JPEG) if bulk.kinds is not None else np.empty(0, np.int64)
        ready = [group for group in groups if group.batcher is not None]
        if ready:  # the model with most of the bulk's rows paces the next partial one (_later)
            self.batcher = max(ready, key=lambda group: len(group.rows)).batcher
        for group in groups:
            if group.model is None:  # unknown, not ready or not of the door's images (no model label: the name may
                # be no served model's)
                assert group.error is not None
                self._refuse(requests[group.rows], group.error, model="")
                continue
            metrics.front_door_wait(group.model.name).observe_many(time.monotonic() - bulk.arrived[group.rows])
            pixels = np.setdiff1d(group.rows, images) if images.size else group.rows  # /predict's, v2, gRPC tensors
            for which in pieces_of(pixels, bulk.rows[0].nbytes):
                self._enqueue(bulk, requests, headers, which, group)
            if images.size and (uploads := np.intersect1d(group.rows, images)).size:  # the default model's
                self._decode(bulk, requests, uploads, group)
        self._piece_done(bulk.buffer, pump=False)

    def _decode(self, bulk: Bulk, requests: Requests, uploads: np.ndarray, group: Group) -> None:
        """The bulk's image uploads decoded over their rows, then queued, on a task of their own."""
        assert bulk.kinds is not None and group.model is not None
        model = group.model
        model.served.admitted += 1  # as the port admits before it decodes: a version replaced meanwhile waits
        handed_on = np.ones(len(requests), dtype=bool)  # rows queued or answered so far
        handed_on[uploads] = False
        self.pieces[bulk.buffer] += 1  # the decoding's, until _decoded
        if (bulk.kinds[uploads] == JPEG).any():  # until the task's first step gives the GPU decoder its uploads
            self.unstarted.add(bulk.buffer)
        task = asyncio.ensure_future(self._decode_and_queue(bulk, requests, uploads, handed_on, group))
        self.decoding.add(task)
        task.add_done_callback(partial(self._decoded, bulk, requests, handed_on, model.served))

    async def _decode_and_queue(self, bulk: Bulk, requests: Requests, uploads: np.ndarray, handed_on: np.ndarray,
                                group: Group) -> None:  # fmt: skip
        """Each decoder batch's rows queued as it hands them back; an upload that is not an image answered so."""
        assert bulk.kinds is not None and bulk.lengths is not None and group.model is not None
        # Its uploads are given to the decoder below, in this step of the task: no other pump runs in between.
        self.unstarted.discard(bulk.buffer)
        spec = group.model.served.spec
        # Closed here, whatever happens: its decodes left are cancelled before _decoded can release the buffer (an
        # async for that raises would leave that to the generator's finaliser, a loop turn after _decoded).
        async with aclosing(self.images.decode(bulk.rows, bulk.lengths, bulk.kinds, uploads, spec)) as decodes:
            async for decoded in decodes:
                for i, why in decoded.failed.items():
                    self._refuse(requests[i : i + 1], why, model=spec.name)
                    handed_on[i] = True
                for run in runs(np.sort(decoded.rows)):
                    self._enqueue(bulk, requests, None, run, group)
                    handed_on[run] = True

    def _decoded(self, bulk: Bulk, requests: Requests, handed_on: np.ndarray, served: ServedModel,
                 task: asyncio.Task[None]) -> None:  # fmt: skip
        """A bulk's uploads all decoded, or its decoding stopped: whatever went wrong, every request not yet queued
        is answered, and the buffer comes back with the last piece (a callback's exception would be lost)."""
        self.decoding.discard(task)
        self.unstarted.discard(bulk.buffer)  # cancelled before its first step
        served.admitted -= 1
        try:
            task.result()
        except BaseException as error:  # cancelled (the server is stopping), or a fault
            failure = error if isinstance(error, Exception) else NotReadyError("the server is stopping")
            if not handed_on.all():
                self._refuse(requests[np.flatnonzero(~handed_on)], failure, model=served.spec.name)
        finally:
            self._piece_done(bulk.buffer, pump=True)

    def _enqueue(self, bulk: Bulk, requests: Requests, headers: list[bytes] | None, which: slice | np.ndarray,
                 group: Group) -> None:  # fmt: skip
        """The bulk's rows `which` onto the group's batcher, a largest bucket at a time, once each request's header
        (`headers`, as models.py gives them; None: none has one) is checked; each piece answered as its batch is
        done. Never raises: a request it cannot queue is answered with why."""
        model, batcher = group.model, group.batcher
        assert model is not None and batcher is not None
        buffer, served, name = bulk.buffer, model.served, model.name
        deadline = float(bulk.arrived[which].min()) + self.timeout_s  # its oldest request's
        requests, rows = requests[which], bulk.rows[which]  # a run: a view, read in place until staged; else a copy
        try:
            if headers is not None:
                asked = headers[which] if isinstance(which, slice) else [headers[i] for i in which.tolist()]
                requests, rows = self._checked(requests, rows, asked, model)
        except Exception as error:  # a fault before any is queued or answered: each told, none left out for ever
            self._refuse(requests, error, model=name)
            return
        for start in range(0, len(rows), self.full):
            piece = slice(start, start + self.full)
            try:
                batcher.admit(deadline)
                future = batcher.enqueue(rows[piece], deadline)
            except Exception as error:
                self._refuse(requests[piece], error, model=name)
                continue
            self.pieces[buffer] += 1
            served.admitted += 1  # a replaced version is freed once none is left (app/dataplane.py's admit)
            future.add_done_callback(partial(self._answered, buffer, model, requests[piece]))

    def _checked(self, requests: Requests, rows: np.ndarray, headers: list[bytes],
                 model: DoorModel) -> tuple[Requests, np.ndarray]:  # fmt: skip
        """Each v2 request's header and gRPC call's request checked: one the service's port would refuse is refused
        now, and the others go on (their rows copied out where some were refused)."""
        assert requests.kinds is not None
        checks: dict[int, Callable[[bytes], Asked | ServiceError]] = {V2: model.v2}
        if model.grpc is not None:  # else grpc.c takes no call
            checks[GRPC] = model.grpc[0]
        checked = [
            checks[kind](header) if kind in checks else None  # POST /predict's, pixels or an upload, has no header
            for kind, header in zip(requests.kinds.tolist(), headers, strict=True)
        ]
        refused = [i for i, found in enumerate(checked) if isinstance(found, ServiceError)]
        for i in refused:
            self._refuse(requests[i : i + 1], checked[i], model=model.name)  # type: ignore[arg-type]
        asked = [None if isinstance(found, ServiceError) else found for found in checked]
        # None where no row asks (POST /predict's, pixels or uploads): their answers are built k at once.
        requests = Requests(requests.ids, requests.arrived, requests.kinds,
                            asked if any(found is not None for found in asked) else None)  # fmt: skip
        if not refused:
            return requests, rows
        kept = np.setdiff1d(np.arange(len(rows)), refused)
        return requests[kept], rows[kept]

    def _answered(self, buffer: int, door_model: DoorModel, requests: Requests,
                  future: asyncio.Future[np.ndarray]) -> None:  # fmt: skip
        """One queued piece answered (or failed); the bulk's buffer is given back with its last piece."""
        door_model.served.admitted -= 1
        error = None if future.cancelled() else future.exception()
        model = door_model.name
        try:
            if future.cancelled() or error is not None:
                failure = error if isinstance(error, Exception) else ServiceError("the request was cancelled")
                self._refuse(requests, failure, model=model)
            else:
                grpc = None if door_model.grpc is None else door_model.grpc[1]
                bodies, heads = _bodies(door_model.answers, grpc, future.result(), requests)  # from (k, classes)
                self.door.answer(requests.ids, bodies, OK, heads)
                waited = time.monotonic() - requests.arrived
                for kind, rows in requests.forms():
                    metrics.observe_requests(model, PROTOCOL, FORMS[kind], "200", waited[rows])
        except Exception as failure:  # whatever went wrong, the clients get an answer and the buffer comes back
            self._refuse(requests, failure, model=model)
        finally:
            self._piece_done(buffer, pump=True)

    def _piece_done(self, buffer: int, *, pump: bool) -> None:
        # Answered or failed, the batcher is done with its rows: staged, or never to be (a deadline passed).
        self.pieces[buffer] -= 1
        if self.pieces[buffer] == 0:
            del self.pieces[buffer]
            self.door.release(buffer)
            if pump:
                self.pump()

    def _refuse(self, requests: Requests, error: Exception, *, model: str) -> None:
        """Every request answered with `error` as the HTTP port answers it (a v2 one in the protocol's shape), and
        counted."""
        failure = counted(error, model, PATH, requests=len(requests))
        waited = time.monotonic() - requests.arrived
        for kind, rows in requests.forms():
            ids = requests.ids[rows]
            if kind == GRPC and self.grpc is not None:  # no message, and the error's trailers
                trailers, code = self.grpc.refusal(failure)
                self.door.answer(ids, [b""] * len(ids), OK, [trailers] * len(ids))
            else:
                answer = error_answer(failure, v2=kind == V2)
                code = str(answer.status)
                self.door.answer(ids, [answer.body] * len(ids), status_line(answer.status),
                                 [head_lines(answer.headers)] * len(ids))  # fmt: skip
            metrics.observe_requests(model, PROTOCOL, FORMS[kind], code, waited[rows])


def _bodies(answers: Answers, grpc: GrpcAnswers | None, scores: np.ndarray, requests: Requests
            ) -> tuple[list[bytes], list[bytes]]:  # fmt: skip
    """(k, width) scores → each request's body and head lines (a gRPC call's: its message and trailers)."""
    if requests.kinds is None or not (calls := requests.kinds == GRPC).any():
        return answers(scores, requests.asked)
    assert requests.asked is not None and grpc is not None
    bodies, heads = [b""] * len(scores), [grpc.ok] * len(scores)
    others, grpc_rows = np.flatnonzero(~calls).tolist(), np.flatnonzero(calls).tolist()
    if others:
        some = answers(scores[others], [requests.asked[i] for i in others])
        for i, body, head in zip(others, *some, strict=True):
            bodies[i], heads[i] = body, head
    calls_asked = [requests.asked[i] for i in grpc_rows]  # each an Asked: a call's check refused it, or it asks
    for i, message in zip(grpc_rows, grpc(scores[grpc_rows], calls_asked), strict=True):  # type: ignore[arg-type]
        bodies[i] = message
    return bodies, heads


# A model's rows in more runs than this are gathered into one array, one copy, rather than queued a run at a time,
# where a row is small: each piece costs a future, a callback and an answer call, and a bulk of two models taking
# turns would be a piece a row (a review's count: 64 rows alternating, 64 pieces). Past GATHER_ROW_BYTES the copy
# costs the event loop more than the pieces do (run 49, bench/results/HISTORY.md: two ResNet-50s taking turns
# through the door, 150 KB a row, lost a seventh of their rate gathered).
MOST_RUNS = 4
GATHER_ROW_BYTES = 64 * 1024


def pieces_of(rows: np.ndarray, row_bytes: int) -> list[slice] | list[np.ndarray]:
    """Sorted row numbers of one model → what to queue: each run of consecutive rows, a view of the bulk; or, where
    they are in more than MOST_RUNS runs and a row is at most GATHER_ROW_BYTES, the rows themselves (one copy)."""
    found = runs(rows)
    return [rows] if len(found) > MOST_RUNS and row_bytes <= GATHER_ROW_BYTES else found


def runs(rows: np.ndarray) -> list[slice]:
    """Sorted row numbers → a slice for each run of consecutive ones ([3, 4, 5, 9] → [3:6, 9:10]): each run's rows
    are a view of the bulk, where rows picked one by one would be a copy (150 KB an image for ResNet-50)."""
    if not len(rows):
        return []
    breaks = np.flatnonzero(np.diff(rows) != 1) + 1
    starts, ends = np.concatenate(([0], breaks)), np.concatenate((breaks, [len(rows)]))
    return [slice(int(rows[a]), int(rows[b - 1]) + 1) for a, b in zip(starts.tolist(), ends.tolist(), strict=True)]
