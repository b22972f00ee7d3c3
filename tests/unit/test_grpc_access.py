"""The gRPC access interceptor (app/access/grpc_interceptor.py) on its own: which methods are
open, and that a call with two `authorization` entries is refused whichever of them is right
(it took the last one; HTTP took the first: issue 24.8)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from app.access.grpc_interceptor import AccessInterceptor
from app.access.tokens import TokenSet

TOKEN = "inference-token-0123456789abcdef"
WRONG = "not-a-token-of-this-server-01234"
INFER = "/inference.GRPCInferenceService/ModelInfer"
STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"


class Details:
    def __init__(self, method: str, metadata: tuple[tuple[str, str], ...]) -> None:
        self.method, self.invocation_metadata = method, metadata


class Aborted(Exception):
    pass


class Context:
    def set_trailing_metadata(self, metadata: Any) -> None:
        pass

    async def abort(self, code: grpc.StatusCode, message: str) -> None:
        raise Aborted(code, message)


async def outcome(method: str, *metadata: tuple[str, str]) -> str:
    """ "served" where the call reaches its handler, else the refusal's status code and message."""
    interceptor = AccessInterceptor(tokens=TokenSet([TOKEN]), tracing=False, access_log=None)

    async def continuation(details: Any) -> str:
        return "served"

    handler = await interceptor.intercept_service(continuation, Details(method, metadata))
    if handler == "served":
        return "served"
    assert (handler.stream_stream is not None) == (method == STREAM)  # a stream is refused as a stream
    with pytest.raises(Aborted) as refused:  # its messages never read: a call of one is a stream of one
        if method == STREAM:
            await anext(handler.stream_stream(unread(), Context()))
        else:
            await handler.stream_unary(unread(), Context())
    code, message = refused.value.args
    return f"{code.name}: {message}"


async def unread() -> AsyncIterator[bytes]:
    raise AssertionError("a refused stream's messages were read")
    yield b""  # a stream of requests, as grpc.aio hands a stream's handler


@pytest.mark.anyio
@pytest.mark.parametrize("method", [INFER, STREAM])
async def test_one_right_token_is_served_and_none_or_a_wrong_one_refused(method: str) -> None:
    assert await outcome(method, ("authorization", f"Bearer {TOKEN}")) == "served"
    assert (await outcome(method)).startswith("UNAUTHENTICATED")
    assert (await outcome(method, ("authorization", f"Bearer {WRONG}"))).startswith("UNAUTHENTICATED")


@pytest.mark.anyio
@pytest.mark.parametrize("order", ["right last", "right first", "both right"])
async def test_two_authorization_entries_are_refused_whichever_is_right(order: str) -> None:
    first, last = {"right last": (WRONG, TOKEN), "right first": (TOKEN, WRONG), "both right": (TOKEN, TOKEN)}[order]
    answer = await outcome(INFER, ("authorization", f"Bearer {first}"), ("authorization", f"Bearer {last}"))
    assert answer.startswith("UNAUTHENTICATED") and "twice" in answer


@pytest.mark.anyio
@pytest.mark.parametrize(
    "method",
    [
        "/inference.GRPCInferenceService/ServerLive",
        "/inference.GRPCInferenceService/ServerReady",
        "/grpc.health.v1.Health/Check",
        "/grpc.health.v1.Health/Watch",
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
    ],
)
async def test_the_probes_and_reflection_stay_open(method: str) -> None:
    assert await outcome(method) == "served"


@pytest.mark.anyio
@pytest.mark.parametrize(
    "method",
    [
        "/grpc.health.v1.Health/../inference.GRPCInferenceService/ModelInfer",
        "/grpc.reflection.x/ModelInfer",
        "/inference.GRPCInferenceService/ServerLiveX",
        "/inference.GRPCInferenceService/ServerLive\n",
    ],
)
async def test_only_whole_open_names_are_open(method: str) -> None:
    assert (await outcome(method)).startswith("UNAUTHENTICATED")


@pytest.mark.anyio
@pytest.mark.parametrize("call", ["RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload"])
async def test_model_control_takes_the_inference_tokens_where_no_admin_token_is_set(call: str) -> None:
    """Never less guarded than an inference call: with only inference tokens set, a load is not open."""
    method = f"/inference.GRPCInferenceService/{call}"
    refused = await outcome(method)
    assert refused.startswith("UNAUTHENTICATED") and "inference tokens" in refused
    assert await outcome(method, ("authorization", f"Bearer {TOKEN}")) == "served"
