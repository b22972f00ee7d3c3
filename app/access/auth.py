"""Bearer-token access control for HTTP, by kind of route.

    inference  POST /predict, POST /v1/models/{name}/predict, everything under /v2 but /v2/health/*
    admin      /metrics, GET /v1/models, /v1/models/{name}, /v1/models/{name}/ready
    open       /healthz, /readyz, /v2/health/live and /ready (probes), /docs, /redoc, /openapi.json

Each kind has its own tokens (CGSERVE_AUTH_TOKENS, CGSERVE_ADMIN_TOKENS and their files); a kind
whose set is empty stays open, as everything is by default. A refused request gets 401 with
`WWW-Authenticate: Bearer` before its body is read, in the envelope of the route's protocol.
"""

from __future__ import annotations

import logging
import re
from typing import Literal

from starlette.types import ASGIApp, Receive, Scope, Send

from app import metrics
from app.access.tokens import TokenSet, bearer_token
from app.errors import UnauthorizedError, error_response
from app.v2.rest import v2_error

log = logging.getLogger(__name__)
Kind = Literal["inference", "admin", "open"]
_INFERENCE = re.compile(r"^/(predict|v1/models/[^/]+/predict|v2(?!/health/)(/.*)?)$")
_ADMIN = re.compile(r"^/(metrics|v1/models)(/.*)?$")
SETTING = {
    "inference": "CGSERVE_AUTH_TOKENS or CGSERVE_AUTH_TOKENS_FILE",
    "admin": "CGSERVE_ADMIN_TOKENS or CGSERVE_ADMIN_TOKENS_FILE",
}


def route_kind(path: str) -> Kind:
    if _INFERENCE.match(path):
        return "inference"
    if _ADMIN.match(path):
        return "admin"
    return "open"


class AuthMiddleware:
    def __init__(self, app: ASGIApp, *, inference: TokenSet, admin: TokenSet) -> None:
        self.app = app
        self.tokens: dict[Kind, TokenSet] = {"inference": inference, "admin": admin}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            kind = route_kind(scope["path"])
            tokens = self.tokens.get(kind)
            if tokens:
                header = next((value for name, value in scope["headers"] if name == b"authorization"), None)
                token = bearer_token(header)
                if token is None or not tokens.accepts(token):
                    await self._refuse(scope, receive, send, kind, invalid=token is not None)
                    return
        await self.app(scope, receive, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, kind: Kind, *, invalid: bool) -> None:
        what = "is not an accepted token" if invalid else "is missing"
        error = UnauthorizedError(
            f"{scope['method']} {scope['path']}: the bearer token {what}",
            expected=f"an Authorization: Bearer <token> header with one of the {kind} tokens ({SETTING[kind]})",
            invalid=invalid,
        )
        log.debug("refused %s %s: no %s token", scope["method"], scope["path"], "accepted" if invalid else kind)
        # No model label: the name in the path is the unauthenticated client's to choose.
        metrics.reject("", error.reason)
        response = v2_error(error) if scope["path"].startswith("/v2") else error_response(error)
        await response(scope, receive, send)
