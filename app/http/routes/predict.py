"""POST /predict and POST /v1/models/{name}/predict: plain Starlette routes on the hot path.

FastAPI's per-route machinery (exit stacks, dependency solving, response-model plumbing) cost a
third of each request under load (py-spy; bench/results/README.md has the figures) and these
handlers use none of it. app/http/openapi.py documents them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

import numpy as np
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.formparsers import MultiPartException
from starlette.requests import Request
from starlette.responses import Response

from app.codecs.bodies import IMAGE_EXPECTED, decode_json, decode_raw, encode_predictions
from app.codecs.uploads import JpegBatchDecoder, decode_upload
from app.errors import InputError, error_response, within
from app.http.limits import DEADLINE_KEY
from app.http.routes.failures import failure_response
from app.ops import metrics
from app.ops.off_loop import LARGE_JSON_BYTES, off_loop
from app.repository.model_spec import ModelSpec
from app.service import Service

log = logging.getLogger(__name__)

ACCEPTED = "application/json, multipart/form-data (field `file`) or application/octet-stream"
FORMAT_OF = {"application/json": "json", "multipart/form-data": "image", "application/octet-stream": "raw"}


async def predict(request: Request) -> Response:
    started = time.perf_counter()
    service: Service = request.app.state.service
    media = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    form = FORMAT_OF.get(media, "unsupported")
    name = ""  # the metrics' model label: a served model's name, never what the client wrote
    try:
        served = service.model(request.path_params.get("name") or None)
        name = served.spec.name
        batcher = served.ready_batcher()
        deadline = request.scope.get(DEADLINE_KEY) or time.monotonic() + service.settings.request_timeout_s
        batcher.admit(deadline)  # refused here, before a byte of the body is read
        settings = service.settings
        pixels = served.spec.max_image_pixels(settings.max_image_pixels)
        limits = {"max_instances": settings.max_instances, "max_image_pixels": pixels}
        async with within(deadline):
            images = await decode_body(request, media, served.spec, **limits, jpeg=service.jpeg_decoder)
            probabilities = await batcher.submit(images, deadline)
        body = encode_predictions(probabilities, model=name, engine=batcher.engines[0].name, spec=served.spec)
        response = Response(body, media_type="application/json")
    except Exception as error:
        response = failure_response(error, model=name, path=request.url.path, render=error_response)
    metrics.observe_request(name, "rest", form, str(response.status_code), time.perf_counter() - started)
    return response


async def decode_body(
    request: Request,
    media: str,
    spec: ModelSpec,
    *,
    max_instances: int,
    max_image_pixels: int,
    jpeg: JpegBatchDecoder | None = None,
) -> np.ndarray:
    """The body as (k, C, H, W) uint8 pixels or float32 intensities, by its content type.

    `jpeg`: the service's batched GPU JPEG decoder, None for Pillow alone. The benchmark's no-op
    ceiling (loadtest/servers/) calls this too, so it decodes exactly as the service does."""
    if media == "application/json":
        body = await request.body()
        if len(body) < LARGE_JSON_BYTES:
            return decode_json(body, max_instances=max_instances, spec=spec)
        return await off_loop(decode_json, body, max_instances=max_instances, spec=spec)
    if media == "application/octet-stream":
        return decode_octets(await request.body(), request.query_params, max_instances=max_instances, spec=spec)
    if media == "multipart/form-data":
        return await decode_upload(await read_upload(request), max_pixels=max_image_pixels, spec=spec, gpu=jpeg)
    raise InputError(
        f"content type {media or '(none)'!r} is not accepted",
        expected=ACCEPTED,
        status=415,
        code="unsupported_media_type",
    )


def decode_octets(body: bytes, query: Mapping[str, str], *, max_instances: int, spec: ModelSpec) -> np.ndarray:
    """Packed images, in the dtype and layout the query names (uint8 NCHW unless told)."""
    dtype, layout = query.get("dtype", "uint8"), query.get("layout", "nchw")
    return decode_raw(body, dtype=dtype, layout=layout, max_instances=max_instances, spec=spec)


async def read_upload(request: Request) -> bytes:
    try:
        async with request.form(max_files=1, max_fields=8) as form:
            upload = form.get("file")
            if not isinstance(upload, UploadFile):
                raise InputError("the multipart body has no file in the field `file`", expected=IMAGE_EXPECTED)
            return await upload.read()
    except (MultiPartException, HTTPException) as error:
        detail = getattr(error, "detail", None) or getattr(error, "message", str(error))
        raise InputError(
            f"the multipart body could not be parsed: {detail}",
            expected=IMAGE_EXPECTED,
            status=400,
            code="invalid_multipart",
        ) from None
