"""Pydantic models that document the HTTP API in OpenAPI (/docs).

The hot path does not validate through them (app/codecs.py decodes with orjson + numpy);
they exist so that clients see every form, field and error shape with an example.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from app.codecs import IMAGE_EXPECTED, JSON_EXPECTED, RAW_EXPECTED

_ROW = [0.0] * 20 + [0.5, 0.9, 1.0, 0.9, 0.5] + [0.0] * 3
EXAMPLE_INSTANCE = [_ROW] * 28


class PredictRequest(BaseModel):
    instances: list[list[float] | list[list[float]]] = Field(
        description="Images, each a 28×28 nested list or a flat list of 784 intensities in [0, 1].",
        min_length=1,
    )


class Prediction(BaseModel):
    label: int = Field(description="Index of the most probable class, 0–9.")
    class_name: str = Field(description="Fashion-MNIST name of that class.")
    scores: list[float] = Field(description="Softmax probability of each of the 10 classes.")


class PredictResponse(BaseModel):
    model: str
    engine: str = Field(description="eager or cuda-graph")
    predictions: list[Prediction] = Field(description="One per input image, in input order.")


class ErrorDetail(BaseModel):
    code: str = Field(description="Machine-readable: invalid_json, invalid_input, body_too_large, …")
    message: str = Field(description="What was wrong with this request.")
    expected: str | None = Field(None, description="What the service expects instead.")


class ErrorResponse(BaseModel):
    error: ErrorDetail


PREDICT_OPENAPI = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": PredictRequest.model_json_schema(),
                "examples": {
                    "nested": {"summary": "one 28×28 image", "value": {"instances": [EXAMPLE_INSTANCE]}},
                    "flat": {"summary": "one flat 784-list", "value": {"instances": [[0.0] * 784]}},
                },
                "description": JSON_EXPECTED,
            },
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "properties": {"file": {"type": "string", "format": "binary"}},
                    "required": ["file"],
                },
                "description": IMAGE_EXPECTED,
            },
            "application/octet-stream": {
                "schema": {"type": "string", "format": "binary"},
                "example": "<N×784 bytes: uint8 pixels, row-major>",
                "description": RAW_EXPECTED,
            },
        },
    },
    "parameters": [
        {
            "name": "dtype",
            "in": "query",
            "required": False,
            "schema": {"type": "string", "enum": ["uint8", "float32"], "default": "uint8"},
            "description": "Element type of an application/octet-stream body.",
        }
    ],
}
