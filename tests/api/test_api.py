"""The HTTP API through the ASGI lifespan (Starlette's TestClient), on the CPU eager engine."""

from __future__ import annotations

import io
import os
import re
import shutil
import struct
import subprocess
import threading
import zlib
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import orjson
import pytest
import torch
from fastapi.testclient import TestClient
from PIL import Image

from app import service as service_module
from app.config import Settings
from app.http.routes.predict import FORMAT_OF
from app.main import create_app
from models.cnn import load_model
from models.fashion_mnist import load_test_sample
from tests.seed_model import seed_spec

MAX_INSTANCES = 16
MAX_BODY = 256 * 1024


@pytest.fixture(scope="module")
def sample() -> tuple[np.ndarray, np.ndarray]:
    return load_test_sample()


@contextmanager
def started_client() -> Iterator[TestClient]:
    settings = Settings(max_instances=MAX_INSTANCES, max_body_bytes=MAX_BODY, queue_limit=64, max_delay_ms=1.0)
    with TestClient(create_app(settings)) as client:
        client.portal.call(client.app.state.service.wait_started)  # type: ignore[attr-defined]
        yield client


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with started_client() as client:
        yield client


def eager_scores(images_uint8: np.ndarray) -> np.ndarray:
    """(k, 28, 28) uint8 → (k, 10) probabilities from the model run directly, one image at a time.

    The reference is built from models/ alone, not from the service's model spec, so a mistake
    in the spec (a second softmax, say) cannot hide in both sides of the comparison."""
    module = load_model()
    x = torch.from_numpy(images_uint8.astype(np.float32) / 255).reshape(-1, 1, 28, 28)
    with torch.inference_mode():
        return torch.cat([torch.softmax(module(row[None]), dim=1) for row in x]).numpy()


def png_bytes(image: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG")
    return buffer.getvalue()


def png_header_only(width: int, height: int) -> bytes:
    """A PNG whose header claims width×height: a decompression bomb must be refused from this alone."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")
    )


# --- good requests ---------------------------------------------------------------------------


def test_one_test_image_as_json_png_and_raw_gets_the_same_correct_label(
    client: TestClient, sample: tuple[np.ndarray, np.ndarray]
) -> None:
    images, labels = sample
    image, label = images[0], int(labels[0])
    answers = [
        client.post("/predict", json={"instances": [(image / 255).tolist()]}),
        client.post("/predict", files={"file": ("boot.png", png_bytes(image), "image/png")}),
        client.post("/predict", content=image.tobytes(), headers={"content-type": "application/octet-stream"}),
    ]
    for answer in answers:
        assert answer.status_code == 200, answer.text
        (prediction,) = answer.json()["predictions"]
        assert prediction["label"] == label
        assert prediction["class_name"] == seed_spec().class_names[label]
        np.testing.assert_allclose(prediction["scores"], eager_scores(image[None])[0], rtol=1e-4, atol=1e-6)
        assert sum(prediction["scores"]) == pytest.approx(1.0, abs=1e-5)
        assert max(prediction["scores"]) > 0.9  # a clear ankle boot: the model is sure of it
    assert answers[0].json()["engine"] == "eager"


def test_several_images_in_one_request_keep_their_order(
    client: TestClient, sample: tuple[np.ndarray, np.ndarray]
) -> None:
    images = sample[0][:12]
    flat = (images.reshape(12, 784) / 255).tolist()
    answer = client.post("/predict", json={"instances": flat})
    assert answer.status_code == 200
    scores = np.array([p["scores"] for p in answer.json()["predictions"]])
    np.testing.assert_allclose(scores, eager_scores(images), rtol=1e-4, atol=1e-6)

    raw = client.post(
        "/predict?dtype=float32",
        content=(images / 255).astype("<f4").tobytes(),
        headers={"content-type": "application/octet-stream"},
    )
    assert [p["label"] for p in raw.json()["predictions"]] == [p["label"] for p in answer.json()["predictions"]]


# --- bad input: every case answers 4xx naming the problem, and the service keeps serving -----

GOOD = orjson.dumps({"instances": [[0.5] * 784]})
JSON = {"content-type": "application/json"}
RAW = {"content-type": "application/octet-stream"}
BAD_INPUTS = [
    # (case, request kwargs, status, error code, words the message must contain)
    ("invalid JSON", {"content": b'{"instances": [[0.1,', "headers": JSON}, 400, "invalid_json", "not valid JSON"),
    ("wrong content type", {"content": b"hello", "headers": {"content-type": "text/plain"}}, 415,
     "unsupported_media_type", "text/plain"),
    ("no content type", {"content": GOOD}, 415, "unsupported_media_type", "(none)"),
    ("missing field", {"content": b'{"images": []}', "headers": JSON}, 422, "invalid_input", '"instances"'),
    ("instances not a list", {"content": b'{"instances": 3}', "headers": JSON}, 422, "invalid_input", "not a list"),
    ("an array, not an object", {"content": b"[1, 2]", "headers": JSON}, 422, "invalid_input",
     'the JSON body is an array, not an object with "instances"'),
    ("instances of two forms", {"content": orjson.dumps({"instances": [[0.1] * 784, [[0.1] * 28] * 28]}),
     "headers": JSON}, 422, "invalid_input", "every instance of a request has one form"),
    ("wrong shape", {"content": b'{"instances": [[0.1, 0.2, 0.3]]}', "headers": JSON}, 422, "invalid_input",
     "shape [3]"),
    ("ragged", {"content": orjson.dumps({"instances": [[0.1] * 784, [0.1] * 783]}), "headers": JSON}, 422,
     "invalid_input", "regular array"),
    ("non-numeric", {"content": orjson.dumps({"instances": [["a"] * 784]}), "headers": JSON}, 422,
     "invalid_input", "non-numeric"),
    ("booleans", {"content": orjson.dumps({"instances": [[True] * 784]}), "headers": JSON}, 422,
     "invalid_input", "booleans"),
    ("booleans among numbers", {"content": orjson.dumps({"instances": [[0.5] * 783 + [True]]}), "headers": JSON},
     422, "invalid_input", "true or false"),
    ("nulls", {"content": orjson.dumps({"instances": [[None] * 784]}), "headers": JSON}, 422,
     "invalid_input", "non-numeric"),
    # one of each among numbers (numpy told the dtype would read "0.5" as 0.5 and null as NaN: it infers it)
    ("a string among numbers", {"content": orjson.dumps({"instances": [[0.5] * 783 + ["0.5"]]}), "headers": JSON},
     422, "invalid_input", "non-numeric"),
    ("a null among numbers", {"content": orjson.dumps({"instances": [[0.5] * 783 + [None]]}), "headers": JSON},
     422, "invalid_input", "non-numeric"),
    ("an object among numbers", {"content": orjson.dumps({"instances": [[0.5] * 783 + [{}]]}), "headers": JSON},
     422, "invalid_input", "non-numeric"),
    ("NaN literal", {"content": b'{"instances": [[NaN]]}', "headers": JSON}, 400, "invalid_json", "not valid JSON"),
    ("infinite number", {"content": b'{"instances": [[1e999]]}', "headers": JSON}, 400, "invalid_json",
     "infinity"),
    ("NaN in raw float32", {"content": np.full(784, np.nan, "<f4").tobytes(), "headers": RAW,
                            "params": {"dtype": "float32"}}, 422, "invalid_input", "perf_analyzer wants --input-data"),
    ("a normalised tensor", {"content": orjson.dumps({"instances": [[-2.1] * 392 + [2.2] * 392]}), "headers": JSON},
     422, "invalid_input", "send the image's intensities, not a normalised tensor"),
    ("out of range", {"content": orjson.dumps({"instances": [[255] * 784]}), "headers": JSON}, 422,
     "invalid_input", "divide them by 255"),
    ("empty list", {"content": b'{"instances": []}', "headers": JSON}, 422, "invalid_input", "no images"),
    ("too many instances", {"content": orjson.dumps({"instances": [[0.0] * 784] * (MAX_INSTANCES + 1)}),
                            "headers": JSON}, 413, "too_many_instances", f"at most {MAX_INSTANCES}"),
    ("body over the limit", {"content": b"0" * (MAX_BODY + 1), "headers": RAW}, 413, "body_too_large",
     str(MAX_BODY)),
    ("corrupt upload", {"files": {"file": ("x.png", b"\x89PNG\r\n\x1a\n" + b"\0garbage" * 10, "image/png")}}, 422,
     "invalid_input", "could not be decoded"),
    ("not an image", {"files": {"file": ("notes.txt", b"just some text", "text/plain")}}, 422, "invalid_input",
     "could not be decoded"),
    ("empty upload", {"files": {"file": ("x.png", b"", "image/png")}}, 422, "invalid_input", "empty"),
    ("no file field", {"files": {"picture": ("x.png", b"abc", "image/png")}}, 422, "invalid_input",
     "field `file`"),
    ("decompression bomb", {"files": {"file": ("bomb.png", png_header_only(100_000, 100_000), "image/png")}}, 413,
     "image_too_large", "10000000000 pixels"),
    ("raw length", {"content": b"\0" * 785, "headers": RAW}, 422, "invalid_input", "not a multiple"),
    ("raw empty", {"content": b"", "headers": RAW}, 422, "invalid_input", "no images"),
    ("raw dtype", {"content": b"\0" * 784, "headers": RAW, "params": {"dtype": "float64"}}, 422,
     "invalid_input", "float64"),
    ("deeply nested JSON", {"content": b'{"instances": ' + b"[" * 5000 + b"]" * 5000 + b"}", "headers": JSON},
     400, "invalid_json", "depth"),
    ("nested too deep for an image", {"content": b'{"instances": ' + b"[" * 200 + b"0" + b"]" * 200 + b"}",
                                      "headers": JSON}, 422, "invalid_input", "regular array"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("case", "request_kwargs", "status", "code", "words"), BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS]
)
def test_bad_input_gets_a_clear_4xx_and_the_service_keeps_serving(
    client: TestClient, case: str, request_kwargs: dict[str, object], status: int, code: str, words: str
) -> None:
    answer = client.post("/predict", **request_kwargs)  # type: ignore[arg-type]
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert error["code"] == code
    assert words in error["message"]
    assert error["expected"]
    good = client.post("/predict", content=GOOD, headers=JSON)
    assert good.status_code == 200


# --- probes, model card, metrics, docs --------------------------------------------------------


def test_probes_model_card_and_metrics() -> None:
    # An app of its own: the metrics are the process's, and every app this module starts and
    # stops beside the shared one (the not-ready and start-up failure tests) sets cgserve_ready
    # to 0 as it goes; this one is the last to set it here.
    with started_client() as client:
        probes_model_card_and_metrics(client)


def probes_model_card_and_metrics(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "alive"}
    assert client.get("/readyz").status_code == 200
    listing = client.get("/v1/models").json()
    (card,) = listing["models"]
    assert listing["default"] == "fashion-cnn"
    assert client.get("/v1/models/fashion-cnn").json() == card
    assert client.get("/v1/models/fashion-cnn/ready").json()["status"] == "ready"
    assert card["input"]["shape"] == [1, 28, 28]
    assert card["labels"][9] == "Ankle boot"
    assert card["engine"] == "eager" and card["device"] == "cpu"
    assert card["buckets"] == [1, 2, 4, 8, 16, 32, 64, 128]
    client.post("/predict", content=GOOD, headers=JSON)
    exposition = client.get("/metrics").text
    for name in (
        "cgserve_request_duration_seconds_bucket",
        "cgserve_queue_wait_seconds_bucket",
        "cgserve_batch_compute_seconds_bucket",
        "cgserve_batch_wall_seconds_bucket",
        "cgserve_batch_rows_bucket",
        "cgserve_padding_rows_total",
        "cgserve_queue_depth_rows",
        "cgserve_in_flight_batches",
        "cgserve_rejections_total",
        "cgserve_ready 1.0",
    ):
        assert name in exposition


def test_openapi_documents_every_input_form_with_an_example(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    content = spec["paths"]["/predict"]["post"]["requestBody"]["content"]
    assert set(content) == set(FORMAT_OF)  # every content type the route accepts
    assert content["application/json"]["examples"]
    assert "/v1/models/{name}/predict" in spec["paths"]
    for ref in ("PredictResponse", "ErrorResponse", "PredictRequest"):
        assert ref in spec["components"]["schemas"]
    # Swagger UI from the service itself, not a CDN: /docs works without internet.
    page = client.get("/docs")
    assert page.status_code == 200 and "cdn" not in page.text.lower()
    for asset in re.findall(r'(?:src|href)="(/[^"]+\.(?:js|css))"', page.text):
        assert client.get(asset).status_code == 200, asset


# --- readiness ------------------------------------------------------------------------------


def test_not_ready_until_the_engine_is_built_then_ready(monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()
    real_build = service_module.build_engine

    def slow_build(*args: object, **kwargs: object) -> object:
        release.wait(timeout=30)
        return real_build(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(service_module, "build_engine", slow_build)
    with TestClient(create_app(Settings())) as client:
        assert client.get("/healthz").status_code == 200
        starting = client.get("/readyz")
        assert starting.status_code == 503 and "starting" in starting.json()["detail"]
        model_starting = client.get("/v1/models/fashion-cnn/ready")
        assert model_starting.status_code == 503 and "starting" in model_starting.json()["detail"]
        refused = client.post("/predict", content=GOOD, headers=JSON)
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        release.set()
        client.portal.call(client.app.state.service.wait_started)  # type: ignore[attr-defined]
        assert client.get("/readyz").status_code == 200


def test_no_model_serves_while_the_jpeg_decoder_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    """The decoder's torchvision import holds the GIL for seconds: it runs before any model can
    take requests, not while they already do (run 15a: a tenth of the rate for ~10 s)."""
    models_ready: list[bool] = []
    app = create_app(Settings())

    def starting_decoder(setting: str, device: str, **decoder_settings: int | str) -> None:
        service = app.state.service
        models_ready.extend(served.batcher is not None for served in service.models.values())
        models_ready.append(service.readiness()[0])

    monkeypatch.setattr(service_module, "start_jpeg_decoder", starting_decoder)
    with TestClient(app) as client:
        client.portal.call(client.app.state.service.wait_started)  # type: ignore[attr-defined]
        assert client.get("/readyz").status_code == 200
    assert models_ready == [False, False]  # the one model's batcher, then the service's readiness


def test_start_up_failure_is_reported_and_stops_the_server(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken_build(*args: object, **kwargs: object) -> object:
        raise RuntimeError("bucket 8 differs from eager")

    monkeypatch.setattr(service_module, "build_engine", broken_build)
    stopped = threading.Event()
    with TestClient(create_app(Settings(), on_fatal=stopped.set)) as client:
        client.portal.call(client.app.state.service.wait_started)  # type: ignore[attr-defined]
        answer = client.get("/readyz")
        assert answer.status_code == 503
        assert "bucket 8 differs from eager" in answer.json()["detail"]
    assert stopped.is_set()


def test_promtool_check_metrics_finds_nothing_to_complain_about(client: TestClient) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        if os.environ.get("CI") == "true":
            pytest.fail("promtool is missing: apt-get install prometheus")
        pytest.skip("promtool is missing (Debian package prometheus)")
    client.post("/predict", content=GOOD, headers=JSON)
    client.post("/predict", content=b"{", headers=JSON)  # a rejection, so every family has samples
    exposition = client.get("/metrics").text
    checked = subprocess.run([promtool, "check", "metrics"], input=exposition, capture_output=True, text=True)
    assert checked.returncode == 0 and not checked.stdout.strip() and not checked.stderr.strip(), (
        checked.stdout + checked.stderr
    )


def test_jpeg_upload_and_a_larger_rgb_photo_are_made_28x28_grayscale(
    client: TestClient, sample: tuple[np.ndarray, np.ndarray]
) -> None:
    image, label = sample[0][0], int(sample[1][0])
    for size, mode in (((28, 28), "L"), ((280, 280), "RGB")):
        buffer = io.BytesIO()
        Image.fromarray(image).resize(size).convert(mode).save(buffer, format="JPEG", quality=95)
        answer = client.post("/predict", files={"file": ("boot.jpg", buffer.getvalue(), "image/jpeg")})
        assert answer.status_code == 200, answer.text
        assert answer.json()["predictions"][0]["label"] == label


def test_chunked_body_over_the_limit_is_counted_and_refused(client: TestClient) -> None:
    def chunks() -> Iterator[bytes]:  # no Content-Length: the middleware must count
        for _ in range(MAX_BODY // 4096 + 2):
            yield b"\0" * 4096

    answer = client.post("/predict", content=chunks(), headers=RAW)
    assert answer.status_code == 413 and answer.json()["error"]["code"] == "body_too_large"
    good = client.post("/predict", content=GOOD, headers=JSON)
    assert good.status_code == 200


def test_a_model_by_name_and_unknown_names_and_routes_get_the_error_envelope(client: TestClient) -> None:
    named = client.post("/v1/models/fashion-cnn/predict", content=GOOD, headers=JSON)
    assert named.status_code == 200 and named.json()["model"] == "fashion-cnn"
    for answer, status, code, words in (
        (client.post("/v1/models/nope/predict", content=GOOD, headers=JSON), 404, "unknown_model", "fashion-cnn"),
        (client.get("/v1/models/nope"), 404, "unknown_model", "fashion-cnn"),
        (client.get("/no/such/route"), 404, "not_found", "/no/such/route"),
        # Not a 307 to /predict built from the client's Host header (TestClient would follow it).
        (client.post("/predict/", content=GOOD, headers=JSON), 404, "not_found", "/predict/"),
        (client.delete("/predict"), 405, "method_not_allowed", "DELETE"),
    ):
        assert answer.status_code == status, answer.text
        error = answer.json()["error"]
        assert error["code"] == code and error["expected"]
        assert words in error["message"] + error["expected"]
    v2 = client.get("/v2/models/fashion-cnn/")  # the v2 protocol's own error form, {"error": "…"}
    assert v2.status_code == 404 and "/v2/models/fashion-cnn/" in v2.json()["error"]
    # A 405 names the method the route takes, not every route of the service.
    assert client.delete("/predict").json()["error"]["expected"] == "POST /predict"
    index = client.get("/v2/repository/index")
    assert index.status_code == 405 and index.json()["error"].endswith("expected POST /v2/repository/index")
