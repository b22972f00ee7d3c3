"""The OpenAPI document: FastAPI's own for the FastAPI routes, plus the plain predict routes.

The predict routes are plain Starlette routes (app/http/routes/predict.py says why), which FastAPI
does not see; their operations are written here, from the same pydantic models, so /docs shows
every body form with an example and every error with its shape.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from app.http.schemas import EXAMPLE_INSTANCE, ErrorResponse, PredictRequest, PredictResponse

ERRORS = {
    400: "Malformed JSON or multipart body",
    404: "No model of that name (the message lists those served)",
    413: "Body, image or instance count over its limit",
    415: "Unsupported content type",
    422: "Well-formed body whose content is not valid model input",
    500: "The batch this request rode in failed",
    503: "Not ready, or overloaded (Retry-After)",
    504: "Queued past the request deadline",
}
_REF = "#/components/schemas/{model}"


def predict_operation(summary: str, parameters: list[dict[str, Any]]) -> dict[str, Any]:
    def ref(model: type) -> dict[str, str]:
        return {"$ref": _REF.format(model=model.__name__)}

    return {
        "summary": summary,
        "parameters": [
            *parameters,
            {
                "name": "dtype",
                "in": "query",
                "required": False,
                "schema": {"type": "string", "enum": ["uint8", "float32"], "default": "uint8"},
                "description": "Element type of an application/octet-stream body.",
            },
            {
                "name": "layout",
                "in": "query",
                "required": False,
                "schema": {"type": "string", "enum": ["nchw", "nhwc"], "default": "nchw"},
                "description": "Order of an application/octet-stream body: N×C×H×W, or N×H×W×C as decoders give.",
            },
        ],
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {
                    "schema": ref(PredictRequest),
                    "examples": {
                        "nested": {"summary": "one 28×28 image (seed CNN)", "value": {"instances": [EXAMPLE_INSTANCE]}},
                        "flat": {"summary": "one flat 784-list (seed CNN)", "value": {"instances": [[0.0] * 784]}},
                    },
                },
                "multipart/form-data": {
                    "schema": {
                        "type": "object",
                        "properties": {"file": {"type": "string", "format": "binary"}},
                        "required": ["file"],
                    },
                    "description": "One PNG or JPEG in the field `file`: made the model's colour and size.",
                },
                **{
                    media: {
                        "schema": {"type": "string", "format": "binary"},
                        "description": "One PNG or JPEG as the whole body: made the model's colour and size.",
                    }
                    for media in ("image/jpeg", "image/png")
                },
                "application/octet-stream": {
                    "schema": {"type": "string", "format": "binary"},
                    "description": "N packed images: uint8 pixels (default) or little-endian float32 in [0, 1].",
                    # A real body: one blank 28×28 image of the seed CNN, 784 zero bytes.
                    "example": "\u0000" * 784,
                },
            },
        },
        "responses": {
            "200": {
                "description": "One prediction per image",
                "content": {"application/json": {"schema": ref(PredictResponse)}},
            },
            **{
                str(status): {"description": text, "content": {"application/json": {"schema": ref(ErrorResponse)}}}
                for status, text in ERRORS.items()
            },
        },
    }


BAD_REQUEST = {
    "description": "A path with an encoded control character, no Host header or two, or two Authorization headers",
    "content": {"application/json": {"schema": {"$ref": f"{_REF.format(model='ErrorResponse')}"}}},
}


def build_openapi(app: FastAPI, *, max_instances: int, max_body_bytes: int) -> dict[str, Any]:
    """The document, with the service's own limits written into it (what /docs promises is what it does)."""
    if app.openapi_schema is not None:
        return app.openapi_schema
    document = get_openapi(title=app.title, version=app.version, summary=app.summary, routes=app.routes)
    name = {"name": "name", "in": "path", "required": True, "schema": {"type": "string"},
            "description": "A model of the repository (GET /v1/models lists them)."}  # fmt: skip
    document["paths"]["/predict"] = {"post": predict_operation("Classify images with the default model", [])}
    document["paths"]["/v1/models/{name}/predict"] = {
        "post": predict_operation("Classify images with one model", [name])
    }
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    for model in (PredictRequest, PredictResponse, ErrorResponse):
        defined = model.model_json_schema(ref_template=_REF)
        schemas.update(defined.pop("$defs", {}))
        schemas[model.__name__] = defined
    schemas["PredictRequest"]["properties"]["instances"]["maxItems"] = max_instances
    for path in ("/predict", "/v1/models/{name}/predict"):
        operation = document["paths"][path]["post"]
        operation["description"] = (
            f"At most {max_instances} images a request (CGSERVE_MAX_INSTANCES) and {max_body_bytes} bytes a body "
            "(CGSERVE_MAX_BODY_BYTES)."
        )
    # Any route: the HTTP protocol refuses a path with an encoded control character, no Host or two, and two
    # Authorization headers before a route sees them (app/http/protocol.py).
    for operations in document["paths"].values():
        for operation in operations.values():
            operation.setdefault("responses", {}).setdefault("400", BAD_REQUEST)
    app.openapi_schema = document
    return document
