"""Bearer-token access control for HTTP, by kind of route.

    inference  POST /predict, POST /v1/models/{name}/predict, everything under /v2 but /v2/health/* and
               /v2/repository/*
    admin      /metrics, GET /v1/models, /v1/models/{name}, /v1/models/{name}/ready
    repository /v2/repository/* (the model repository extension: index, load, unload): the admin tokens, or the
               inference tokens where no admin token is set (never open while either kind has tokens)
    open       /healthz, /readyz, /v2/health/live and /ready (probes), /docs, /redoc, /openapi.json

Inference and admin have their own tokens (CGSERVE_AUTH_TOKENS, CGSERVE_ADMIN_TOKENS and their files); a kind
whose set is empty stays open, as everything is by default. A refused request gets 401 with
`WWW-Authenticate: Bearer` before its body is read, in the envelope of the route's protocol.

A path decides access only as a whole (fullmatch; no `.` that stops at a newline, no `$` that
passes one), and a path with a control character in it (percent-decoded, e.g. %0A) gets 400
before it is matched at all: no route serves one, and the guarded protocol refuses it too.
"""

from __future__ import annotations

import logging
import re
from typing import Literal

from starlette.types import ASGIApp, Receive, Scope, Send

from app.access.tokens import TokenSet, bearer_token
from app.errors import InputError, UnauthorizedError, error_response
from app.ops import metrics
from app.protocols.v2.rest import v2_error

log = logging.getLogger(__name__)
Kind = Literal["inference", "admin", "repository", "open"]
_INFERENCE = re.compile(r"/(predict|v1/models/[^/]+/predict|v2(?!/health/)(/[\s\S]*)?)")
_ADMIN = re.compile(r"/(metrics|v1/models)(/[\s\S]*)?")
# Model control: the admin tokens', or the inference tokens' where no admin token is set (a load or an
# unload is never less guarded than an inference call).
_REPOSITORY = re.compile(r"/v2/repository(/[\s\S]*)?")
CONTROL = re.compile(r"[\x00-\x1f\x7f]")  # in a decoded path: what no route of ours has
SETTING = {
    "inference": "CGSERVE_AUTH_TOKENS or CGSERVE_AUTH_TOKENS_FILE",
    "admin": "CGSERVE_ADMIN_TOKENS or CGSERVE_ADMIN_TOKENS_FILE",
}


def route_kind(path: str) -> Kind:
    """The kind of a path without control characters (the middleware refuses those first)."""
    if _REPOSITORY.fullmatch(path):
        return "repository"
    if _INFERENCE.fullmatch(path):
        return "inference"
    if _ADMIN.fullmatch(path):
        return "admin"
    return "open"


class AuthMiddleware:
    def __init__(self, app: ASGIApp, *, inference: TokenSet, admin: TokenSet) -> None:
        self.app = app
        self.tokens: dict[Kind, TokenSet] = {"inference": inference, "admin": admin, "repository": admin or inference}
        self.named: dict[Kind, str] = {"inference": "inference", "admin": "admin",
                                       "repository": "admin" if admin else "inference"}  # fmt: skip

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            if CONTROL.search(scope["path"]):
                message = f"{scope['method']} {scope['path']!r}: the path holds a control character"
                expected = "a path without control characters (%00-%1F, %7F), encoded or not"
                await self._bad_request(scope, receive, send, message, expected)
                return
            kind = route_kind(scope["path"])
            tokens = self.tokens.get(kind)
            if tokens:
                sent = [value for name, value in scope["headers"] if name == b"authorization"]
                if len(sent) > 1:  # which one counts? Neither (the guarded protocol refuses them too)
                    await self._bad_request(scope, receive, send, f"{len(sent)} Authorization headers",
                                            "at most one Authorization header")  # fmt: skip
                    return
                token = bearer_token(sent[0] if sent else None)
                if token is None or not tokens.accepts(token):
                    await self._refuse(scope, receive, send, kind, invalid=token is not None)
                    return
        await self.app(scope, receive, send)

    async def _bad_request(self, scope: Scope, receive: Receive, send: Send, message: str, expected: str) -> None:
        error = InputError(message, expected=expected, status=400, code="bad_request")
        metrics.reject("", error.reason)
        response = v2_error(error) if scope["path"].startswith("/v2") else error_response(error)
        await response(scope, receive, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, kind: Kind, *, invalid: bool) -> None:
        what = "is not an accepted token" if invalid else "is missing"
        named = self.named[kind]
        error = UnauthorizedError(
            f"{scope['method']} {scope['path']}: the bearer token {what}",
            expected=f"an Authorization: Bearer <token> header with one of the {named} tokens ({SETTING[named]})",
            invalid=invalid,
        )
        log.debug("refused %s %s: no %s token", scope["method"], scope["path"], "accepted" if invalid else named)
        # No model label: the name in the path is the unauthenticated client's to choose.
        metrics.reject("", error.reason)
        response = v2_error(error) if scope["path"].startswith("/v2") else error_response(error)
        await response(scope, receive, send)
