"""ASGI middleware that refuses request bodies over a size limit (413) without buffering them.

A declared Content-Length over the limit is answered at once (one within it needs no more
work: the HTTP parser delivers no more than it declares); a chunked body is counted as it
arrives and the read that crosses the limit raises BodyTooLargeError in the handler.
"""

from __future__ import annotations

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app import metrics
from app.errors import BodyTooLargeError


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, *, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD"):
            await self.app(scope, receive, send)
            return
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit():
                if int(value) > self.max_bytes:
                    await self._refuse(send)
                    return
                # The HTTP parser delivers no more than the declared length: nothing to count.
                await self.app(scope, receive, send)
                return
        received = 0  # a chunked body: count it as it arrives

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLargeError(self.max_bytes)
            return message

        await self.app(scope, limited_receive, send)

    async def _refuse(self, send: Send) -> None:
        error = BodyTooLargeError(self.max_bytes)
        metrics.reject("", error.reason)
        body = orjson.dumps(error.body())
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        # The client may still be sending: close the connection rather than read the body.
        headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": error.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
