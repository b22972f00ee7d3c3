"""HTTP routes: POST /predict, the health probes, the model card and /metrics."""

from __future__ import annotations

import functools
import logging
import time
from typing import Annotated, Any

import numpy as np
import orjson
from fastapi import APIRouter, Depends, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.formparsers import MultiPartException

from app import metrics
from app.codecs import (
    IMAGE_EXPECTED,
    JSON_EXPECTED,
    RAW_EXPECTED,
    decode_image,
    decode_json,
    decode_raw,
    encode_predictions,
)
from app.errors import InputError, ServiceError
from app.schemas import PREDICT_OPENAPI, ErrorResponse, PredictResponse
from app.service import Service

log = logging.getLogger(__name__)
router = APIRouter()

ACCEPTED = "application/json, multipart/form-data (field `file`) or application/octet-stream"
_FORMAT_OF = {"application/json": "json", "multipart/form-data": "image", "application/octet-stream": "raw"}


async def get_service(request: Request) -> Service:
    # async: FastAPI runs a plain `def` dependency on a worker thread, a thread hop per request.
    service: Service = request.app.state.service
    return service


ServiceDep = Annotated[Service, Depends(get_service)]


@router.post(
    "/predict",
    summary="Classify Fashion-MNIST images",
    response_model=PredictResponse,
    responses={
        status: {"model": ErrorResponse, "description": description}
        for status, description in {
            400: "Malformed JSON or multipart body",
            413: "Body, image or instance count over its limit",
            415: "Unsupported content type",
            422: "Well-formed body whose content is not valid model input",
            500: "The batch this request rode in failed",
            503: "Not ready, or overloaded (Retry-After)",
            504: "Queued past the request deadline",
        }.items()
    },
    openapi_extra=PREDICT_OPENAPI,
)
async def predict(request: Request) -> Response:
    started = time.perf_counter()
    service: Service = request.app.state.service  # no Depends on the hot path: nothing to solve
    media = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    form = _FORMAT_OF.get(media, "unsupported")
    try:
        batcher = service.ready_batcher()
        images = await _decode(request, media, service)
        probabilities = await batcher.submit(images)
        body = encode_predictions(probabilities, model=service.spec.name, engine=batcher.engine.name, spec=service.spec)
        response = Response(body, media_type="application/json")
    except ServiceError as error:
        metrics.REJECTIONS.labels(reason=error.reason).inc()
        response = error_response(error)
    except Exception:
        log.exception("unexpected error in POST /predict")
        internal = ServiceError("unexpected server error; it is logged with its traceback")
        metrics.REJECTIONS.labels(reason=internal.reason).inc()
        response = error_response(internal)
    counter, latency = _request_metrics(form, response.status_code)
    counter.inc()
    latency.observe(time.perf_counter() - started)
    return response


@functools.cache
def _request_metrics(form: str, status: int) -> tuple[Any, Any]:
    """The labelled children, looked up once per (format, status) instead of per request."""
    return metrics.REQUESTS.labels(format=form, code=str(status)), metrics.REQUEST_LATENCY.labels(format=form)


async def _decode(request: Request, media: str, service: Service) -> np.ndarray:
    settings = service.settings
    if media == "application/json":
        return decode_json(await request.body(), max_instances=settings.max_instances, spec=service.spec)
    if media == "application/octet-stream":
        dtype = request.query_params.get("dtype", "uint8")
        body = await request.body()
        return decode_raw(body, dtype=dtype, max_instances=settings.max_instances, spec=service.spec)
    if media == "multipart/form-data":
        return decode_image(await _read_upload(request), max_pixels=settings.max_image_pixels, spec=service.spec)
    raise InputError(
        f"content type {media or '(none)'!r} is not accepted",
        expected=ACCEPTED,
        status=415,
        code="unsupported_media_type",
    )


async def _read_upload(request: Request) -> bytes:
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


def error_response(error: ServiceError) -> Response:
    return Response(
        orjson.dumps(error.body()), status_code=error.status, headers=error.headers, media_type="application/json"
    )


@router.get("/healthz", summary="Liveness: the process answers")
async def healthz() -> dict[str, str]:
    return {"status": "alive"}


@router.get(
    "/readyz",
    summary="Readiness: 200 once graphs are captured and validated, 503 before or when broken",
    responses={503: {"description": "Starting, failed or broken device"}},
)
async def readyz(service: ServiceDep) -> Response:
    ready, detail = service.readiness()
    return Response(
        orjson.dumps({"status": "ready" if ready else "not_ready", "detail": detail}),
        status_code=200 if ready else 503,
        media_type="application/json",
    )


@router.get("/v1/models", summary="The served model: input spec, labels, engine, device, buckets")
async def models(service: ServiceDep) -> dict[str, Any]:
    spec, settings, engine = service.spec, service.settings, service.engine
    c, h, w = spec.input_shape
    card: dict[str, Any] = {
        "name": spec.name,
        "input": {
            "shape": [c, h, w],
            "dtype": "float32",
            "range": [0.0, 1.0],
            "max_instances": settings.max_instances,
            "forms": {"json": JSON_EXPECTED, "image": IMAGE_EXPECTED, "raw": RAW_EXPECTED},
        },
        "labels": list(spec.class_names),
        "ready": service.readiness()[0],
        "batching": {
            "max_delay_ms": settings.max_delay_ms,
            "queue_limit_rows": settings.queue_limit,
            "in_flight": settings.in_flight,
            "request_timeout_s": settings.request_timeout_s,
        },
    }
    if engine is not None:
        card.update(engine=engine.name, device=engine.device, buckets=list(engine.buckets), **engine.describe())
    return {"models": [card]}


@router.get("/metrics", summary="Prometheus metrics", response_class=Response)
async def prometheus_metrics() -> Response:
    return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)
