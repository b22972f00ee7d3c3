"""How one answer is judged: status, shape, labels (the sending runs in test_loadtest.py)."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import orjson
import pytest

from loadtest import worker
from loadtest.payloads import Payloads
from loadtest.worker import WorkerSpec, check_answer, check_outputs, check_v2_answer


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


def probabilities(labels: list[int]) -> np.ndarray:
    """(k, 10) float32 rows whose argmax is each label."""
    rows = np.full((len(labels), 10), 0.05, np.float32)
    rows[np.arange(len(labels)), labels] = 0.55
    return rows


def v2_answer(labels: list[int]) -> bytes:
    rows = probabilities(labels)
    output = {"name": "probabilities", "datatype": "FP32", "shape": list(rows.shape), "data": rows.reshape(-1)}
    return orjson.dumps({"model_name": "fashion-cnn", "outputs": [output]}, option=orjson.OPT_SERIALIZE_NUMPY)


def test_check_v2_answer_kinds() -> None:
    assert check_v2_answer(200, v2_answer([3, 1]), (3, 1), 2) == (None, "", {"model": "fashion-cnn"})
    assert check_v2_answer(200, v2_answer([3, 2]), (3, 1), 2)[0] == "wrong_label"
    assert check_v2_answer(200, v2_answer([3]), (3, 1), 2)[0] == "bad_response"
    assert check_v2_answer(200, b'{"outputs": [{"name": "other"}]}', (3,), 1)[0] == "bad_response"
    assert check_v2_answer(404, b'{"error": "no model named nope"}', (3,), 1)[:2] == ("http_404", "no model named nope")


def test_check_outputs_of_a_grpc_answer_kinds() -> None:
    raw = probabilities([3, 1]).tobytes()
    assert check_outputs(["probabilities"], [raw], "m", (3, 1), 2) == (None, "", {"model": "m"})
    assert check_outputs(["other", "probabilities"], [b"", raw], "m", (3, 1), 2)[0] is None
    assert check_outputs(["probabilities"], [raw], "m", (1, 3), 2)[0] == "wrong_label"
    assert check_outputs(["probabilities"], [raw[:40]], "m", (3, 1), 2)[0] == "bad_response"
    assert check_outputs(["probabilities"], [], "m", (3, 1), 2)[0] == "bad_response"
    assert check_outputs(["scores"], [raw], "m", None, 2)[0] == "bad_response"


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
