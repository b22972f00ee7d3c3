"""What the reference servers share with the service: the body decoding (app.codecs' own
decoders, dispatched on content type as app/routes.py does), the error shape, the probes and
the uvicorn settings. Only what answers a decoded batch differs between them.
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable

import numpy as np
import orjson
import uvicorn
from fastapi import FastAPI, Request, Response

from app.codecs import decode_image, decode_json, decode_raw
from app.config import Settings
from app.errors import InputError

# The service's own upload reader (field `file`, its limits, its 400 for a broken body): private
# to app/routes.py, imported rather than copied so the ceiling cannot drift from it.
from app.routes import ACCEPTED, _read_upload

# The service's default limits, read from its settings: the ceiling refuses what the service refuses.
MAX_INSTANCES: int = Settings.model_fields["max_instances"].default
MAX_IMAGE_PIXELS: int = Settings.model_fields["max_image_pixels"].default


def decode(media: str, data: bytes, *, dtype: str = "uint8") -> np.ndarray:
    """A body of media type `media` (for multipart, the uploaded file) as float32 (k, 1, 28, 28);
    raises InputError. The one place loadtest calls app.codecs' decoders: when their arguments
    change, only this function follows."""
    if media == "application/json":
        return decode_json(data, max_instances=MAX_INSTANCES)
    if media == "application/octet-stream":
        return decode_raw(data, dtype=dtype, max_instances=MAX_INSTANCES)
    if media == "multipart/form-data":
        return decode_image(data, max_pixels=MAX_IMAGE_PIXELS)
    raise InputError(
        f"content type {media or '(none)'!r} is not accepted",
        expected=ACCEPTED,
        status=415,
        code="unsupported_media_type",
    )


async def decode_request(request: Request) -> np.ndarray:
    """The request's body decoded as app/routes.py decodes it: dispatched on its content type."""
    media = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    data = await _read_upload(request) if media == "multipart/form-data" else await request.body()
    return decode(media, data, dtype=request.query_params.get("dtype", "uint8"))


def error_response(error: InputError) -> Response:
    return Response(orjson.dumps(error.body()), status_code=error.status, media_type="application/json")


def predict_endpoint(answer: Callable[[np.ndarray], bytes]) -> Callable[[Request], Awaitable[Response]]:
    """POST /predict: the body decoded as the service decodes it, then `answer(images)` —
    float32 (k, 1, 28, 28) → the JSON answer — or the decoder's InputError."""

    async def predict(request: Request) -> Response:
        try:
            images = await decode_request(request)
        except InputError as error:
            return error_response(error)
        return Response(answer(images), media_type="application/json")

    return predict


def add_probes(app: FastAPI, is_ready: Callable[[], bool] = lambda: True) -> None:
    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "alive"}

    @app.get("/readyz")
    async def readyz() -> Response:
        ready = is_ready()
        body = orjson.dumps({"status": "ready" if ready else "not_ready"})
        return Response(body, status_code=200 if ready else 503, media_type="application/json")


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--workers", type=int, default=1, help="uvicorn worker processes (default 1)")
    p.add_argument("--log-level", default="warning")
    return p


def serve(app_path: str, args: argparse.Namespace) -> None:
    """uvicorn as the service runs it: uvloop and httptools where installed, no access log."""
    uvicorn.run(
        app_path,
        host=args.host,
        port=args.port,
        workers=args.workers,
        log_level=args.log_level,
        access_log=False,
        loop="auto",
        http="auto",
    )
