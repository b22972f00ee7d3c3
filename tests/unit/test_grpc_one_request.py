"""app/protocols/v2/grpc_reads.py's one_request: a call's one message, or why there is none. grpcio ends the read
with None for a call the client ended without a message, and for one it cancelled or let run out of time: only the
first is the client's error (INVALID_ARGUMENT); the others are counted as the client's leaving."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import grpc
import pytest

from app.protocols.v2.grpc_reads import CALL_STARTED, one_request


class Aborted(Exception):
    pass


class Context:
    def __init__(self, *, cancelled: bool = False, remaining: float | None = None) -> None:
        self._cancelled, self._remaining = cancelled, remaining

    def time_remaining(self) -> float | None:
        return self._remaining

    def cancelled(self) -> bool:
        return self._cancelled

    def done(self) -> bool:
        return self._cancelled

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise Aborted(code, details)


async def no_message() -> AsyncIterator[bytes]:
    return
    yield b""  # a stream of requests, as grpc.aio hands it


async def one(message: bytes) -> AsyncIterator[bytes]:
    yield message


def read(context: Context, requests: AsyncIterator[bytes] | None = None) -> bytes:
    return asyncio.run(one_request(requests or no_message(), context, 5.0, "inference.ModelInferRequest"))


def test_its_message_and_when_its_call_began() -> None:
    """The call's start stays with its task, for its deadline: a message that took long to come counts in it."""

    async def call() -> tuple[bytes, float | None, float]:
        before = time.monotonic()
        request = await one_request(one(b"request"), Context(), 5.0, "inference.ModelInferRequest")
        return request, CALL_STARTED.get(), before

    request, started, before = asyncio.run(call())
    assert request == b"request" and started is not None and before <= started <= time.monotonic()


def test_a_call_ended_without_a_message_is_invalid_argument() -> None:
    with pytest.raises(Aborted) as refused:
        read(Context())
    code, details = refused.value.args
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "ended without a request message" in details


@pytest.mark.parametrize("context", [Context(cancelled=True), Context(remaining=0.0)], ids=["cancelled", "deadline"])
def test_a_call_the_client_left_is_cancelled_not_refused(context: Context) -> None:
    """It was refused INVALID_ARGUMENT, and the access log counted a client's leaving as a malformed request."""
    with pytest.raises(asyncio.CancelledError):
        read(context)
