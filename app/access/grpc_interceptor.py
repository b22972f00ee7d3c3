"""The access layer of the gRPC server: the inference tokens, request ids and the access log.

Tokens come in the `authorization: Bearer <token>` metadata; without an inference token every
method answers UNAUTHENTICATED but ServerLive, ServerReady, the health service and reflection
(the probes, as over HTTP), and the model repository extension's, which take the admin tokens
(as /v2/repository/* over HTTP). The `x-request-id` metadata is taken (if sane) or made, set for the
call's log lines, and sent back in the trailing metadata, errors included. grpc.aio runs an
interceptor and the handler it leads to in one context, so the id set here reaches the handler;
so does, with tracing on, the `traceparent` metadata, for the data plane's request span, whose ids
come back in a Carrier (app/ops/tracing.py) for the access-log line.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc

from app.access.access_log import AccessLog, access_log
from app.access.request_id import HEADER, REQUEST_ID, choose
from app.access.tokens import TokenSet, bearer_token
from app.config import Settings
from app.ops.tracing import CARRIER, Carrier

log = logging.getLogger(__name__)
_INFERENCE_SERVICE = "/inference.GRPCInferenceService/"
# Whole method names, compared whole: a prefix would open any method a client names under it.
OPEN = frozenset(
    (
        _INFERENCE_SERVICE + "ServerLive",
        _INFERENCE_SERVICE + "ServerReady",
        "/grpc.health.v1.Health/Check",
        "/grpc.health.v1.Health/Watch",
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
    )
)
STREAM_INFER = _INFERENCE_SERVICE + "ModelStreamInfer"  # inference, many requests a call
# The model repository extension (app/model_control.py): the admin tokens', or the inference tokens'
# where no admin token is set — never less guarded than inference (app/access/auth.py's "repository").
REPOSITORY = frozenset(
    _INFERENCE_SERVICE + name for name in ("RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload")
)
SETTING = {
    "inference": "CGSERVE_AUTH_TOKENS or CGSERVE_AUTH_TOKENS_FILE",
    "admin": "CGSERVE_ADMIN_TOKENS or CGSERVE_ADMIN_TOKENS_FILE",
}


def server_interceptors(settings: Settings) -> list[grpc.aio.ServerInterceptor]:
    """The interceptor the settings call for, or none at all (the default)."""
    tokens = TokenSet.load(settings.auth_tokens, settings.auth_tokens_file)
    admin = TokenSet.load(settings.admin_tokens, settings.admin_tokens_file)
    traced = settings.tracing != "off"
    tracing = settings.request_ids or settings.access_log or traced
    if not tokens and not admin and not tracing:
        return []
    log = access_log() if settings.access_log else None
    return [AccessInterceptor(tokens=tokens, admin=admin, tracing=tracing, access_log=log, traced=traced)]


class AccessInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    def __init__(
        self,
        *,
        tokens: TokenSet,
        tracing: bool,
        access_log: AccessLog | None,
        traced: bool = False,
        admin: TokenSet | None = None,
    ) -> None:
        self.tokens = tokens
        self.admin = admin or TokenSet(())
        self.tracing = tracing
        self.log = access_log
        self.traced = traced  # OpenTelemetry on: the traceparent metadata to the request span

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        method: str = details.method
        pairs = details.invocation_metadata or ()
        metadata = dict(pairs)
        request_id = choose(metadata.get(HEADER)) if self.tracing else None
        if request_id is not None:
            REQUEST_ID.set(request_id)  # this call's own context, the handler's too
        carrier = Carrier(metadata.get("traceparent")) if self.traced else None
        if carrier is not None:
            CARRIER.set(carrier)
        kind = "repository" if method in REPOSITORY else "open" if method in OPEN else "inference"
        if kind == "repository":
            kind = "admin" if self.admin else "inference"
        tokens = self.admin if kind == "admin" else self.tokens if kind == "inference" else None
        if tokens:
            # Two of them: refused, not the first or the last (HTTP refuses them too, with 400).
            twice = sum(1 for key, _ in pairs if key == "authorization") > 1
            token = None if twice else bearer_token(metadata.get("authorization"))
            if token is None or not tokens.accepts(token):
                what = "is not an accepted token" if token is not None else "is missing"
                what = "is sent twice (`authorization` metadata more than once)" if twice else what
                message = (
                    f"{method}: the bearer token {what}; expected `authorization: Bearer <token>` metadata "
                    f"with one of the {kind} tokens ({SETTING[kind]})"
                )
                log.debug("refused %s: no %s token", method, "accepted" if token is not None else kind)
                # Refused before a message is read, as the stream of requests each call is registered as.
                if method == STREAM_INFER:
                    refusal = grpc.stream_stream_rpc_method_handler(_stream_refusal(message))
                    return self._traced_stream(method, request_id, refusal, carrier)
                return self._traced(method, request_id, _refusal(message), None, carrier)
        handler = await continuation(details)
        if request_id is None or handler is None:
            return handler
        if method == STREAM_INFER:
            return self._traced_stream(method, request_id, handler, carrier)
        if handler.stream_unary is None:
            return handler  # the other streams (health Watch, reflection): left as they are
        return self._traced(method, request_id, handler.stream_unary, handler, carrier)

    def _traced(
        self,
        method: str,
        request_id: str | None,
        behavior: Callable[[AsyncIterator[Any], grpc.aio.ServicerContext], Awaitable[Any]],
        handler: grpc.RpcMethodHandler | None,
        carrier: Carrier | None = None,
    ) -> grpc.RpcMethodHandler:
        """`behavior`, a call of one request (registered as a stream of requests: app/protocols/v2/grpc_methods.py),
        as a handler that sends the id back and writes the access-log line."""
        log = self.log

        async def traced(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
            if request_id is not None:
                context.set_trailing_metadata(((HEADER, request_id),))  # kept by abort() too
            if log is None:
                return await behavior(requests, context)
            call, read = _Call(method, request_id, context.peer(), carrier), _Read(requests)
            response, ended = None, None
            try:
                response = await behavior(read, context)
                return response
            except BaseException as error:  # cancelled (the client left, its deadline passed) or failed
                ended = error
                raise
            finally:
                request = read.request
                model = getattr(request, "model_name", None) or getattr(request, "name", None) or None
                log.write(call.arrived, call.fields(context, (_size(request), _size(response)), model, ended))

        if handler is None:  # a refusal: nothing is read
            return grpc.stream_unary_rpc_method_handler(traced)
        return grpc.stream_unary_rpc_method_handler(traced, handler.request_deserializer, handler.response_serializer)

    def _traced_stream(
        self, method: str, request_id: str | None, handler: grpc.RpcMethodHandler, carrier: Carrier | None
    ) -> grpc.RpcMethodHandler:
        """ModelStreamInfer's handler (or its refusal), sending the id back; with the access log on, one line
        for the whole stream as it ends (its status, bytes both ways, the model its first request named)."""
        log, behavior = self.log, handler.stream_stream

        async def traced(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            if request_id is not None:
                context.set_trailing_metadata(((HEADER, request_id),))
            # The handler's generator is closed with this one (aclosing), not whenever it is collected: a
            # stream the client cancels cancels its requests in flight at once.
            if log is None:
                async with contextlib.aclosing(behavior(requests, context)) as responses:
                    async for response in responses:
                        yield response
                return
            call, ended = _Call(method, request_id, context.peer(), carrier), None
            bytes_in, bytes_out, model = 0, 0, None

            async def counted(requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
                nonlocal bytes_in, model
                async for request in requests:
                    bytes_in += _size(request)
                    model = model or getattr(request, "model_name", None) or None
                    yield request

            try:
                async with contextlib.aclosing(behavior(counted(requests), context)) as responses:
                    async for response in responses:
                        bytes_out += _size(response)
                        yield response
            except BaseException as error:  # cancelled, closed early or failed (a message it could not read)
                ended = error
                raise
            finally:
                log.write(call.arrived, call.fields(context, (bytes_in, bytes_out), model, ended))

        return grpc.stream_stream_rpc_method_handler(traced, handler.request_deserializer, handler.response_serializer)


class _Read:
    """A call's requests, as read: the last one, for the access-log line (None where none was read)."""

    def __init__(self, requests: AsyncIterator[Any]) -> None:
        self.requests = requests
        self.request: Any = None

    def __aiter__(self) -> _Read:
        return self

    async def __anext__(self) -> Any:
        self.request = await anext(self.requests)
        return self.request


@dataclass(slots=True)
class _Call:
    """What a call's access-log line takes from its start: the peer is gone once the call has ended."""

    method: str
    request_id: str | None
    peer: str
    carrier: Carrier | None
    arrived: float = field(default_factory=time.time)
    started: float = field(default_factory=time.perf_counter)

    def fields(
        self, context: grpc.aio.ServicerContext, sizes: tuple[int, int], model: object, ended: BaseException | None
    ) -> dict[str, object]:
        """The line as the call ends: `sizes` its bytes in and out, `ended` what ended it early, if anything did
        (then not OK: the context holds a code only where the handler set one)."""
        code = context.code()
        if code is None and ended is not None:
            cancelled = isinstance(ended, asyncio.CancelledError | GeneratorExit)
            code = ended_by_client(context) if cancelled else grpc.StatusCode.UNKNOWN
        code = code or grpc.StatusCode.OK
        fields = {
            "request_id": self.request_id,
            "protocol": "grpc",
            "method": "POST",
            "path": self.method,
            "status": getattr(code, "name", str(code)),
            "duration_ms": round((time.perf_counter() - self.started) * 1000, 3),
            "bytes_in": sizes[0],
            "bytes_out": sizes[1],
            "client": _peer_host(self.peer),
            "model": model,
        }
        if self.carrier is not None:  # tracing on: the request span's ids (None where none was made)
            fields["trace_id"], fields["span_id"] = self.carrier.trace_id, self.carrier.span_id
        return fields


def ended_by_client(context: grpc.aio.ServicerContext) -> grpc.StatusCode:
    """Why a call's handler was cancelled: its deadline passed, or the client cancelled it."""
    remaining = context.time_remaining()
    return (
        grpc.StatusCode.DEADLINE_EXCEEDED if remaining is not None and remaining < 0.01 else grpc.StatusCode.CANCELLED
    )


def _refusal(message: str) -> Callable[[AsyncIterator[Any], grpc.aio.ServicerContext], Awaitable[Any]]:
    async def refuse(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    return refuse


def _stream_refusal(message: str) -> Callable[[AsyncIterator[Any], grpc.aio.ServicerContext], AsyncIterator[Any]]:
    async def refuse(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)
        yield  # never reached (abort raises): it makes this a stream's handler

    return refuse


def _size(message: Any) -> int:
    """A protobuf message's encoded size (0: none was read)."""
    if message is None:
        return 0
    if isinstance(message, bytes | bytearray):
        return len(message)
    return int(message.ByteSize()) if hasattr(message, "ByteSize") else 0


def _peer_host(peer: str) -> str:
    """ "ipv4:127.0.0.1:5000" → "127.0.0.1"; "ipv6:[::1]:5000" → "::1"."""
    kind, _, address = peer.partition(":")
    if kind not in ("ipv4", "ipv6"):
        return peer
    host = address.rpartition(":")[0]
    return host.strip("[]") if kind == "ipv6" else host
