"""POST /predict and POST /v1/models/{name}/predict: the codec the data plane answers them with, and
the plain Starlette route that hands it every body form.

FastAPI's per-route machinery (exit stacks, dependency solving, response-model plumbing) costs a
large share of each request under load and this route uses none of it; app/http/openapi.py
documents it. Inference bodies usually take a faster front end (app/http/fast_path.py,
app/http/inline.py) with the same codec; this route answers the rest (a 415).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping

import numpy as np
from starlette.datastructures import QueryParams
from starlette.requests import Request
from starlette.responses import Response

from app.codecs.bodies import decode_json, decode_raw, encode_predictions
from app.codecs.uploads import DeferringDecoder, Images, JpegBatchDecoder, upload_images
from app.errors import ClientClosedError, InputError, ServiceError
from app.http.answer import HttpAnswer, HttpBody, error_answer, whole_body
from app.http.limits import deadline_of
from app.http.multipart import upload_in
from app.ops.off_loop import LARGE_JSON_BYTES, off_loop, off_loop_in_turn
from app.repository.model_spec import ModelSpec
from app.service import ServedModel, Service

log = logging.getLogger(__name__)
NO_QUERY: Mapping[str, str] = {}

ACCEPTED = "application/json, application/octet-stream, image/jpeg, image/png or multipart/form-data (field `file`)"
# Every form an image arrives in, one encoded image a body: an upload (multipart) or the body itself.
FORMAT_OF = {
    "application/json": "json",
    "application/octet-stream": "raw",
    "image/jpeg": "image",
    "image/png": "image",
    "multipart/form-data": "image",
}


class PredictCodec:
    """POST /predict and /v1/models/{name}/predict for the data plane: JSON instances, an image upload
    or raw packed images in; labels, class names and scores out."""

    protocol = "rest"

    def __init__(self, service: Service) -> None:
        self.service = service
        self.max_instances = service.settings.max_instances

    def served(self, model: str, version: str | None) -> ServedModel:
        return self.service.model(model or None)

    async def decode(self, request: HttpBody, spec: ModelSpec) -> tuple[Images, None]:
        settings = self.service.settings
        pixels = spec.max_image_pixels(settings.max_image_pixels)
        jpeg = self.service.jpeg_decoder
        return await decode_body(request, spec, max_instances=self.max_instances, max_pixels=pixels, jpeg=jpeg), None

    def decode_now(self, request: HttpBody, spec: ModelSpec) -> tuple[np.ndarray, None]:
        """A small JSON or raw body, here and now."""
        return decode_bytes(request, spec, self.max_instances), None

    def decode_cheaply(self, request: HttpBody, spec: ModelSpec) -> None:
        """A large JSON body or an image: the async decode's (a raw body is decoded now whatever its size)."""
        return None

    def encode(self, scores: np.ndarray, asked: None, served: ServedModel, engine: str) -> HttpAnswer:
        return HttpAnswer(200, encode_predictions(scores, model=served.spec.name, engine=engine, spec=served.spec))

    def failure(self, error: ServiceError) -> tuple[HttpAnswer, str]:
        return error_answer(error), str(error.status)

    def cancelled(self) -> tuple[str, str]:
        return str(ClientClosedError.status), ClientClosedError.reason


async def decode_body(
    request: HttpBody,
    spec: ModelSpec,
    *,
    max_instances: int,
    max_pixels: int,
    jpeg: JpegBatchDecoder | DeferringDecoder | None,
) -> Images:
    """The body as (k, C, H, W) uint8 pixels or float32 intensities, by its content type; large bodies
    decode off the event loop. `jpeg`: the service's batched GPU JPEG decoder, None for Pillow alone
    (the engine process's: an image upload may stay encoded, for it to decode, app/codecs/uploads.py).
    The benchmarks' no-op ceiling (loadtest/servers/) calls this too, so it decodes as the service does."""
    if request.media == "multipart/form-data":  # an upload in the field `file` (curl -F file=@photo.jpg)
        upload = await upload_in(request.content_type, request.body)
        return await upload_images([upload], max_pixels=max_pixels, spec=spec, gpu=jpeg)
    if FORMAT_OF.get(request.media) == "image":  # the body is the image (curl --data-binary @photo.jpg)
        return await upload_images([request.body], max_pixels=max_pixels, spec=spec, gpu=jpeg)
    if len(request.body) >= LARGE_JSON_BYTES:  # JSON in turn with the others; raw bytes are a view, at once
        decode = off_loop_in_turn if FORMAT_OF.get(request.media) == "json" else off_loop
        return await decode(decode_bytes, request, spec, max_instances)
    return decode_bytes(request, spec, max_instances)


def decode_bytes(request: HttpBody, spec: ModelSpec, max_instances: int) -> np.ndarray:
    """A JSON or raw body, here and now."""
    if request.media == "application/json":
        return decode_json(request.body, max_instances=max_instances, spec=spec)
    if request.media == "application/octet-stream":
        query = QueryParams(request.query) if request.query else NO_QUERY  # parsing nothing costs a raw request 5 %
        return decode_octets(request.body, query, max_instances=max_instances, spec=spec)
    raise unsupported(request.media)


def unsupported(media: str) -> InputError:
    return InputError(
        f"content type {media or '(none)'!r} is not accepted",
        expected=ACCEPTED,
        status=415,
        code="unsupported_media_type",
    )


def http_body(request: Request, media: str) -> Callable[[], Awaitable[HttpBody]]:
    """How a Starlette request's body is read, once admitted: whole, within the body limit, whatever its form."""

    async def read() -> HttpBody:
        if media not in FORMAT_OF:  # refused on its Content-Type, before a byte of it is read
            raise unsupported(media)
        content_type = request.headers.get("content-type", "").encode("latin-1")
        return HttpBody(await whole_body(request), media, request.url.query, content_type=content_type)

    return read


async def predict(request: Request) -> Response:
    """The Starlette route: every body form, through the data plane."""
    state = request.app.state
    media = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    answer = await state.plane.infer(
        state.predict_codec,
        http_body(request, media),
        model=request.path_params.get("name", ""),
        version=None,
        form=FORMAT_OF.get(media, "unsupported"),
        deadline=deadline_of(request.scope, state.plane.service.settings.request_timeout_s),
        path=request.url.path,
    )
    return answer.response()  # type: ignore[no-any-return]


def decode_octets(
    body: bytes | bytearray, query: Mapping[str, str], *, max_instances: int, spec: ModelSpec
) -> np.ndarray:
    """Packed images, in the dtype and layout the query names (uint8 NCHW unless told)."""
    dtype, layout = query.get("dtype", "uint8"), query.get("layout", "nchw")
    return decode_raw(body, dtype=dtype, layout=layout, max_instances=max_instances, spec=spec)
