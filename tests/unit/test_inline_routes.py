"""Which paths the protocol answers inline (app/http/inline_routes.py): exactly those the ASGI router
sends to POST /predict and to the Open Inference Protocol's infer, with the model and version
its path parameters would hold; every other path is left to the router."""

from __future__ import annotations

import pytest

from app.http.inline_routes import PREDICT, PREDICT_FORMS, V2_INFER, form_of, route_of
from app.http.routes.predict import FORMAT_OF


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/predict", (PREDICT, "", None)),
        ("/v1/models/fashion-cnn/predict", (PREDICT, "fashion-cnn", None)),
        ("/v2/models/fashion-cnn/infer", (V2_INFER, "fashion-cnn", None)),
        ("/v2/models/fashion-cnn/versions/1/infer", (V2_INFER, "fashion-cnn", "1")),
        ("/v2/models/versions/infer", (V2_INFER, "versions", None)),  # a model may be named so
    ],
)
def test_the_inference_paths_are_taken_with_their_parameters(path: str, expected: tuple) -> None:
    assert route_of(path) == expected


@pytest.mark.parametrize(
    "path",
    [
        "/predict/", "/predictx", "/v1/models//predict", "/v1/models/a/b/predict", "/v1/models/predict",
        "/v2/models//infer", "/v2/models/a/b/infer", "/v2/models/m/versions//infer",
        "/v2/models/m/versions/1/2/infer", "/v2/models/m/ready", "/v2/models/m/infer/", "/healthz",
    ],
)  # fmt: skip
def test_other_paths_are_left_to_the_router(path: str) -> None:
    assert route_of(path) is None


@pytest.mark.parametrize(
    ("media", "form"),
    [
        (b"application/json", "json"),
        (b"application/octet-stream", "raw"),
        (b"image/jpeg", "image"),
        (b"image/png", "image"),
        (b"multipart/form-data", "image"),  # uploads too: read inline since 61188db
        (b"text/plain", None),  # the route's 415
        (None, None),
    ],
)
def test_every_body_form_the_route_takes_is_taken_inline(media: bytes | None, form: str | None) -> None:
    assert form_of(PREDICT, media, None) == form
    assert {m.decode() for m in PREDICT_FORMS} == set(FORMAT_OF)  # nothing the route takes is left to it


def test_the_v2_infer_form_comes_from_its_header_length_alone() -> None:
    assert form_of(V2_INFER, b"text/plain", None) == "json"
    assert form_of(V2_INFER, None, b"120") == "binary"
