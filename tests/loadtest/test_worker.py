"""How one answer is judged: status, shape, labels (the sending runs in test_loadtest.py)."""

from __future__ import annotations

import asyncio
import time

import orjson
import pytest

from loadtest import worker
from loadtest.payloads import Payloads
from loadtest.worker import WorkerSpec, check_answer


def answer(labels: list[int]) -> bytes:
    preds = [{"label": label, "class_name": "x", "scores": [0.1] * 10} for label in labels]
    return orjson.dumps({"model": "fashion-cnn", "engine": "eager", "predictions": preds})


def test_check_answer_kinds() -> None:
    assert check_answer(200, answer([3, 1]), (3, 1), 2)[0] is None
    assert check_answer(200, answer([3, 1]), None, 2)[0] is None
    assert check_answer(200, answer([3, 2]), (3, 1), 2)[0] == "wrong_label"
    assert check_answer(200, answer([3]), (3, 1), 2)[0] == "bad_response"
    assert check_answer(200, b"not json", (3,), 1)[0] == "bad_response"
    error = orjson.dumps({"error": {"code": "overloaded", "message": "queue full", "expected": "retry"}})
    assert check_answer(503, error, (3,), 1)[:2] == ("http_503:overloaded", "queue full")
    assert check_answer(502, b"<html>bad gateway</html>", (3,), 1)[0] == "http_502"


class CrashOnFirstSend:
    """A driver whose first send raises what no driver may (a bug), then answers at once."""

    connection_waits = 0
    stale_retries = 0

    def __init__(self) -> None:
        self.sent = 0

    async def send(self, j: int) -> tuple[int, bytes]:
        self.sent += 1
        if self.sent == 1:
            raise RuntimeError("driver bug")
        return 200, answer([0])

    async def aclose(self) -> None:
        pass


def test_open_loop_raises_a_crash_of_a_request_that_ended_long_before_the_drain(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first request's task crashes and leaves the in-flight set at once; the run must still
    fail with its error rather than report the other requests as if nothing happened."""
    monkeypatch.setattr(worker, "open_driver", lambda spec: (CrashOnFirstSend(), worker.check_answer))
    payloads = Payloads("raw", "/predict", "application/octet-stream", (b"x",), None, 1)
    spec = WorkerSpec(
        0,
        "http://127.0.0.1:9",
        payloads,
        "open",
        rate=400.0,
        concurrency=1,
        connections=1,
        warmup_s=0.0,
        duration_s=0.3,
        timeout_s=1.0,
        seed=0,
    )
    with pytest.raises(RuntimeError, match="driver bug"):
        asyncio.run(worker.run_worker(spec, time.perf_counter(), [0] * worker.PROGRESS_SLOTS))
