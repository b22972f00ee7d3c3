"""The outermost HTTP layer: the request's id, and with the access log on, its line.

Pure ASGI (Starlette's BaseHTTPMiddleware would put each request through a task group and
memory streams): a header scan, a context variable, and one header appended to the answer.
It sits outside Starlette's own error middleware, so a 500 from an unhandled exception carries
the id and is logged too.

With tracing on (CGSERVE_TRACING) it also hands the W3C `traceparent` header down to the data
plane's request span, and that span's trace and span ids up to the access-log line, in a Carrier
(app/ops/tracing.py).
"""

from __future__ import annotations

import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.access.access_log import AccessLog
from app.access.request_id import HEADER, REQUEST_ID, choose
from app.ops.tracing import CARRIER, Carrier

_HEADER = HEADER.encode()
_TRACEPARENT = b"traceparent"


class RequestContextMiddleware:
    def __init__(self, app: ASGIApp, *, access_log: AccessLog | None, tracing: bool = False) -> None:
        self.app = app
        self.log = access_log
        self.tracing = tracing

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        incoming = next((value for name, value in scope["headers"] if name == _HEADER), None)
        request_id = choose(incoming)
        echoed = (_HEADER, request_id.encode())
        reset = REQUEST_ID.set(request_id)
        carrier = None
        if self.tracing:
            parent = next((value for name, value in scope["headers"] if name == _TRACEPARENT), None)
            carrier = Carrier(parent.decode("latin-1") if parent is not None else None)
            CARRIER.set(carrier)  # this request's task's context; reset with the id's below
        try:
            if self.log is None:

                async def send_with_id(message: Message) -> None:
                    if message["type"] == "http.response.start":
                        message["headers"] = [*message.get("headers", ()), echoed]
                    await send(message)

                await self.app(scope, receive, send_with_id)
            else:
                await self._logged(scope, receive, send, request_id, echoed, carrier)
        finally:
            REQUEST_ID.reset(reset)
            if carrier is not None:
                CARRIER.set(None)

    async def _logged(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        request_id: str,
        echoed: tuple[bytes, bytes],
        carrier: Carrier | None,
    ) -> None:
        assert self.log is not None
        arrived, started = time.time(), time.perf_counter()
        status: int | None = None  # stays None when the client left before any answer
        bytes_in = bytes_out = 0

        async def counted_receive() -> Message:
            nonlocal bytes_in
            message = await receive()
            if message["type"] == "http.request":
                bytes_in += len(message.get("body", b""))
            return message

        async def logged_send(message: Message) -> None:
            nonlocal status, bytes_out
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", ()), echoed]
            elif message["type"] == "http.response.body":
                bytes_out += len(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, counted_receive, logged_send)
        finally:
            client = scope.get("client")
            fields: dict[str, Any] = {
                "request_id": request_id,
                "protocol": "http",
                "method": scope["method"],
                "path": scope["path"],
                "status": status,
                "duration_ms": round((time.perf_counter() - started) * 1000, 3),
                "bytes_in": bytes_in,
                "bytes_out": bytes_out,
                "client": client[0] if client else None,
                "model": self._model(scope),
            }
            if carrier is not None:  # tracing on: the request span's ids (None where no span was made)
                fields["trace_id"], fields["span_id"] = carrier.trace_id, carrier.span_id
            self.log.write(arrived, fields)

    def _model(self, scope: Scope) -> str | None:
        """The model a request named (the router leaves path_params in the scope), or /predict's default."""
        name = scope.get("path_params", {}).get("name")
        if name is not None or scope["path"] != "/predict":
            return name if isinstance(name, str) else None
        service = getattr(getattr(scope.get("app"), "state", None), "service", None)
        return getattr(service, "default_name", None)
