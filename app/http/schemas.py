"""Pydantic models that document the HTTP API in OpenAPI (/docs).

The hot path does not validate through them (app/codecs/bodies.py decodes with orjson + numpy);
they exist so that clients see every form, field and error shape with an example.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

_ROW = [0.0] * 20 + [0.5, 0.9, 1.0, 0.9, 0.5] + [0.0] * 3
EXAMPLE_INSTANCE = [_ROW] * 28  # one 28×28 image for the default seed CNN


class PredictRequest(BaseModel):
    instances: list[list[float] | list[list[float]] | list[list[list[float]]]] = Field(
        description="Images, each a C×H×W (or H×W for one channel) nested list or a flat list of C·H·W "
        "intensities in [0, 1]; GET /v1/models/{name} gives the model's C, H and W.",
        min_length=1,
    )


class Prediction(BaseModel):
    label: int = Field(description="Index of the most probable class.")
    class_name: str = Field(description="That class's label from the model's model.toml.")
    scores: list[float] = Field(
        description="A score per class, in label order: what the answer's `postprocess` says (softmax "
        "probabilities by default; sigmoid per class; none: the model's own outputs)."
    )


class PredictResponse(BaseModel):
    model: str
    engine: str = Field(description="eager, cuda-graph, compile or onnxruntime")
    postprocess: str = Field(description="softmax, sigmoid or none: model.toml's postprocess, what `scores` are")
    predictions: list[Prediction] = Field(description="One per input image, in input order.")


class ErrorDetail(BaseModel):
    code: str = Field(description="Machine-readable: invalid_json, invalid_input, body_too_large, unknown_model, …")
    message: str = Field(description="What was wrong with this request.")
    expected: str | None = Field(None, description="What the service expects instead.")


class ErrorResponse(BaseModel):
    error: ErrorDetail


class V2Error(BaseModel):
    """The Open Inference Protocol's error body."""

    error: str = Field(description="What was wrong, and what is expected.")


V2_NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": V2Error, "description": "No such model or version; the message lists what exists"}
}


_V2_ERROR, _SERVICE_ERROR = {"$ref": "#/components/schemas/V2Error"}, {"$ref": "#/components/schemas/ErrorResponse"}
# The model repository extension's load and unload (app/protocols/v2/repository.py).
V2_CONTROL_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {
        "description": 'The model\'s files could not be loaded, or the body is malformed ({"error": "…"}); or '
        "the HTTP protocol refused the request line before any route saw it (the service's envelope)",
        "content": {"application/json": {"schema": {"anyOf": [_V2_ERROR, _SERVICE_ERROR]}}},
    },
    404: {"model": V2Error, "description": "No model of that name in the repository"},
    503: {"model": V2Error, "description": "Model control is off (CGSERVE_MODEL_CONTROL), or the server is starting"},
}


class ReadyAnswer(BaseModel):
    ready: bool
