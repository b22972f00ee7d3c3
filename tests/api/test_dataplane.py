"""The data plane's accounting, through the app: a refusal at admission is counted under the model."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from prometheus_client import REGISTRY

from app.config import Settings
from app.errors import QueueFullError
from app.main import create_app
from app.ops import metric_buffers

PIXELS = bytes(784)
RAW = {"content-type": "application/octet-stream"}


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with TestClient(create_app(Settings(inline_predict=False))) as client:
        client.portal.call(client.app.state.service.wait_started)  # type: ignore[attr-defined]
        yield client


def rejections(model: str, reason: str) -> float:
    metric_buffers.flush()
    return REGISTRY.get_sample_value("cgserve_rejections_total", {"model": model, "reason": reason}) or 0.0


@pytest.mark.parametrize("path", ["/predict", "/v1/models/fashion-cnn/predict", "/v2/models/fashion-cnn/infer"])
def test_a_refusal_at_admission_is_counted_under_the_model(
    client: TestClient, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    batcher = client.app.state.service.models["fashion-cnn"].batcher  # type: ignore[attr-defined]

    def full(deadline: float) -> None:
        raise QueueFullError(64, 64, retry_after_s=0.5)

    monkeypatch.setattr(batcher, "admit", full)
    before = rejections("fashion-cnn", "queue_full"), rejections("", "queue_full")
    body = PIXELS if path != "/v2/models/fashion-cnn/infer" else b'{"inputs": []}'
    answer = client.post(path, content=body, headers=RAW if path != "/v2/models/fashion-cnn/infer" else {})
    assert answer.status_code == 503 and "retry-after" in answer.headers
    after = rejections("fashion-cnn", "queue_full"), rejections("", "queue_full")
    assert after == (before[0] + 1, before[1])


def test_an_unsupported_content_type_is_refused_before_its_body_is_read(client: TestClient) -> None:
    read = []

    def body() -> Iterator[bytes]:  # a streamed body: each chunk the server pulls is recorded
        for _ in range(4):
            read.append(1)
            yield bytes(65536)

    answer = client.post("/predict", content=body(), headers={"content-type": "text/csv"})
    assert answer.status_code == 415 and answer.json()["error"]["code"] == "unsupported_media_type"
    assert len(read) < 4, "the whole body was read for an answer its Content-Type decided"


@pytest.mark.parametrize(("method", "path", "status"), [("GET", "/no/such/route", 404), ("GET", "/predict", 405)])
def test_a_request_for_no_route_is_counted_as_an_invalid_route(
    client: TestClient, method: str, path: str, status: int
) -> None:
    before = rejections("", "invalid_route")
    assert client.request(method, path).status_code == status
    assert rejections("", "invalid_route") - before == 1


def answered(protocol: str, form: str, code: str) -> float:
    metric_buffers.flush()
    labels = {"model": "", "protocol": protocol, "format": form, "code": code}
    return REGISTRY.get_sample_value("cgserve_requests_total", labels) or 0.0


@pytest.mark.parametrize(
    ("path", "headers", "protocol", "form"),
    [
        ("/predict", RAW, "rest", "raw"),
        ("/v2/models/fashion-cnn/infer", {"inference-header-content-length": "10"}, "v2", "binary"),
    ],
)
def test_an_inference_request_refused_before_its_route_is_in_the_requests_counter(
    client: TestClient, path: str, headers: dict[str, str], protocol: str, form: str
) -> None:
    """The guard's refusals (here a malformed X-Request-Timeout-Ms, 400) answer inference requests: an error rate
    over cgserve_requests_total sees them, as it sees the routes' own refusals."""
    before = answered(protocol, form, "400")
    response = client.post(path, content=PIXELS, headers={**headers, "x-request-timeout-ms": "soon"})
    assert response.status_code == 400, response.text
    assert answered(protocol, form, "400") - before == 1
