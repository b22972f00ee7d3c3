"""The inference routes that app/http/inline.py answers inside the HTTP protocol, each as its
ASGI route answers it: which paths, which bodies, how a body decodes, how an answer is written.

    POST /predict, /v1/models/{name}/predict                 JSON or raw bytes (app/http/routes/predict.py)
    POST /v2/models/{name}[/versions/{version}]/infer        JSON tensors or the binary tensor
                                                             extension (app/protocols/v2/rest.py)

Each route's functions are the ASGI route's own (decode, encode, error body), so both doors give
the same answer; tests/integration/test_inline_predict.py sends the same requests through both.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
from starlette.datastructures import QueryParams
from starlette.responses import Response

from app.codecs.bodies import decode_json, encode_predictions
from app.errors import ServiceError, error_response
from app.http.routes.predict import FORMAT_OF, decode_octets
from app.protocols.v2 import rest as v2_rest
from app.repository.model_spec import ModelSpec
from app.service import ServedModel, Service

Headers = list[tuple[bytes, bytes]]  # extra answer headers; [] for the common JSON answer
V2_HEADER_LENGTH = v2_rest.HEADER_LENGTH.encode()  # the binary extension's Inference-Header-Content-Length
# /predict's media types whose whole body is decoded at once (not multipart uploads), as bytes.
PREDICT_FORMS = {media.encode(): form for media, form in FORMAT_OF.items() if form in ("json", "raw")}


class InlineRoute(Protocol):
    protocol: str  # the metrics' protocol label

    def render(self, error: ServiceError) -> Response:
        """The route's error answer."""
        ...

    def form(self, media: bytes | None, header_length: bytes | None) -> str | None:
        """The body's form from its Content-Type and Inference-Header-Content-Length (the first of
        each, None where absent); None where the ASGI route answers it (e.g. a 415)."""
        ...

    def served(self, service: Service, model: str, version: str | None) -> ServedModel:
        """The model the path names, as the route looks it up (its errors included)."""
        ...

    def decode(self, body: bytes, form: str, query: bytes, header_length: bytes | None, spec: ModelSpec,
               max_instances: int) -> tuple[np.ndarray, Any]:  # fmt: skip
        """The images, (k, C, H, W), and what the answer needs to know of the request."""
        ...

    def answer(self, probabilities: np.ndarray, asked: Any, model: str, engine: str,
               spec: ModelSpec) -> tuple[Headers, bytes]:  # fmt: skip
        """The 200 answer's extra headers and body; raises what the route would answer instead."""
        ...


class PredictRoute:
    protocol = "rest"

    def render(self, error: ServiceError) -> Response:
        return error_response(error)

    def form(self, media: bytes | None, header_length: bytes | None) -> str | None:
        return PREDICT_FORMS.get(media or b"")

    def served(self, service: Service, model: str, version: str | None) -> ServedModel:
        return service.model(model or None)

    def decode(self, body: bytes, form: str, query: bytes, header_length: bytes | None, spec: ModelSpec,
               max_instances: int) -> tuple[np.ndarray, Any]:  # fmt: skip
        if form == "json":
            return decode_json(body, max_instances=max_instances, spec=spec), None
        return decode_octets(body, QueryParams(query), max_instances=max_instances, spec=spec), None

    def answer(self, probabilities: np.ndarray, asked: Any, model: str, engine: str,
               spec: ModelSpec) -> tuple[Headers, bytes]:  # fmt: skip
        return [], encode_predictions(probabilities, model=model, engine=engine, spec=spec)


class V2InferRoute:
    protocol = "v2"

    def render(self, error: ServiceError) -> Response:
        return v2_rest.v2_error(error)

    def form(self, media: bytes | None, header_length: bytes | None) -> str | None:
        return "json" if header_length is None else "binary"  # the route reads no Content-Type

    def served(self, service: Service, model: str, version: str | None) -> ServedModel:
        return v2_rest.served_model(service, model, version)

    def decode(self, body: bytes, form: str, query: bytes, header_length: bytes | None, spec: ModelSpec,
               max_instances: int) -> tuple[np.ndarray, Any]:  # fmt: skip
        length = None if header_length is None else header_length.decode("latin-1")
        asked, images = v2_rest.parse_infer(body, length, spec, max_instances)
        return images, asked  # which outputs, and how, the answer holds

    def answer(self, probabilities: np.ndarray, asked: Any, model: str, engine: str,
               spec: ModelSpec) -> tuple[Headers, bytes]:  # fmt: skip
        content, header_length = v2_rest.infer_answer(asked, spec, probabilities)
        if header_length is None:
            return [], content
        return [  # as the ASGI route's Response writes them, in its order
            (V2_HEADER_LENGTH, b"%d" % header_length),
            (b"content-length", b"%d" % len(content)),
            (b"content-type", b"application/octet-stream"),
        ], content


PREDICT, V2_INFER = PredictRoute(), V2InferRoute()
V1_PREFIX, PREDICT_SUFFIX = "/v1/models/", "/predict"
V2_PREFIX, INFER_SUFFIX, VERSIONS = "/v2/models/", "/infer", "/versions/"


def route_of(path: str) -> tuple[InlineRoute, str, str | None] | None:
    """(route, model as the path names it — "" for the default —, version or None) of an inline
    path, or None for any other (the ASGI router answers it)."""
    if path == PREDICT_SUFFIX:
        return PREDICT, "", None
    if path.startswith(V1_PREFIX) and path.endswith(PREDICT_SUFFIX):
        model = path[len(V1_PREFIX) : -len(PREDICT_SUFFIX)]
        return (PREDICT, model, None) if model and "/" not in model else None
    if path.startswith(V2_PREFIX) and path.endswith(INFER_SUFFIX):
        model, versions, version = path[len(V2_PREFIX) : -len(INFER_SUFFIX)].partition(VERSIONS)
        if not model or "/" in model or "/" in version or (versions and not version):
            return None
        return V2_INFER, model, version or None
    return None
