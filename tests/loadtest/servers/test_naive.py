"""The naive baseline: the eager model's answer per request, bodies decoded as the service does."""

from __future__ import annotations

import numpy as np
import orjson
import pytest
from fastapi.testclient import TestClient

from loadtest.payloads import build_payloads
from loadtest.servers import naive


@pytest.fixture(autouse=True)
def on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(naive.DEVICE_ENV, "cpu")


def test_naive_answers_the_eager_labels_and_refuses_bad_bodies() -> None:
    payloads = build_payloads("json", images_per_request=4, limit=40)
    headers = {"content-type": payloads.content_type}
    with TestClient(naive.app) as client:
        assert client.get("/readyz").status_code == 200
        answer = client.post("/predict", content=payloads.bodies[0], headers=headers).json()
        bad = client.post("/predict", content=orjson.dumps({"instances": [[2.0] * 784]}), headers=headers)
    assert answer["engine"] == "naive-eager-cpu-fp32"
    assert tuple(p["label"] for p in answer["predictions"]) == payloads.expected[0]
    assert np.allclose([sum(p["scores"]) for p in answer["predictions"]], 1.0, atol=1e-5)
    assert bad.status_code == 422 and "outside [0, 1]" in bad.json()["error"]["message"]
