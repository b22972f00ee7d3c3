"""Inference requests answered inside the HTTP protocol, below the ASGI stack.

Through ASGI a request is a task running a dozen nested coroutines (uvicorn's cycle, the proxy
headers, error, exception and exit-stack middleware, the router, the route, the guard, the
handler) with a Request and a Response object. Waiting for its batch suspends every one of them
and the answer resumes every one: the no-op ceiling, which never waits, pays for the stack once
and never for the wait. Here the protocol (app/http/protocol.py) hands over a small request; when
its body is whole it is decoded as the route decodes it, queued with the batcher's `enqueue`,
and the answer is written from the future's callback, in one write: no task, no coroutine.

Taken here: the routes of app/http/inline_routes.py (POST /predict with a JSON, octet-stream, image or
multipart body, the Open Inference Protocol's infer with JSON or binary tensors) with a Content-Length of at most
256 KiB (INLINE_BODY_LIMIT: a 150 KB ResNet-50 image is taken), no Transfer-Encoding or Expect,
while CGSERVE_INLINE_PREDICT is on and no access layer (tokens, CORS, request ids, access log) is.
Everything else takes the ASGI routes and both doors answer alike: the same
decoding, limits (the bytes-in-flight budget, the deadline, the body's pause timeout), metrics
and error bodies (tests/integration/test_inline_predict.py sends the same requests both ways).
The deadline is the route's too: a coarse timer armed at the end of the headers answers 504 once
it passes, whether the body is still coming, the rows are queued or their batch runs (rows not
yet launched are dropped).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from app.batching.queue import BatchQueue, enqueue
from app.codecs.uploads import Images
from app.dataplane import DataPlane, NowCodec, counted, observe
from app.errors import ClientClosedError, DeadlineExceededError
from app.http.answer import HttpAnswer, HttpBody
from app.http.heads import Head, read_head
from app.http.inline_routes import form_of, route_of
from app.http.limits import FIRST_BYTE_KEY, BodyBudget
from app.http.protocol import INLINE_BODY_LIMIT, write_answer
from app.ops import metrics, timers
from app.service import ServedModel


class InlineRequest:
    """One request answered here: what its head said, then what it holds as it goes (a plain class whose
    class attributes are the defaults, so that a request assigns only what it has: taken per request)."""

    batcher: BatchQueue | None = None  # the model's, once admitted
    served: ServedModel | None = None
    future: asyncio.Future[np.ndarray] | None = None  # the batcher's, once queued
    decoding: asyncio.Task[None] | None = None  # a larger body's decode (asyncio keeps only weak references)
    asked: Any = None  # what the answer needs of the request (v2: its inference header)
    timer: timers.Armed | None = None  # the deadline's, while the answer is owed
    model = ""  # the served model's name once looked up (the metrics' label: never a client's name)
    refused = False  # an error answer is on its way
    answered = False

    def __init__(self, cycle: RequestResponseCycle, codec: NowCodec[HttpBody, HttpAnswer], form: str, head: Head,
                 deadline: float, started: float) -> None:  # fmt: skip
        self.cycle = cycle  # uvicorn's: its scope and the body read so far; answered through write_answer
        self.codec = codec
        self.form = form  # "json", "raw" or "image" (/predict), "json" or "binary" (v2 infer)
        self.head = head  # its Content-Length (reserved in the budget until the answer), -Type, v2 header length
        self.deadline = deadline  # time.monotonic()
        self.started = started  # time.perf_counter(), for the latency histogram


# A body up to this is decoded on the loop as it completes, but for encoded images in a v2 BYTES tensor; a larger one
# (up to INLINE_BODY_LIMIT) and those images in a task by the codec's async decode, where JSON and encoded images may
# leave the loop. A raw /predict body is a view of its bytes whatever its size: always decoded at once, as is a
# v2 binary tensor under a small JSON header (the codec's decode_cheaply). An image body (JPEG, PNG)
# never is: the uploads' decoder batches it with others (on the GPU where there is one).
DECODE_NOW_BYTES = 64 * 1024


class InlinePredict:
    def __init__(self, plane: DataPlane, codecs: dict[str, NowCodec[HttpBody, HttpAnswer]], budget: BodyBudget) -> None:
        self.plane = plane
        self.codecs = codecs  # inline_routes' route → its codec: PREDICT, V2_INFER
        self.budget = budget
        self.settings = plane.service.settings

    def take(self, cycle: RequestResponseCycle) -> InlineRequest | None:
        """At the end of the headers: the request's state if it is answered here, else None."""
        scope = cycle.scope
        if scope["method"] != "POST" or cycle.waiting_for_100_continue:
            return None
        target = route_of(scope["path"])
        if target is None:
            return None
        route, model, version = target
        head = read_head(scope["headers"])
        if head.streamed or head.encoding or (head.timeout_ms is not None and head.timeout_ms < 0):
            return None  # read as it streams in, inflated (a compressed body), or refused 400 by the ASGI guard
        length = head.length
        timeout_s = self.settings.request_timeout_s
        if head.timeout_ms is not None:
            timeout_s = min(timeout_s, head.timeout_ms / 1000)
        form = form_of(route, head.media, head.header_length)
        if form is None or length is None or not 0 <= length <= min(INLINE_BODY_LIMIT, self.settings.max_body_bytes):
            return None  # the ASGI route answers it (415, 411-like reads, 413) or serves it
        if not self.budget.reserve(length):
            return None  # the guard answers 503 with Retry-After
        extensions: dict[str, Any] = scope["extensions"]  # the first byte's time, stamped by the guarded protocol
        deadline = extensions[FIRST_BYTE_KEY] + timeout_s
        codec = self.codecs[route]
        started = time.perf_counter()
        request = InlineRequest(cycle, codec, form, head, deadline, started)
        try:  # as the data plane does, before a byte of the body is read: the model, its readiness, admission
            request.served = codec.served(model, version)
            request.model = request.served.spec.name  # refusals below are counted under it
            request.batcher = self.plane.admit(request.served, deadline)
        except Exception as error:
            self._refuse(request, error)
            return request
        # Its whole timeout is what it had left when taken in: its deadline runs from its first byte.
        request.timer = timers.call_at(deadline, lambda: self._expire(request, timeout_s))
        return request

    def body_complete(self, request: InlineRequest) -> None:
        """Decode and queue; the answer follows from the batcher's future."""
        # The connection's own buffer, taken (not copied: 150 KB a ResNet-50 image) and replaced by an empty
        # one, so an idle connection keeps nothing and the decoded (k, C, H, W) view reads these bytes.
        body, request.cycle.body = request.cycle.body, bytearray()
        if request.refused or request.answered or request.batcher is None or request.served is None:
            return
        head = request.head
        media = head.media.decode("latin-1") if head.media else ""
        header_length = None if head.header_length is None else head.header_length.decode("latin-1")
        query = request.cycle.scope["query_string"]
        wire = HttpBody(body, media, query.decode("latin-1") if query else "", header_length, head.content_type)
        batcher, served = request.batcher, request.served
        try:  # the codec's own decode, here and now where it is cheap
            if request.form == "raw" or (request.form != "image" and len(body) <= DECODE_NOW_BYTES):
                decoded = request.codec.decode_now(wire, served.spec)
            else:
                decoded = request.codec.decode_cheaply(wire, served.spec)  # a v2 binary tensor
            if decoded is None:  # JSON, or encoded images in a v2 tensor: off the loop where the codec takes them
                request.decoding = asyncio.get_running_loop().create_task(
                    self._decode_and_queue(request, wire, batcher, served)
                )
                return
            images, request.asked = decoded
        except Exception as error:
            self._refuse(request, error)
            return
        self._queue(request, images, batcher, served)

    async def _decode_and_queue(self, request: InlineRequest, wire: HttpBody, batcher: BatchQueue,
                                served: ServedModel) -> None:  # fmt: skip
        """A larger body by the codec's async decode, which takes large JSON and encoded images off the
        loop (to the uploads' decoder: the GPU's where there is one), as the ASGI route does."""
        try:
            images, request.asked = await request.codec.decode(wire, served.spec)
        except Exception as error:
            self._refuse(request, error)
            return
        if not request.answered:  # not meanwhile answered 504, nor left by its client
            self._queue(request, images, batcher, served)

    def _queue(self, request: InlineRequest, images: Images, batcher: BatchQueue, served: ServedModel) -> None:
        try:
            request.future = enqueue(batcher, images, request.deadline)
        except Exception as error:
            self._refuse(request, error)
            return
        engine = batcher.engines[0].name
        request.future.add_done_callback(lambda future: self._answered(request, future, engine, served))

    def fail(self, request: InlineRequest, error: Exception) -> None:
        """Answer `error` as the route would (its status, headers and body, counted alike)."""
        if request.answered:
            return
        answer, _ = request.codec.failure(counted(error, request.model, request.cycle.scope["path"]))
        self._finish(request, answer)

    def abandon(self, request: InlineRequest) -> None:
        """The connection is gone: drop its rows if not launched yet, give its bytes back; counted as
        the route counts a client that left (499, client_closed)."""
        if not self._settle(request, ClientClosedError.status):
            return
        if request.future is not None:
            request.future.cancel()
        metrics.reject(request.model, ClientClosedError.reason)

    def _refuse(self, request: InlineRequest, error: Exception) -> None:
        """Answer `error` on the loop's next turn, not from inside the HTTP parser: a request
        pipelined behind this one is then queued behind its answer as uvicorn queues it (answered
        mid-parse, uvicorn would arm the keep-alive timer while that request runs)."""
        request.refused = True
        asyncio.get_running_loop().call_soon(self.fail, request, error)

    def _expire(self, request: InlineRequest, left_s: float) -> None:
        """The deadline passed unanswered: 504, as the route's `within` answers it. Rows not yet
        launched are dropped: the local batcher skips a cancelled future; an engine process drops
        them at the same deadline, which travels with them."""
        request.timer = None
        if request.future is not None:
            if request.future.done():  # the answer is in, its callback queued: it wins
                return
            request.future.cancel()  # its callback sees `answered` and returns
        self.fail(request, DeadlineExceededError(left_s))

    def _answered(self, request: InlineRequest, future: asyncio.Future[np.ndarray], engine: str,
                  served: ServedModel) -> None:  # fmt: skip
        if request.answered:  # the client left, or the deadline was answered (either cancelled the future)
            return
        try:
            answer = request.codec.encode(future.result(), request.asked, served, engine)
        except Exception as error:
            self.fail(request, error)
            return
        self._finish(request, answer)

    def _finish(self, request: InlineRequest, answer: HttpAnswer) -> None:
        if self._settle(request, answer.status):
            write_answer(request.cycle, answer.status, answer.raw_headers(), answer.body)

    def _settle(self, request: InlineRequest, status: int) -> bool:
        """The request's end, once: its bytes back, its deadline disarmed, counted. False if it had ended."""
        if request.answered:
            return False
        request.answered = True
        request.cycle.body = bytearray()  # what came of a body answered early is not kept by the connection
        self.budget.release(request.head.length or 0)
        if request.batcher is not None and request.served is not None:  # admitted: the data plane counted it
            self.plane.answered(request.served)
        if request.timer is not None:
            request.timer.cancel()
        observe(request.model, request.codec.protocol, request.form, str(status), request.started)
        return True
