"""The one inference path behind every ingress.

    ingress: a Codec each                       the data plane, once                      batching
    POST /predict, /v1/models/{m}/predict   ┐   lookup → readiness → admission (before
    POST /v2/models/{m}[/versions/v]/infer  ├─▶ a byte of the body is read) → deadline ─▶ BatchQueue: a Batcher
    gRPC ModelInfer                         ┘   → read → decode → enqueue → answer → metrics here, or the engine process

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
from types import TracebackType
from typing import Any, Protocol, TypeVar

import numpy as np

from app.batching.queue import BatchQueue, enqueue
from app.codecs.uploads import Images
from app.errors import ClientClosedError, DeadlineExceededError, ServiceError
from app.ops import metrics, tracing
from app.ops.timers import timeout_at
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

    async def decode(self, request: WireIn, spec: ModelSpec) -> tuple[Images, Any]:
        """(k, C, H, W) uint8 or float32 images (or JPEGs the engine process decodes, app/batching/queue.py),
        and what the answer needs to know of the request. The whole request is checked here, before its
        batch runs; a large one decodes off the event loop."""
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


class NowCodec(Codec[WireIn, AnswerOut], Protocol[WireIn, AnswerOut]):
    """A codec that can also decode a small request at once, for a caller that waits by callback."""

    def decode_now(self, request: WireIn, spec: ModelSpec) -> tuple[np.ndarray, Any] | None:
        """A small request decoded at once; None where it holds encoded images, which the async `decode` takes to
        the uploads' decoder (Pillow's decode of a few 1000×1000 PNGs held the loop 135 ms)."""
        ...

    def decode_cheaply(self, request: WireIn, spec: ModelSpec) -> tuple[np.ndarray, Any] | None:
        """A large request decoded at once where that costs little (a binary tensor: a view of its bytes
        under a small header); None where the async `decode` must take it (large JSON, encoded images)."""
        ...


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
                scores = await enqueue(queue, images, deadline)
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

    async def decode(self, request: Wire, spec: ModelSpec) -> tuple[Images, Any]:
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


def counted(error: Exception, model: str, path: str, *, requests: int = 1) -> ServiceError:
    """`error` as the ServiceError it is answered with, counted under its reason for `model` ("" before one
    was looked up), once for each of `requests` it answers (the front door answers a bulk at once). A client
    that went away (ClientClosedError: each front end's body read raises it) is no error of ours, logged at
    info; anything unexpected is logged with its traceback and answered 500."""
    if isinstance(error, ClientClosedError):
        log.info("%s: the client went away before its answer", path)
    elif not isinstance(error, ServiceError):
        log.error("unexpected error in %s", path, exc_info=error)
        error = ServiceError("unexpected server error; it is logged with its traceback")
    metrics.reject(model, error.reason, requests)
    return error


def observe(model: str, protocol: str, form: str, status: str, started: float) -> None:
    """One request's end: its latency (from `started`, a time.perf_counter()) and count, by its labels."""
    metrics.observe_request(model, protocol, form, status, time.perf_counter() - started)


class within(timeout_at):
    """Bound a request's reading, decoding and queueing by its deadline (time.monotonic()): 504 past it.

    On the coarse timer (app/ops/timers.py): up to its tick late, and cheaper than
    asyncio.timeout_at on every request."""

    __slots__ = ("_entered",)

    async def __aenter__(self) -> None:
        self._entered = time.monotonic()
        await super().__aenter__()

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        try:
            await super().__aexit__(kind, error, traceback)
        except TimeoutError:  # the time it had left when the block began, as the batcher reports it
            raise DeadlineExceededError(max(0.0, self._deadline - self._entered)) from None
