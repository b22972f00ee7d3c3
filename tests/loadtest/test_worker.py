"""How one answer is judged: status, shape, labels (the sending runs in test_loadtest.py)."""

from __future__ import annotations

import orjson

from loadtest.worker import check_answer


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
