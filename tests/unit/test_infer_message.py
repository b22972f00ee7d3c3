"""The data plane's callback path for a request read whole (DataPlane.infer_message: gRPC's calls and streamed
requests): answered from the batcher's future with no task where the decode is cheap, and otherwise the same
steps as `infer`: refusals answered by the codec, the deadline answered 504 with its rows dropped, a cancelled
request's rows dropped and counted as the codec says, admission given back once whatever the ending."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from prometheus_client import REGISTRY

from app.config import Settings
from app.dataplane import DataPlane
from app.errors import InputError, ServiceError, UnknownModelError

IMAGES = np.zeros((1, 1, 2, 2), np.uint8)
SCORES = np.ones((1, 10), np.float32)


class Queue:
    """A served model's batch queue whose futures the test resolves."""

    engines = (SimpleNamespace(name="fake"),)

    def __init__(self) -> None:
        self.futures: list[asyncio.Future[np.ndarray]] = []

    def admit(self, deadline: float) -> None:
        pass

    def enqueue(self, images: np.ndarray, deadline: float) -> asyncio.Future[np.ndarray]:
        self.futures.append(asyncio.get_running_loop().create_future())
        return self.futures[-1]


class Model:
    def __init__(self, name: str) -> None:
        self.spec = SimpleNamespace(name=name)
        self.queue = Queue()
        self.admitted = 0

    def ready_batcher(self) -> Queue:
        return self.queue


class Codec:
    """Answers ("ok", message) or ("refused", status); decodes cheaply unless told not to."""

    protocol = "grpc"

    def __init__(self, model: Model, *, cheap: bool = True, bad_input: bool = False) -> None:
        self.model, self.cheap, self.bad_input = model, cheap, bad_input

    def served(self, model: str, version: str | None) -> Model:
        if model != self.model.spec.name:
            raise UnknownModelError(model, [self.model.spec.name])
        return self.model

    def decode_cheaply(self, message: str, spec: Any) -> tuple[np.ndarray, str] | None:
        if self.bad_input:
            raise InputError("the input is named 'x'", expected="input")
        return (IMAGES, message) if self.cheap else None

    async def decode(self, message: str, spec: Any) -> tuple[np.ndarray, str]:
        await asyncio.sleep(0)  # as an off-loop decode would
        return IMAGES, message

    def encode(self, scores: np.ndarray, asked: str, served: Model, engine: str) -> tuple[str, str]:
        return "ok", asked

    def failure(self, error: ServiceError) -> tuple[tuple[str, int], str]:
        return ("refused", error.status), str(error.status)

    def cancelled(self) -> tuple[str, str]:
        return "CANCELLED", "client_closed"


def plane() -> DataPlane:
    return DataPlane(SimpleNamespace(settings=Settings()))  # type: ignore[arg-type]


def infer(plane: DataPlane, codec: Codec, model: str = "m", deadline_s: float = 30.0) -> asyncio.Future[Any]:
    return plane.infer_message(
        codec,  # type: ignore[arg-type]  # a stand-in for a served model and its codec
        "msg",
        model=model,
        version=None,
        form="raw",
        deadline=time.monotonic() + deadline_s,
        path="Infer",
    )


def rejections(model: str, reason: str) -> float:
    return REGISTRY.get_sample_value("cgserve_rejections_total", {"model": model, "reason": reason}) or 0.0


@pytest.mark.anyio
async def test_a_cheaply_decoded_request_is_answered_from_the_batchers_future_with_no_task() -> None:
    model = Model("m")
    tasks = len(asyncio.all_tasks())
    answer = infer(plane(), Codec(model))
    assert len(asyncio.all_tasks()) == tasks  # no task for it: the batcher's future and callbacks
    assert model.admitted == 1 and not answer.done()
    model.queue.futures[0].set_result(SCORES)
    assert await asyncio.wait_for(answer, 2) == ("ok", "msg")
    assert model.admitted == 0


@pytest.mark.anyio
async def test_a_request_decode_cheaply_leaves_to_the_async_decode_is_answered_the_same() -> None:
    model = Model("m")
    answer = infer(plane(), Codec(model, cheap=False))
    for _ in range(5):  # the decode's task runs, then queues the rows
        await asyncio.sleep(0)
    model.queue.futures[0].set_result(SCORES)
    assert await asyncio.wait_for(answer, 2) == ("ok", "msg")
    assert model.admitted == 0


@pytest.mark.anyio
async def test_refusals_are_the_codecs_answers_counted_under_the_served_name() -> None:
    model = Model("m-refusals")
    before = rejections("", "unknown_model"), rejections("m-refusals", "invalid_input")
    assert await infer(plane(), Codec(model), model="nope") == ("refused", 404)  # counted under "", not "nope"
    assert await infer(plane(), Codec(model, bad_input=True), model="m-refusals") == ("refused", 422)
    assert (rejections("", "unknown_model"), rejections("m-refusals", "invalid_input")) == (
        before[0] + 1,
        before[1] + 1,
    )
    assert model.admitted == 0 and not model.queue.futures


@pytest.mark.anyio
async def test_a_request_past_its_deadline_is_answered_504_and_its_rows_dropped() -> None:
    model = Model("m-deadline")
    before = rejections("m-deadline", "deadline_exceeded")
    answer = infer(plane(), Codec(model, cheap=True), model="m-deadline", deadline_s=0.02)
    assert await asyncio.wait_for(answer, 2) == ("refused", 504)  # the coarse timer: a tick late at most
    assert model.queue.futures[0].cancelled()  # the batcher skips it
    assert model.admitted == 0
    assert rejections("m-deadline", "deadline_exceeded") == before + 1


@pytest.mark.anyio
@pytest.mark.parametrize("cheap", [True, False], ids=["queued", "decoding"])
async def test_a_cancelled_request_drops_its_rows_and_is_counted_as_the_codec_says(cheap: bool) -> None:
    model = Model(f"m-cancel-{cheap}")
    before = rejections(model.spec.name, "client_closed")
    answer = infer(plane(), Codec(model, cheap=cheap), model=model.spec.name)
    if cheap:
        assert len(model.queue.futures) == 1
    answer.cancel()  # the stream closed, or grpc.aio cancelled the call's handler
    for _ in range(5):
        await asyncio.sleep(0)
    assert all(rows.cancelled() for rows in model.queue.futures)  # queued: dropped; decoding: never queued
    assert model.admitted == 0
    assert rejections(model.spec.name, "client_closed") == before + 1
