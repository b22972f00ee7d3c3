"""The inference routes as one raw ASGI callable in front of the app's router.

A POST to /predict, /v1/models/{name}/predict or /v2/models/{name}[/versions/{v}]/infer with a body
the route takes is answered here, on the request's one task: its body read from `receive`, the data
plane's `infer` with the route's own codec, the answer written with two `send`s. No Starlette routing,
no exception or exit-stack middleware, no Request or Response objects. Everything else (a 415, every
other path) goes on to the app. It stands inside the request guard (app/http/limits.py), so the
body limits, the bytes-in-flight budget and the deadline hold here as everywhere; only public,
versioned interfaces are used: ASGI's scope, receive and send.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from app.errors import ClientClosedError
from app.http.answer import HttpBody
from app.http.heads import read_head
from app.http.inline_routes import PREDICT, form_of, route_of
from app.http.limits import HEAD_KEY, deadline_of


class FastPath:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        target = route_of(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if target is None:
            await self.app(scope, receive, send)
            return
        route, model, version = target
        if model:  # as the router leaves them, for the access log
            scope["path_params"] = {"name": model} if version is None else {"name": model, "version": version}
        head = scope.get(HEAD_KEY) or read_head(scope["headers"])  # the guard's, read once
        media, header_length = head.media, head.header_length
        form = form_of(route, media, header_length)
        if form is None:  # a body the route refuses (415)
            await self.app(scope, receive, send)
            return

        async def read() -> HttpBody:
            chunks = []
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise ClientClosedError("the client went away before its answer")
                chunks.append(message.get("body", b""))
                if not message.get("more_body", False):
                    break
            length = None if header_length is None else header_length.decode("latin-1")
            media_text, query = (media or b"").decode("latin-1"), scope["query_string"].decode("latin-1")
            return HttpBody(b"".join(chunks), media_text, query, length, head.content_type)

        state = scope["app"].state  # set by the app the request came in through, for every ASGI request
        answer = await state.plane.infer(
            state.predict_codec if route == PREDICT else state.v2_codec,
            read,
            model=model,
            version=version,
            form=form,
            deadline=deadline_of(scope, state.plane.service.settings.request_timeout_s),
            path=scope["path"],
        )
        await send({"type": "http.response.start", "status": answer.status, "headers": answer.raw_headers()})
        await send({"type": "http.response.body", "body": answer.body})
