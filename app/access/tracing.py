"""The outermost HTTP layer: the request's id, and with the access log on, its line.

Pure ASGI (Starlette's BaseHTTPMiddleware would put each request through a task group and
memory streams): a header scan, a context variable, and one header appended to the answer.
It sits outside Starlette's own error middleware, so a 500 from an unhandled exception carries
the id and is logged too.
"""

from __future__ import annotations

import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.access.access_log import AccessLog
from app.access.request_id import HEADER, REQUEST_ID, choose

_HEADER = HEADER.encode()


class TraceMiddleware:
    def __init__(self, app: ASGIApp, *, access_log: AccessLog | None, default_model: str | None) -> None:
        self.app = app
        self.log = access_log
        self.default_model = default_model

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        incoming = next((value for name, value in scope["headers"] if name == _HEADER), None)
        request_id = choose(incoming)
        echoed = (_HEADER, request_id.encode())
        reset = REQUEST_ID.set(request_id)
        try:
            if self.log is None:

                async def send_with_id(message: Message) -> None:
                    if message["type"] == "http.response.start":
                        message["headers"] = [*message.get("headers", ()), echoed]
                    await send(message)

                await self.app(scope, receive, send_with_id)
            else:
                await self._logged(scope, receive, send, request_id, echoed)
        finally:
            REQUEST_ID.reset(reset)

    async def _logged(
        self, scope: Scope, receive: Receive, send: Send, request_id: str, echoed: tuple[bytes, bytes]
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
            self.log.write(arrived, fields)

    def _model(self, scope: Scope) -> str | None:
        """The model a request named (the router leaves path_params in the scope), or /predict's default."""
        name = scope.get("path_params", {}).get("name")
        if name is not None or scope["path"] != "/predict":
            return name if isinstance(name, str) else None
        if self.default_model is not None:
            return self.default_model
        service = getattr(getattr(scope.get("app"), "state", None), "service", None)
        models = getattr(service, "models", {})
        return next(iter(models)) if len(models) == 1 else None
