"""Bulks from the front door to the default model's batcher, and their answers back: Python's whole share.

Python works once per bulk, not once per request (run 34: bench/results/2026-12-03-run34-h200-front-door.md).
Taken at every wake-up, bulks held a few rows each, and each cost a future, a callback and an answer call;
so a bulk is taken only while fewer than `in_flight` are out, and rows gather in C while the GPU works.
And while another bulk is out, a partial one waits for the batcher's own launch moment (just in time
before the running batch ends): taken at once, it would leave behind the clients whose answers just
went out and who are about to send again, and they would wait a whole batch more (run 34's ResNet-50).
A bulk is queued a largest bucket at a time, each piece answered as its batch is done.
"""

from __future__ import annotations

import asyncio
import time
from functools import partial
from http import HTTPStatus

import numpy as np

from app.batching.batcher import Batcher
from app.config import Settings
from app.dataplane import counted
from app.errors import NotReadyError, ServiceError
from app.front_door.answers import Answers
from app.front_door.door import Door
from app.http.answer import JSON_TYPE, error_answer
from app.ops import metrics
from app.service import ServedModel, Service

PROTOCOL, FORM, OK = "door", "raw", b"200 OK"
PATH = "the front door's POST /predict"  # where counted() logs an unexpected error
# The event loop's timers fire on whole milliseconds (libuv's, uvloop's): a shorter wait would last one, and
# the seed CNN's batches, a fraction of one, would wait for it each time.
TIMER_RESOLUTION_S = 0.001


class Feeder:
    def __init__(self, door: Door, service: Service, shape: tuple[int, int, int], settings: Settings) -> None:
        self.door, self.service, self.shape = door, service, shape
        self.in_flight, self.timeout_s = settings.in_flight, settings.request_timeout_s
        self.full = max(settings.buckets)  # a largest bucket's rows: a bulk's pieces
        self.pieces: dict[int, int] = {}  # a taken bulk's buffer → its pieces not yet answered
        self.timer: asyncio.TimerHandle | None = None
        self.batcher: Batcher | None = None  # the last bulk's: its clock says when to take a partial one
        self._answers: tuple[ServedModel, Answers] | None = None  # the default model's encoder, rebuilt on a change

    def pump(self) -> None:
        """Take bulks while fewer than in_flight are out (a partial one, while another is out, at the batcher's
        launch moment)."""
        while self.out < self.in_flight and (waiting := self.door.waiting()):
            if self.out and waiting < self.full and self._later():
                return
            taken = self.door.take()
            if taken is None:
                return
            self._queue(*taken)

    @property
    def out(self) -> int:
        """Bulks taken and not yet wholly answered."""
        return len(self.pieces)

    def idle(self) -> bool:
        return self.out == 0 and self.door.waiting() == 0

    def _later(self) -> bool:
        """True where a partial bulk should wait for the batcher's launch moment; a timer then pumps again."""
        if self.batcher is None:
            return False
        delay = self.batcher.launch_moment() - time.monotonic()
        if delay < TIMER_RESOLUTION_S:  # a timer would fire later than asked: take it now
            return False
        if self.timer is None:
            self.timer = asyncio.get_running_loop().call_later(delay, self._on_time)
        return True

    def _on_time(self) -> None:
        self.timer = None
        self.pump()

    def _queue(self, buffer: int, rows: np.ndarray, ids: np.ndarray, arrived: np.ndarray) -> None:
        """A bulk of (k, C, H, W) rows, read in place until its buffer is released, onto the batcher in pieces."""
        deadline = float(arrived[0]) + self.timeout_s  # its oldest request's
        try:
            served, batcher = self._default_model()
        except Exception as error:  # a ServiceError (404, 503) is answered as it says, anything else 500
            self._refuse(ids, arrived, error, model="")
            self.door.release(buffer)
            return
        starts = range(0, len(rows), self.full)
        self.pieces[buffer] = len(starts)
        answers = self._answers_for(served, batcher)
        for start in starts:
            piece = slice(start, start + self.full)
            try:
                batcher.admit(deadline)
                future = batcher.enqueue(rows[piece], deadline)  # read in place until staged
            except Exception as error:
                self._refuse(ids[piece], arrived[piece], error, model=served.spec.name)
                self._piece_done(buffer, pump=False)
                continue
            served.admitted += 1  # a replaced version is freed once none is left (app/dataplane.py's admit)
            future.add_done_callback(partial(self._answered, buffer, served, answers, ids[piece], arrived[piece]))

    def _default_model(self) -> tuple[ServedModel, Batcher]:
        served = self.service.model(None)
        if served.spec.input_shape != self.shape:
            raise NotReadyError(
                f"the default model {served.spec.name} now takes {served.spec.input_shape} images and the front "
                f"door was opened for {self.shape}: send to the HTTP port, or restart the server"
            )
        batcher = served.ready_batcher()
        assert isinstance(batcher, Batcher), "the front door runs in the process of the engines"
        self.batcher = batcher
        return served, batcher

    def _answers_for(self, served: ServedModel, batcher: Batcher) -> Answers:
        if self._answers is None or self._answers[0] is not served:
            self._answers = (served, Answers(served.spec, batcher.engines[0].name))
        return self._answers[1]

    def _answered(self, buffer: int, served: ServedModel, answers: Answers, ids: np.ndarray, arrived: np.ndarray,
                  future: asyncio.Future[np.ndarray]) -> None:  # fmt: skip
        """One queued piece answered (or failed); the bulk's buffer is given back with its last piece."""
        served.admitted -= 1
        error = None if future.cancelled() else future.exception()
        try:
            if future.cancelled() or error is not None:
                failure = error if isinstance(error, Exception) else ServiceError("the request was cancelled")
                self._refuse(ids, arrived, failure, model=served.spec.name)
            else:
                self.door.answer(ids, answers(future.result()), OK)  # (k, classes) scores
                metrics.observe_requests(served.spec.name, PROTOCOL, FORM, "200", time.monotonic() - arrived)
        except Exception as failure:  # whatever went wrong, the clients get an answer and the buffer comes back
            self._refuse(ids, arrived, failure, model=served.spec.name)
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

    def _refuse(self, ids: np.ndarray, arrived: np.ndarray, error: Exception, *, model: str) -> None:
        """Every request of `ids` answered with `error` as the HTTP port answers it, and counted."""
        answer = error_answer(counted(error, model, PATH, requests=len(ids)))
        status = b"%d %s" % (answer.status, HTTPStatus(answer.status).phrase.encode())
        extra = b"".join(b"%s: %s\r\n" % header for header in answer.headers if header != JSON_TYPE)
        self.door.answer(ids, [answer.body] * len(ids), status, extra)
        metrics.observe_requests(model, PROTOCOL, FORM, str(answer.status), time.monotonic() - arrived)
