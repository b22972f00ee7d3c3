"""A gRPC call's one request message, read within a bound (app/protocols/v2/grpc_methods.py registers every method
of one request as a handler of a stream of them, so that it is read here).

grpcio's unary handlers wait for the message for ever: a call that ended without one was never answered, and one
whose message never ended held its connection until the connection's age. Here the message comes within the
service's timeout, or the call ends DEADLINE_EXCEEDED; a call ended without one is INVALID_ARGUMENT; one the client
cancelled or let run out of time is its own leaving. No protobuf module is imported here: the tests load this
beside tritonclient's messages, which define the same names.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextvars import ContextVar
from typing import Any

import grpc

# When the call in this task began (time.monotonic()), set once its one message has come: its deadline counts the
# message's arrival, as an HTTP request's counts its body (app/protocols/v2/grpc_server.py's _infer).
CALL_STARTED: ContextVar[float | None] = ContextVar("cgserve_call_started", default=None)


async def one_request(requests: AsyncIterator[Any], context: Any, within_s: float, expected: str) -> Any:
    """The call's one request message, once it has come whole; the call ends INVALID_ARGUMENT where the client
    ended it without one, and DEADLINE_EXCEEDED where it has not come whole within `within_s` of the call's start
    (a client's own nearer deadline ends the call itself)."""
    task = asyncio.current_task()
    assert task is not None
    started = time.monotonic()
    expired = False

    def expire() -> None:
        nonlocal expired
        expired = True
        task.cancel()

    timer = asyncio.get_running_loop().call_later(within_s, expire)
    try:
        request = await anext(requests, None)
    except asyncio.CancelledError:
        if not expired:
            raise  # the client cancelled, or its deadline passed
        task.uncancel()
        await context.abort(
            grpc.StatusCode.DEADLINE_EXCEEDED,
            f"the request message did not come whole within {within_s:g} s of the call's start "
            f"(CGSERVE_REQUEST_TIMEOUT_S); expected one {expected}",
        )
    finally:
        timer.cancel()
    if request is None:
        # grpcio ends the read with None for a client that cancelled or ran out of time too: theirs, not a message
        # missing (the access log says CANCELLED or DEADLINE_EXCEEDED, as for any call they leave).
        remaining = context.time_remaining()
        await asyncio.sleep(0)  # grpcio marks a cancelled call on the loop's next turn
        if (remaining is not None and remaining < 0.01) or context.cancelled() or context.done():
            raise asyncio.CancelledError
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT, f"the call ended without a request message; expected one {expected}"
        )
    CALL_STARTED.set(started)
    return request


def reading_one(
    method: Callable[[Any, Any], Awaitable[Any]], within_s: float, expected: str
) -> Callable[[AsyncIterator[Any], Any], Awaitable[Any]]:
    """`method` of one request as a handler of a stream of requests: its request read by one_request."""

    async def call(requests: AsyncIterator[Any], context: Any) -> Any:
        return await method(await one_request(requests, context, within_s, expected), context)

    return call
