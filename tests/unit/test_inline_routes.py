"""Which paths the protocol answers inline (app/http/inline_routes.py): exactly those the ASGI router
sends to POST /predict and to the Open Inference Protocol's infer, with the model and version
its path parameters would hold; every other path is left to the router."""

from __future__ import annotations

import pytest

from app.http.inline_routes import PREDICT, V2_INFER, route_of


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
