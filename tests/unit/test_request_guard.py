"""The bytes-in-flight budget of app/http/limits.py: a request holds what has arrived of its
body, not what it declares (issue 24.2: sixteen uploads declaring 16 MiB that then trickled held
all 256 MiB, and every other request got 503).

The guard wraps a small app that reads the whole body and answers its length; each trickling
upload's receive() hands over one chunk and then waits on an event the test sets at the end.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from app.config import Settings
from app.errors import ServiceError
from app.http.limits import BodyBudget, RequestGuard

DEFAULTS = Settings()
MIB = 2**20


async def reading_app(scope: Any, receive: Any, send: Any) -> None:
    """Reads the body; answers 200 with its length, or the error a receive() raised."""
    size = 0
    try:
        while True:
            message = await receive()
            size += len(message.get("body", b""))
            if not message.get("more_body"):
                break
        status, body = 200, b"%d" % size
    except ServiceError as error:
        status, body = error.status, error.text().encode()  # what was wrong and what was expected
    await send({"type": "http.response.start", "status": status, "headers": []})
    await send({"type": "http.response.body", "body": body})


def scope(length: int | None) -> dict[str, Any]:
    headers = [(b"content-length", b"%d" % length)] if length is not None else [(b"transfer-encoding", b"chunked")]
    return {"type": "http", "method": "POST", "path": "/predict", "headers": headers, "extensions": {}}


class Answer:
    def __init__(self) -> None:
        self.status: int | None = None
        self.body = b""

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
        else:
            self.body += message.get("body", b"")


class Stalled:
    """Counts the uploads waiting for more of their body; `all_in` is set once `expected` are."""

    def __init__(self, expected: int) -> None:
        self.expected, self.count, self.all_in = expected, 0, asyncio.Event()

    def one_more(self) -> None:
        self.count += 1
        if self.count == self.expected:
            self.all_in.set()


def trickling(first: bytes, release: asyncio.Event, stalled: Stalled) -> Any:
    """A receive() that hands over `first`, then waits for `release`, then ends the body."""
    chunks = iter([first])

    async def receive() -> dict[str, Any]:
        chunk = next(chunks, None)
        if chunk is not None:
            return {"type": "http.request", "body": chunk, "more_body": True}
        stalled.one_more()  # its first chunk is charged: the guard passed it on before asking again
        await release.wait()
        return {"type": "http.request", "body": b"", "more_body": False}

    return receive


def whole(body: bytes) -> Any:
    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    return receive


def guard(budget: BodyBudget) -> RequestGuard:
    return RequestGuard(
        reading_app, max_body_bytes=DEFAULTS.max_body_bytes, budget=budget,
        request_timeout_s=DEFAULTS.request_timeout_s, body_timeout_s=DEFAULTS.body_timeout_s,
    )  # fmt: skip


@pytest.mark.anyio
@pytest.mark.parametrize("declared", [DEFAULTS.max_body_bytes, None], ids=["declared 16 MiB", "chunked"])
async def test_sixteen_trickling_uploads_leave_room_for_a_predict(declared: int | None) -> None:
    budget = BodyBudget(DEFAULTS.max_inflight_bytes)
    assert DEFAULTS.max_inflight_bytes // DEFAULTS.max_body_bytes == 16  # the defaults the issue names
    app, release, stalled = guard(budget), asyncio.Event(), Stalled(16)
    uploads = [Answer() for _ in range(16)]
    receives = [trickling(b"x" * 1000, release, stalled) for _ in uploads]
    tasks = [asyncio.create_task(app(scope(declared), r, u.send)) for r, u in zip(receives, uploads, strict=True)]
    await stalled.all_in.wait()
    assert budget.used == 16 * 1000  # what arrived, not what was declared

    predict = Answer()
    await app(scope(784), whole(b"p" * 784), predict.send)
    assert (predict.status, predict.body) == (200, b"784")

    release.set()
    await asyncio.gather(*tasks)
    assert all(u.status == 200 for u in uploads) and budget.used == 0


@pytest.mark.anyio
async def test_a_body_that_does_not_fit_as_it_arrives_gets_503_and_gives_its_bytes_back() -> None:
    budget = BodyBudget(10 * MIB)
    budget.used = 9 * MIB  # held by others
    answer = Answer()
    await guard(budget)(scope(None), whole(b"x" * (2 * MIB)), answer.send)
    assert answer.status == 503 and budget.used == 9 * MIB


@pytest.mark.anyio
async def test_a_declared_length_that_does_not_fit_is_refused_before_its_body_is_read() -> None:
    budget = BodyBudget(10 * MIB)
    budget.used = 9 * MIB

    async def unread() -> dict[str, Any]:
        raise AssertionError("the body was read")

    answer = Answer()
    await guard(budget)(scope(2 * MIB), unread, answer.send)
    assert answer.status == 503 and budget.used == 9 * MIB


# --- compressed bodies: every limit counts the inflated bytes (a second review's find: they were counted
# compressed, 24 bodies of 16 KB inflating to 16 MiB each took the server from 0.3 to 2.4 GB) ---


def compressed_scope(body: bytes, encoding: bytes = b"gzip") -> dict[str, Any]:
    request = scope(len(body))
    request["headers"].append((b"content-encoding", encoding))
    return request


def test_a_compressed_body_reaches_the_app_inflated_in_slices_between_which_the_loop_runs() -> None:
    import gzip

    from app.http.content_encoding import SLICE_BYTES

    plain = bytes(range(256)) * (3 * SLICE_BYTES // 256 + 7)  # four slices
    ticks = 0

    async def ticking() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    async def main() -> tuple[Answer, int]:
        guard = RequestGuard(reading_app, max_body_bytes=64 * MIB, budget=BodyBudget(64 * MIB), request_timeout_s=5,
                             body_timeout_s=5)  # fmt: skip
        answer, ticker = Answer(), asyncio.create_task(ticking())
        await guard(compressed_scope(gzip.compress(plain)), whole(gzip.compress(plain)), answer.send)
        ticker.cancel()
        return answer, ticks

    answer, ran = asyncio.run(main())
    assert answer.status == 200 and answer.body == b"%d" % len(plain)
    assert ran >= 3  # the loop's other work ran between the slices


def test_the_budget_and_the_size_limit_count_the_inflated_bytes() -> None:
    import gzip

    bomb = gzip.compress(bytes(16 * MIB))  # ~16 KB

    async def main(budget: BodyBudget, limit: int) -> tuple[Answer, int]:
        guard = RequestGuard(reading_app, max_body_bytes=limit, budget=budget, request_timeout_s=5,
                             body_timeout_s=5)  # fmt: skip
        answer = Answer()
        await guard(compressed_scope(bomb), whole(bomb), answer.send)
        return answer, budget.used

    held = BodyBudget(24 * MIB)
    held.used = 12 * MIB  # others' bodies: 16 MiB inflated does not fit now, and would on an idle server
    cases = ((held, 64 * MIB, 503, "being read"), (BodyBudget(4 * MIB), 64 * MIB, 413, "CGSERVE_MAX_INFLIGHT_BYTES"),
             (BodyBudget(64 * MIB), 1 * MIB, 413, "CGSERVE_MAX_BODY_BYTES"))  # fmt: skip
    for budget, limit, status, why in cases:
        before = budget.used
        answer, used = asyncio.run(main(budget, limit))
        assert answer.status == status and why in answer.body.decode(), answer.body
        assert used == before  # all given back


@pytest.mark.anyio
async def test_a_chunked_body_larger_than_the_whole_budget_is_413_not_a_503_for_ever() -> None:
    """An idle server, a body of unstated length over CGSERVE_MAX_INFLIGHT_BYTES: no retry could ever fit it (a
    review's find: 503 with Retry-After, every time)."""
    budget = BodyBudget(2048)
    answer = Answer()
    await guard(budget)(scope(None), whole(b"x" * 2352), answer.send)
    assert answer.status == 413 and "CGSERVE_MAX_INFLIGHT_BYTES" in answer.body.decode(), answer.body
    assert budget.used == 0


def test_another_encoding_is_415_before_the_body_is_read() -> None:
    async def never() -> dict[str, Any]:
        raise AssertionError("the body should not be read")

    async def main() -> Answer:
        guard = RequestGuard(reading_app, max_body_bytes=MIB, budget=BodyBudget(MIB), request_timeout_s=5,
                             body_timeout_s=5)  # fmt: skip
        answer = Answer()
        await guard(compressed_scope(b"x", b"br"), never, answer.send)
        return answer

    answer = asyncio.run(main())
    assert answer.status == 415 and b"gzip or deflate" in answer.body


def infer_scope(length: int, *, binary: bool) -> dict[str, Any]:
    headers = [(b"content-length", b"%d" % length)]
    if binary:
        headers.append((b"inference-header-content-length", b"100"))
    return {"type": "http", "method": "POST", "path": "/v2/models/m/versions/1/infer", "headers": headers,
            "extensions": {}}  # fmt: skip


@pytest.mark.parametrize(
    ("binary", "length", "status", "words"),
    [
        (True, 20 * MIB, 200, b""),  # a v2 binary body up to the model's FP32 batch: what gRPC takes too
        (False, 20 * MIB, 413, b"CGSERVE_MAX_BODY_BYTES"),  # JSON keeps 16 MiB: its numbers decode to ten times more
        (True, 40 * MIB, 413, b"max_batch_size"),
    ],
)
def test_only_v2_binary_infer_bodies_take_the_models_fp32_batch(binary: bool, length: int, status: int,
                                                                 words: bytes) -> None:  # fmt: skip
    async def main() -> Answer:
        guard = RequestGuard(reading_app, max_body_bytes=16 * MIB, infer_body_bytes=32 * MIB,
                             budget=BodyBudget(256 * MIB), request_timeout_s=5, body_timeout_s=5)  # fmt: skip
        answer = Answer()
        await guard(infer_scope(length, binary=binary), whole(b"\0" * length), answer.send)
        return answer

    answer = asyncio.run(main())
    assert answer.status == status and words in answer.body, answer.body[:200]


def test_a_body_larger_than_the_whole_budget_is_413_not_a_503_for_ever() -> None:
    """No body could be admitted: an idle server answered 503 and Retry-After: 1 to every attempt."""

    async def main() -> Answer:
        guard = RequestGuard(reading_app, max_body_bytes=64 * MIB, budget=BodyBudget(8 * MIB), request_timeout_s=5,
                             body_timeout_s=5)  # fmt: skip
        answer = Answer()
        await guard(scope(9 * MIB), whole(b"\0" * (9 * MIB)), answer.send)
        return answer

    answer = asyncio.run(main())
    assert answer.status == 413 and b"CGSERVE_MAX_INFLIGHT_BYTES" in answer.body, answer.body
