"""A stream of requests answered concurrently, each answer sent as soon as it is ready (ModelStreamInfer).

One request's answer does not wait for the one before it: a client keeps many in flight on one
stream, as it would with many calls. `limit` bounds what a stream holds, counting a request from
the moment it is read until its answer is sent, so a client that writes without reading its
answers is held back too (the stream is not read; HTTP/2's flow control stops the client).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import TypeVar

Request = TypeVar("Request")
Answer = TypeVar("Answer")


async def answer_stream(
    requests: AsyncIterator[Request], answer: Callable[[Request], Awaitable[Answer]], limit: int
) -> AsyncGenerator[Answer, None]:
    """Each of `requests` answered by `answer` (which answers errors too: only cancelling raises), yielded in
    the order the answers are ready. The stream ends once the client has sent its last request and every
    answer is out; a request that cannot be read (malformed, too large) ends it with that error once the
    requests in flight are answered. Closed early (the client cancelled, its deadline passed), it cancels
    every request in flight."""
    answers: asyncio.Queue[Answer | None] = asyncio.Queue()  # None: the end
    room = asyncio.Semaphore(limit)  # a slot a request, freed once its answer is sent
    in_flight: set[asyncio.Task[None]] = set()

    async def one(request: Request) -> None:
        try:
            answers.put_nowait(await answer(request))
        except BaseException:  # cancelled with its stream: no answer to send, its slot is free
            room.release()
            raise

    async def read_all() -> None:
        try:
            async for request in requests:
                await room.acquire()
                task = asyncio.create_task(one(request))
                in_flight.add(task)
                task.add_done_callback(in_flight.discard)
        finally:
            if in_flight:  # the last request read (or a read failed): those in flight still get answered
                await asyncio.wait(in_flight)
            answers.put_nowait(None)

    reader = asyncio.create_task(read_all(), name="stream-reader")
    try:
        while (response := await answers.get()) is not None:
            yield response
            room.release()
        await reader  # raises what ended the reading, if anything did
    finally:  # a no-op where the stream ended by itself
        reader.cancel()
        for task in list(in_flight):
            task.cancel()
