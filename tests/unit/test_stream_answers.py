"""A stream's requests answered concurrently (app/protocols/v2/stream_answers.py, ModelStreamInfer's core):
how many requests it holds when the client does not read its answers, answers in the order they are ready,
and what closing it early, a failed read or the server stopping does to the requests in flight."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from app.protocols.v2.stream_answers import ConnectionBudgets, RowBudget, StreamStopped, answer_stream

LIMIT = 16


async def settle() -> None:
    """Let every task run as far as it can."""
    for _ in range(100):
        await asyncio.sleep(0)


def collect(
    requests: AsyncIterator[int], answer: Callable[[int], Awaitable[int]], stop: asyncio.Event | None = None
) -> tuple[asyncio.Task[None], list[int]]:
    """The client reading the stream to its end: its task, and the answers it has read so far."""
    answers: list[int] = []

    async def read_all() -> None:
        async for one in answer_stream(requests, answer, LIMIT, stop):
            answers.append(one)

    return asyncio.create_task(read_all()), answers


@pytest.mark.anyio
async def test_a_stream_whose_answers_are_not_read_is_not_read_either() -> None:
    """An answer holds its request's slot until it is sent: a client that writes and never reads has LIMIT
    requests taken, not all it wrote."""
    read = 0

    async def requests() -> AsyncIterator[int]:
        nonlocal read
        for n in range(10 * LIMIT):
            read += 1
            yield n

    async def at_once(request: int) -> int:
        return request

    stream = answer_stream(requests(), at_once, LIMIT)
    assert await anext(stream) == 0  # sent; the client reads nothing more
    await settle()
    assert read == LIMIT
    assert [await anext(stream) for _ in range(3)] == [1, 2, 3]  # each answer sent frees a slot
    await settle()
    assert read == LIMIT + 3
    await stream.aclose()


@pytest.mark.anyio
async def test_answers_come_as_they_are_ready_and_the_stream_ends_after_the_last() -> None:
    gates = {n: asyncio.Event() for n in range(3)}

    async def requests() -> AsyncIterator[int]:
        for n in range(3):
            yield n

    async def held(request: int) -> int:
        await gates[request].wait()
        return request

    reading, answers = collect(requests(), held)
    for n in (2, 0, 1):
        gates[n].set()
        await settle()
    await asyncio.wait_for(reading, 5)  # the client's stream ended: so does ours, every answer out
    assert answers == [2, 0, 1]


@pytest.mark.anyio
async def test_closing_the_stream_cancels_the_requests_in_flight() -> None:
    cancelled: list[int] = []

    async def requests() -> AsyncIterator[int]:
        for n in range(3):
            yield n
        await asyncio.Event().wait()  # the client keeps the stream open

    async def stuck(request: int) -> int:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(request)
            raise
        return request

    stream = answer_stream(requests(), stuck, LIMIT)
    waiting = asyncio.ensure_future(anext(stream))
    await settle()
    waiting.cancel()  # the client cancelled: grpc.aio cancels the handler, then closes the generator
    await settle()
    await stream.aclose()
    await settle()
    assert sorted(cancelled) == [0, 1, 2]


@pytest.mark.anyio
async def test_a_request_that_cannot_be_read_ends_the_stream_after_those_in_flight_are_answered() -> None:
    release = asyncio.Event()

    async def requests() -> AsyncIterator[int]:
        yield 0
        await asyncio.sleep(0)
        raise ValueError("a malformed message")

    async def held(request: int) -> int:
        await release.wait()
        return request

    reading, answers = collect(requests(), held)
    await settle()
    assert not reading.done()  # the failed read waits for the request in flight
    release.set()
    with pytest.raises(ValueError, match="malformed"):
        await asyncio.wait_for(reading, 5)
    assert answers == [0]


@pytest.mark.anyio
async def test_a_stopping_server_answers_what_it_read_and_reads_no_more() -> None:
    release, stop = asyncio.Event(), asyncio.Event()
    read: list[int] = []

    async def requests() -> AsyncIterator[int]:
        for n in range(10):  # the client would send more
            read.append(n)
            yield n
            if n == 1:
                await asyncio.Event().wait()  # its third request is not sent yet

    async def held(request: int) -> int:
        await release.wait()
        return request

    stream = answer_stream(requests(), held, LIMIT, stop)
    waiting = asyncio.ensure_future(anext(stream))
    await settle()
    stop.set()  # the server stops with two requests in flight
    await settle()
    assert not waiting.done() and read == [0, 1]
    release.set()
    assert {await waiting, await anext(stream)} == {0, 1}  # what it read is answered
    with pytest.raises(StreamStopped):
        await anext(stream)
    assert read == [0, 1]


@pytest.mark.anyio
async def test_a_stream_whose_client_had_sent_its_last_request_ends_as_usual_when_the_server_stops() -> None:
    release, stop = asyncio.Event(), asyncio.Event()

    async def requests() -> AsyncIterator[int]:
        yield 0

    async def held(request: int) -> int:
        await release.wait()
        return request

    reading, answers = collect(requests(), held, stop)
    await settle()
    stop.set()
    release.set()
    await asyncio.wait_for(reading, 5)  # no StreamStopped: nothing was left unread
    assert answers == [0]


@pytest.mark.anyio
async def test_a_stream_holds_at_most_its_row_budget_and_a_larger_request_runs_alone() -> None:
    """Requests weigh their rows: with a budget of 10, two of 4 rows are held at once (not a third), and one of
    20 (past the whole budget) starts only once the stream holds nothing else, then alone."""
    weights = [4, 4, 4, 20, 4]
    gates = {n: asyncio.Event() for n in range(len(weights))}
    started: list[int] = []

    async def requests() -> AsyncIterator[int]:
        for n in range(len(weights)):
            yield n

    async def held(request: int) -> int:
        started.append(request)
        await gates[request].wait()
        return request

    stream = answer_stream(requests(), held, LIMIT, rows=lambda n: weights[n], row_budget=RowBudget(10))
    sent: list[int] = []  # a client reading every answer as it comes (an answer's rows are free once it is sent)

    async def read_all() -> None:
        async for answer in stream:
            sent.append(answer)

    reading = asyncio.create_task(read_all())
    await settle()
    assert started == [0, 1]
    gates[0].set()
    await settle()
    assert (sent, started) == ([0], [0, 1, 2])
    gates[1].set()
    gates[2].set()
    await settle()
    assert (sent, started) == ([0, 1, 2], [0, 1, 2, 3])  # 20 rows: alone
    gates[3].set()
    await settle()
    assert (sent, started) == ([0, 1, 2, 3], [0, 1, 2, 3, 4])
    gates[4].set()
    await asyncio.wait_for(reading, 5)
    assert sent == [0, 1, 2, 3, 4]


@pytest.mark.anyio
async def test_a_request_waiting_for_rows_as_the_server_stops_is_answered() -> None:
    """Read, then waiting for the stream's rows when the stop comes: it is answered with the one in flight (past
    the budget) before the stream ends, not dropped unanswered (it was read: the client would not know to resend
    it where it sets no id)."""
    release, stop = asyncio.Event(), asyncio.Event()

    async def requests() -> AsyncIterator[int]:
        yield 0
        yield 1  # its last: waits for rows behind 0

    async def held(request: int) -> int:
        await release.wait()
        return request

    answers: list[int] = []

    async def read_all() -> None:
        async for one in answer_stream(requests(), held, LIMIT, stop, rows=lambda _: 8, row_budget=RowBudget(10)):
            answers.append(one)

    reading = asyncio.create_task(read_all())
    await settle()
    stop.set()
    await settle()
    release.set()
    with pytest.raises(StreamStopped):
        await asyncio.wait_for(reading, 5)
    assert sorted(answers) == [0, 1]


def test_the_streams_of_a_connection_share_one_budget_forgotten_with_the_last() -> None:
    budgets = ConnectionBudgets(10)
    with budgets.of("ipv4:10.0.0.1:5000") as first, budgets.of("ipv4:10.0.0.1:5000") as second:
        with budgets.of("ipv4:10.0.0.1:5001") as other:
            assert first is second and first is not other and first.limit == 10
        with budgets.of("ipv4:10.0.0.1:5001") as again:
            assert again is not other  # the other connection's last stream ended: its budget went with it
    with budgets.of("ipv4:10.0.0.1:5000") as later:
        assert later is not first
    assert not budgets._shared
