"""A stream of requests answered concurrently, each answer sent as soon as it is ready (ModelStreamInfer).

One request's answer does not wait for the one before it: a client keeps many in flight on one
stream, as it would with many calls. `limit` bounds what a stream holds, counting a request from
the moment it is read until its answer is sent, so a client that writes without reading its
answers is held back too (the stream is not read; HTTP/2's flow control stops the client). Its
requests' rows are bounded too, by a RowBudget the streams of one connection share (a quarter of a
model's queue in the server, ConnectionBudgets): one stream of 128-image requests held 256 of them,
32,768 rows, where the queue takes 4,096, and every other client was refused 503 while it streamed.
Past the budget a stream waits for its own answers (or its connection's other streams') before it
reads on, as past `limit`; a request larger than the whole budget waits until the connection's
streams hold nothing else. When
the server stops, a stream stops reading, sends the answers of the requests it holds, and ends
with StreamStopped: the client sends again every request that has no answer. (A request whose read
completes just as the stop cancels it is dropped unanswered: a pending read cannot be withdrawn
without that chance, and the client resends it with the others.)
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterator
from typing import TypeVar

Request = TypeVar("Request")
Answer = TypeVar("Answer")


class StreamStopped(Exception):
    """The server stopped the stream after answering the requests it held; the rest are the client's to resend."""


class RowBudget:
    """Rows held by the streams that share it, taken by a stream's reader before a request starts and given back
    as its answer is sent."""

    def __init__(self, limit: int) -> None:
        self.limit, self.held = limit, 0
        self._given_back = asyncio.Event()

    async def take(self, rows: int) -> int:
        rows = min(max(rows, 1), self.limit)  # a request past the whole budget waits until nothing is held
        while self.held + rows > self.limit:  # each waiter looks again after every give-back: several may wait
            self._given_back.clear()
            await self._given_back.wait()
        self.held += rows
        return rows

    def give_back(self, rows: int) -> None:
        self.held -= rows
        self._given_back.set()


class ConnectionBudgets:
    """One RowBudget of `limit` rows a connection, shared by its streams: made with its first stream and forgotten
    with its last (a client opening four streams on one connection holds no more than with one)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._shared: dict[str, tuple[RowBudget, int]] = {}  # connection → (its budget, its streams)

    @contextlib.contextmanager
    def of(self, connection: str) -> Iterator[RowBudget]:
        budget, streams = self._shared.get(connection) or (RowBudget(self.limit), 0)
        self._shared[connection] = (budget, streams + 1)
        try:
            yield budget
        finally:
            budget, streams = self._shared[connection]
            if streams == 1:
                del self._shared[connection]
            else:
                self._shared[connection] = (budget, streams - 1)


async def answer_stream(
    requests: AsyncIterator[Request],
    answer: Callable[[Request], Awaitable[Answer]],
    limit: int,
    stop: asyncio.Event | None = None,
    *,
    rows: Callable[[Request], int] = lambda _: 1,
    row_budget: RowBudget | None = None,
) -> AsyncGenerator[Answer, None]:
    """Each of `requests` answered by `answer` (which answers errors too: only cancelling raises), yielded in
    the order the answers are ready. The stream ends once the client has sent its last request and every
    answer is out; a request that cannot be read (malformed, too large) ends it with that error once the
    requests in flight are answered; `stop` set (the server stopping) ends it so too, with StreamStopped.
    Closed early (the client cancelled, its deadline passed), it cancels every request in flight.
    `rows(request)` is what a request weighs against `row_budget` (None: a budget of `limit`, which one row a
    request never passes: requests are then bounded by `limit` alone)."""
    answers: asyncio.Queue[tuple[Answer, int] | None] = asyncio.Queue()  # (an answer, its rows); None: the end
    room = asyncio.Semaphore(limit)  # a slot a request, freed once its answer is sent
    budget = row_budget if row_budget is not None else RowBudget(limit)
    in_flight: set[asyncio.Task[None]] = set()
    reading, stopped = True, False  # still reading the client's requests; stopped doing so for `stop`
    closing = False  # the stream is being closed (its client left): a stop no longer applies

    async def one(request: Request, held: int) -> None:
        try:
            answers.put_nowait((await answer(request), held))
        except BaseException:  # cancelled with its stream: no answer to send, its slot and rows are free
            room.release()
            budget.give_back(held)
            raise

    def start(request: Request, held: int) -> None:
        task = asyncio.create_task(one(request, held))
        in_flight.add(task)
        task.add_done_callback(in_flight.discard)

    async def read_all() -> None:
        nonlocal reading
        reads = aiter(requests)
        try:
            while True:
                await room.acquire()  # a slot first, then the next request: none is read that cannot be held
                try:
                    request = await anext(reads)
                except StopAsyncIteration:
                    room.release()
                    break
                try:
                    held = await budget.take(rows(request))
                except asyncio.CancelledError:
                    if stopped:  # read already, waiting for rows as the server stops: answered too, past the budget
                        start(request, 0)
                    raise
                start(request, held)
        except asyncio.CancelledError:
            if not stopped:  # the stream is closing: cancelled with it
                raise
        finally:
            reading = False
            if in_flight:  # the last request read (or a read failed, or the server stops): still answered
                await asyncio.wait(in_flight)
            answers.put_nowait(None)

    def stop_reading(_: object) -> None:
        nonlocal stopped
        if reading and not closing:  # else the client sent its last request, or left: the stream ends as it would
            stopped = True
            reader.cancel()  # a read waiting for the client's next request ends (see the module's note)

    reader = asyncio.create_task(read_all(), name="stream-reader")
    stopping = asyncio.ensure_future(stop.wait()) if stop is not None else None
    if stopping is not None:
        stopping.add_done_callback(stop_reading)
    try:
        while (sent := await answers.get()) is not None:
            response, held = sent
            yield response
            room.release()
            budget.give_back(held)
        await reader  # raises what ended the reading, if anything did
        if stopped:
            raise StreamStopped
    finally:  # a no-op where the stream ended by itself
        closing = True  # a stop_reading already queued must not take the close's cancel for its own
        if stopping is not None:
            stopping.remove_done_callback(stop_reading)
            stopping.cancel()
        reader.cancel()
        for task in list(in_flight):
            task.cancel()
