"""Which access layers the app gets: only those the settings turn on, none by default.

Outermost first: request ids and the access log (RequestContextMiddleware), CORS (so that a browser's
preflight is answered before any token is asked for, and a 401 carries its CORS headers), then
the tokens (AuthMiddleware). They wrap the whole Starlette stack, error middleware included.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from app.access.access_log import access_log
from app.access.auth import AuthMiddleware
from app.access.request_context import RequestContextMiddleware
from app.access.request_id import install_log_filter
from app.access.tokens import TokenSet
from app.config import Settings

# What a browser may send and read across origins: the token, the id, the v2 binary extension.
CORS_REQUEST_HEADERS = ("authorization", "content-type", "x-request-id", "inference-header-content-length")
CORS_EXPOSED_HEADERS = ("x-request-id", "inference-header-content-length", "retry-after", "www-authenticate")


class AccessLayers:
    """The app inside the layers the settings turn on, wrapped explicitly: ASGI calls go through them,
    outermost first, and everything else (state, routes, openapi) is the app's own. Outside Starlette's
    ServerErrorMiddleware (add_middleware would put them inside it), so a 500 it answers still gets its
    request id, CORS headers and access-log line."""

    def __init__(self, app: FastAPI, layers: list[Callable[[ASGIApp], ASGIApp]]) -> None:
        self.app = app
        stack: ASGIApp = app
        for layer in reversed(layers):
            stack = layer(stack)
        self._stack = stack

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._stack(scope, receive, send)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.app, name)


def access_layers(settings: Settings) -> list[Callable[[ASGIApp], ASGIApp]]:
    """The layers, outermost first, each a function of the app inside it."""
    layers: list[Callable[[ASGIApp], ASGIApp]] = []
    if settings.request_ids or settings.access_log or settings.tracing != "off":
        install_log_filter()
        log = access_log() if settings.access_log else None
        traced = settings.tracing != "off"  # the traceparent header to the request span, its ids to the log
        layers.append(lambda app: RequestContextMiddleware(app, access_log=log, tracing=traced))
    if settings.cors_origins:
        origins = list(settings.cors_origins)
        layers.append(
            lambda app: CORSMiddleware(
                app,
                allow_origins=origins,
                allow_methods=("GET", "POST"),
                allow_headers=CORS_REQUEST_HEADERS,
                expose_headers=CORS_EXPOSED_HEADERS,
            )
        )
    inference = TokenSet.load(settings.auth_tokens, settings.auth_tokens_file)
    admin = TokenSet.load(settings.admin_tokens, settings.admin_tokens_file)
    if inference or admin:
        layers.append(lambda app: AuthMiddleware(app, inference=inference, admin=admin))
    return layers
