"""The one inference path behind every ingress.

    ingress: a Codec each                       the data plane, once                      batching
    POST /predict, /v1/models/{m}/predict   ┐   lookup → readiness → admission (before
    POST /v2/models/{m}[/versions/v]/infer  ├─▶ a byte of the body is read) → deadline ─▶ BatchQueue: a Batcher
    gRPC ModelInfer                         ┘   → read → decode → submit → answer → metrics  here, or the engine process

An ingress only translates, as KServe's REST and gRPC endpoints translate for its DataPlane: its
Codec says how a request names a model, how the wire request becomes (k, C, H, W) images, how the
scores become the wire answer and how an error is written. `DataPlane.infer` does everything in
between for every ingress alike: the same limits, deadline, metrics labels (a served model's name,
never what a client wrote) and error accounting. app/http/inline.py, which answers small requests
inside the HTTP protocol by callbacks rather than a coroutine, runs the same steps: `admit`, the
codec's decode, the queue, the codec's answer, `counted` and `observe`.

With tracing on (app/ops/tracing.py) `infer` is `traced_infer`, chosen once when the data plane is
made: the same path inside a request span, its status and model read off the codec's calls. Off,
`infer` is the plain method: not a flag read more per request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

from app.batching.queue import BatchQueue
from app.errors import ClientClosedError, DeadlineExceededError, ServiceError, within
from app.ops import metrics, timers, tracing
from app.repository.model_spec import ModelSpec
from app.service import ServedModel, Service

log = logging.getLogger(__name__)

Wire = TypeVar("Wire")  # what the ingress read: an HTTP body, a gRPC message
Answer = TypeVar("Answer")  # what it writes back
WireIn = TypeVar("WireIn", contravariant=True)
AnswerOut = TypeVar("AnswerOut", covariant=True)


class Codec(Protocol[WireIn, AnswerOut]):
    """One wire format: how it names a model, reads a request, answers and refuses."""

    protocol: str  # the metrics' protocol label: rest, v2, grpc

    def served(self, model: str, version: str | None) -> ServedModel:
        """The model the request names ("" for the default); UnknownModelError, or a 404 for its version."""
        ...

    async def decode(self, request: WireIn, spec: ModelSpec) -> tuple[np.ndarray, Any]:
        """(k, C, H, W) uint8 or float32 images, and what the answer needs to know of the request. The
        whole request is checked here, before its batch runs; a large one decodes off the event loop."""
        ...

    def encode(self, scores: np.ndarray, asked: Any, served: ServedModel, engine: str) -> AnswerOut:
        """(k, classes) float32 scores → the answer."""
        ...

    def failure(self, error: ServiceError) -> tuple[AnswerOut, str]:
        """The answer to a refused or failed request, and its status as the metrics label it."""
        ...

    def cancelled(self) -> tuple[str, str]:
        """The request's task was cancelled (a gRPC client that left or ran out of time): its status label and
        its rejection reason."""
        ...


class CheapCodec(Codec[WireIn, AnswerOut], Protocol[WireIn, AnswerOut]):
    """A codec that can decode a request at once where that costs little, for a caller that waits by callback."""

    def decode_cheaply(self, request: WireIn, spec: ModelSpec) -> tuple[np.ndarray, Any] | None:
        """A request decoded at once where that costs little (a binary tensor: a view of its bytes under a
        small header); None where the async `decode` must take it (large JSON, encoded images)."""
        ...


class NowCodec(CheapCodec[WireIn, AnswerOut], Protocol[WireIn, AnswerOut]):
    """A codec that can also decode any small request at once (app/http/inline.py's)."""

    def decode_now(self, request: WireIn, spec: ModelSpec) -> tuple[np.ndarray, Any]: ...


class DataPlane:
    def __init__(self, service: Service) -> None:
        self.service = service  # for the settings; codecs hold it for the models
        settings = service.settings
        tracing.configure(settings.tracing, settings.otlp_endpoint)
        if tracing.active():
            self.infer = self.traced_infer  # type: ignore[method-assign]

    @staticmethod
    def admit(served: ServedModel, deadline: float) -> BatchQueue:
        """Readiness and admission of a looked-up model's request, before a byte of its body is read: its
        queue, or what refuses it (NotReadyError, QueueFullError), counted under the model's name."""
        queue = served.ready_batcher()
        queue.admit(deadline)
        served.admitted += 1  # until its answer (`answered`): a replaced version is freed once none is left
        return queue

    @staticmethod
    def answered(served: ServedModel) -> None:
        """The end of a request `admit` let in, answered or not."""
        served.admitted -= 1

    async def infer(
        self,
        codec: Codec[Wire, Answer],
        read: Callable[[], Awaitable[Wire]],
        *,
        model: str,
        version: str | None,
        form: str,
        deadline: float,
        path: str,
    ) -> Answer:
        """The request for (model, version), read by `read` once admitted, answered as `codec` writes.

        Every error becomes the codec's answer; only a cancelled task raises (CancelledError).
        `deadline` is a time.monotonic(): the request's end to end, from its first byte.
        """
        started = time.perf_counter()
        label, status = "", "500"
        admitted: ServedModel | None = None
        try:
            served = codec.served(model, version)  # UnknownModelError: counted under "", never the client's name
            label = served.spec.name
            queue = self.admit(served, deadline)
            admitted = served
            async with within(deadline):
                images, asked = await codec.decode(await read(), served.spec)
                scores = await queue.submit(images, deadline)
            answer, status = codec.encode(scores, asked, served, queue.engines[0].name), "200"
        except asyncio.CancelledError:
            status, reason = codec.cancelled()
            metrics.reject(label, reason)
            raise
        except Exception as error:
            answer, status = codec.failure(counted(error, label, path))
        finally:
            if admitted is not None:
                self.answered(admitted)
            observe(label, codec.protocol, form, status, started)
        return answer

    def infer_message(
        self,
        codec: CheapCodec[Wire, Answer],
        message: Wire,
        *,
        model: str,
        version: str | None,
        form: str,
        deadline: float,
        path: str,
    ) -> asyncio.Future[Answer]:
        """`infer` for a request already read whole (a gRPC message), by callbacks: where its decode is cheap
        (`codec.decode_cheaply`) no task and no coroutine runs for it, only the batcher's future and a
        callback on it. The same steps, limits, deadline and counting as `infer`; the future's result is
        the codec's answer or refusal. Cancelling it (a stream closed, a call cancelled) drops the rows not
        yet launched and counts the request as `codec.cancelled` says. With tracing on: `infer` in a task."""
        if tracing.active():

            async def read() -> Wire:
                return message

            coroutine = self.infer(codec, read, model=model, version=version, form=form, deadline=deadline, path=path)
            return asyncio.ensure_future(coroutine)
        return _Answering(self, codec, form, deadline, path).start(message, model, version)

    async def traced_infer(
        self,
        codec: Codec[Wire, Answer],
        read: Callable[[], Awaitable[Wire]],
        *,
        model: str,
        version: str | None,
        form: str,
        deadline: float,
        path: str,
    ) -> Answer:
        """`infer` in a span named "POST <path>" (HTTP) or "<method>" (gRPC), its parent the request's
        traceparent; model, protocol, form and status as its attributes."""
        name = path if codec.protocol == "grpc" else f"POST {path}"
        span, token = tracing.start_request(name, codec.protocol, form)
        watched = _Watched(codec)
        try:
            return await DataPlane.infer(
                self, watched, read, model=model, version=version, form=form, deadline=deadline, path=path
            )
        finally:
            tracing.end_request(span, token, watched.model, watched.status)


class _Answering(Generic[Wire, Answer]):
    """One request through `DataPlane.infer_message`: its state between the callbacks."""

    __slots__ = ("answer", "codec", "deadline", "decoding", "form", "label", "left_s", "path", "plane", "rows",
                 "served", "started", "timer")  # fmt: skip

    def __init__(
        self, plane: DataPlane, codec: CheapCodec[Wire, Answer], form: str, deadline: float, path: str
    ) -> None:
        self.plane, self.codec, self.form, self.deadline, self.path = plane, codec, form, deadline, path
        self.started = time.perf_counter()
        self.left_s = max(0.0, deadline - time.monotonic())  # what the 504 says it had, as `within` does
        self.label = ""  # the served model's name once looked up (never what the client wrote)
        self.served: ServedModel | None = None  # once admitted, until answered
        self.rows: asyncio.Future[np.ndarray] | None = None  # the batcher's, once queued
        self.decoding: asyncio.Task[None] | None = None  # an async decode (encoded images, large contents)
        self.timer: timers.Armed | None = None  # the deadline's, while the answer is owed
        self.answer: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()

    def start(self, message: Wire, model: str, version: str | None) -> asyncio.Future[Answer]:
        try:
            served = self.codec.served(model, version)
            self.label = served.spec.name
            queue = self.plane.admit(served, self.deadline)
            self.served = served
            decoded = self.codec.decode_cheaply(message, served.spec)
        except Exception as error:
            self._fail(error)
            return self.answer
        self.answer.add_done_callback(self._ended)  # only cancelling ends it from outside
        self.timer = timers.call_at(self.deadline, self._expire)
        if decoded is None:
            self.decoding = asyncio.get_running_loop().create_task(self._decode_and_queue(message, queue, served))
        else:
            self._queue(queue, served, *decoded)
        return self.answer

    async def _decode_and_queue(self, message: Wire, queue: BatchQueue, served: ServedModel) -> None:
        try:
            images, asked = await self.codec.decode(message, served.spec)
        except Exception as error:
            self._fail(error)
            return
        self._queue(queue, served, images, asked)

    def _queue(self, queue: BatchQueue, served: ServedModel, images: np.ndarray, asked: Any) -> None:
        if self.answer.done():  # its deadline passed while it decoded
            return
        try:
            self.rows = queue.enqueue(images, self.deadline)
        except Exception as error:
            self._fail(error)
            return
        engine = queue.engines[0].name
        self.rows.add_done_callback(lambda rows: self._answered(rows, asked, served, engine))

    def _answered(self, rows: asyncio.Future[np.ndarray], asked: Any, served: ServedModel, engine: str) -> None:
        if self.answer.done():  # cancelled, or answered 504 (which cancelled `rows`)
            return
        try:
            answer = self.codec.encode(rows.result(), asked, served, engine)
        except Exception as error:  # the batch failed (EngineError, 504 from the batcher), or the encode did
            self._fail(error)
            return
        self._settle(answer, "200")

    def _expire(self) -> None:
        """Its deadline passed unanswered: 504. Rows not yet launched are dropped (a cancelled future is
        skipped by the batcher; an engine process drops them at the same deadline, which they carry)."""
        self.timer = None
        if self.rows is not None:
            if self.rows.done():  # the answer is in, its callback queued: it wins
                return
            self.rows.cancel()
        if self.decoding is not None:
            self.decoding.cancel()
        self._fail(DeadlineExceededError(self.left_s))

    def _fail(self, error: Exception) -> None:
        answer, status = self.codec.failure(counted(error, self.label, self.path))
        self._settle(answer, status)

    def _settle(self, answer: Answer, status: str) -> None:
        if self.answer.done():
            return
        self._finish(status)
        self.answer.set_result(answer)

    def _ended(self, answer: asyncio.Future[Answer]) -> None:
        """Cancelled from outside (the client left or ran out of time): no answer is sent."""
        if not answer.cancelled():
            return
        if self.rows is not None:
            self.rows.cancel()
        if self.decoding is not None:
            self.decoding.cancel()
        status, reason = self.codec.cancelled()
        metrics.reject(self.label, reason)
        self._finish(status)

    def _finish(self, status: str) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.served is not None:
            self.plane.answered(self.served)
            self.served = None
        observe(self.label, self.codec.protocol, self.form, status, self.started)


class _Watched(Codec[Wire, Answer]):
    """A codec that notes the model served and the status answered, for the request's span."""

    def __init__(self, codec: Codec[Wire, Answer]) -> None:
        self.codec = codec
        self.protocol = codec.protocol
        self.model, self.status = "", "500"

    def served(self, model: str, version: str | None) -> ServedModel:
        served = self.codec.served(model, version)
        self.model = served.spec.name
        return served

    async def decode(self, request: Wire, spec: ModelSpec) -> tuple[np.ndarray, Any]:
        return await self.codec.decode(request, spec)

    def encode(self, scores: np.ndarray, asked: Any, served: ServedModel, engine: str) -> Answer:
        answer = self.codec.encode(scores, asked, served, engine)
        self.status = "200"
        return answer

    def failure(self, error: ServiceError) -> tuple[Answer, str]:
        answer, self.status = self.codec.failure(error)
        return answer, self.status

    def cancelled(self) -> tuple[str, str]:
        self.status, reason = self.codec.cancelled()
        return self.status, reason


def counted(error: Exception, model: str, path: str) -> ServiceError:
    """`error` as the ServiceError it is answered with, counted under its reason for `model` ("" before one
    was looked up). A client that went away (ClientClosedError: each front end's body read raises it) is
    no error of ours, logged at info; anything unexpected is logged with its traceback and answered 500."""
    if isinstance(error, ClientClosedError):
        log.info("%s: the client went away before its answer", path)
    elif not isinstance(error, ServiceError):
        log.error("unexpected error in %s", path, exc_info=error)
        error = ServiceError("unexpected server error; it is logged with its traceback")
    metrics.reject(model, error.reason)
    return error


def observe(model: str, protocol: str, form: str, status: str, started: float) -> None:
    """One request's end: its latency (from `started`, a time.perf_counter()) and count, by its labels."""
    metrics.observe_request(model, protocol, form, status, time.perf_counter() - started)
