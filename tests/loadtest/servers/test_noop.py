"""The no-op ceiling decodes as the service does: for every body, good or bad, it gives the
service's status and error code and as many predictions, without a model."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import orjson
import pytest
from fastapi.testclient import TestClient

from app.config import Settings
from app.main import create_app
from loadtest.payloads import build_payloads
from loadtest.servers.noop import app as noop_app
from loadtest.servers.noop import lean_app

JSON = {"content-type": "application/json"}
RAW = {"content-type": "application/octet-stream"}
PNG = build_payloads("png", check_labels=False, limit=1)
BODIES = {
    "json, 3 images": ("/predict", orjson.dumps({"instances": [[0.5] * 784] * 3}), JSON),
    "json, 28×28": ("/predict", orjson.dumps({"instances": [[[0.0] * 28] * 28]}), JSON),
    "json, broken": ("/predict", b'{"instances": [', JSON),
    "json, 10 values": ("/predict", orjson.dumps({"instances": [[0.5] * 10]}), JSON),
    "json, 0-255": ("/predict", orjson.dumps({"instances": [[255] * 784]}), JSON),
    "json, strings": ("/predict", orjson.dumps({"instances": [["a"] * 784]}), JSON),
    "json, none": ("/predict", orjson.dumps({"instances": []}), JSON),
    "raw, 2 images": ("/predict", bytes(2 * 784), RAW),
    "raw, float32": ("/predict?dtype=float32", np.full(784, 0.5, "<f4").tobytes(), RAW),
    "raw, odd size": ("/predict", bytes(785), RAW),
    "raw, float64": ("/predict?dtype=float64", bytes(784 * 8), RAW),
    "raw, too many": ("/predict", bytes(1025 * 784), RAW),
    "png": ("/predict", PNG.bodies[0], {"content-type": PNG.content_type}),
    "png, not an image": ("/predict", PNG.bodies[0].replace(b"PNG", b"GIF", 1), {"content-type": PNG.content_type}),
    "multipart, no file": (
        "/predict",
        b'--b\r\nContent-Disposition: form-data; name="x"\r\n\r\n1\r\n--b--\r\n',
        {"content-type": "multipart/form-data; boundary=b"},
    ),
    "multipart, broken": ("/predict", b"--b\r\nnot a header\r\n", {"content-type": "multipart/form-data; boundary=b"}),
    "text": ("/predict", b"hello", {"content-type": "text/plain"}),
    "no content type": ("/predict", b"hello", {}),
}


def outcome(client: TestClient, name: str) -> tuple[int, str | int]:
    """(status, error code) of an error, or (200, number of predictions)."""
    path, body, headers = BODIES[name]
    answer = client.post(path, content=body, headers=headers)
    if answer.status_code == 200:
        return 200, len(answer.json()["predictions"])
    return answer.status_code, answer.json()["error"]["code"]


@pytest.fixture(scope="module")
def service() -> Iterator[TestClient]:
    with TestClient(create_app(Settings(device="cpu"))) as client:
        client.portal.call(client.app.state.service.wait_started)  # type: ignore[attr-defined]
        yield client


@pytest.mark.parametrize("app", [noop_app, lean_app], ids=["fastapi-route", "plain-route"])
def test_noop_answers_every_body_as_the_service_does(service: TestClient, app: object) -> None:
    with TestClient(app) as noop:  # type: ignore[arg-type]
        got = {name: outcome(noop, name) for name in BODIES}
    want = {name: outcome(service, name) for name in BODIES}
    assert got == want
    assert want["json, 3 images"] == (200, 3) and want["json, broken"] == (400, "invalid_json")  # both paths taken


def test_noop_answers_in_the_service_shape_without_a_model() -> None:
    with TestClient(noop_app) as noop:
        answer = noop.post("/predict", content=bytes(2 * 784), headers=RAW).json()
    assert answer["model"] == "noop" and answer["engine"] == "noop"
    assert [p["scores"] for p in answer["predictions"]] == [[pytest.approx(0.1)] * 10] * 2
