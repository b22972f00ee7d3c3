"""What the reference servers share with the service: the body decoding (the service's own
`decode_body` and `http_body`, dispatched on content type), the error shape, the probes and the uvicorn
settings. Only what answers a decoded batch differs between them.
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable

import numpy as np
import orjson
import uvicorn
from fastapi import FastAPI, Request, Response

from app.config import DEFAULT_REPOSITORY, Settings
from app.errors import InputError
from app.http.routes.predict import decode_body, http_body
from app.http.server_options import UVICORN_OPTIONS
from app.repository import read_repository
from app.repository.model_spec import ModelSpec

# The service's default limits, read from its settings: the ceiling refuses what the service refuses.
MAX_INSTANCES: int = Settings.model_fields["max_instances"].default
(SEED,) = read_repository(DEFAULT_REPOSITORY)  # the seed CNN's spec, as the service reads it
MAX_IMAGE_PIXELS: int = SEED.max_image_pixels(Settings.model_fields["max_image_pixels"].default)


async def decode_request(request: Request, spec: ModelSpec = SEED) -> np.ndarray:
    """The request's body decoded by the service's own route code: (k, C, H, W) uint8 pixels
    (raw bytes, uploads) or float32 intensities (JSON, raw float32); raises InputError."""
    media = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    pixels = spec.max_image_pixels(Settings.model_fields["max_image_pixels"].default)
    body = await http_body(request, media)()
    images = await decode_body(body, spec, max_instances=MAX_INSTANCES, max_pixels=pixels, jpeg=None)
    assert isinstance(images, np.ndarray)  # without a GPU decoder every image is decoded here
    return images


def error_response(error: InputError) -> Response:
    return Response(orjson.dumps(error.body()), status_code=error.status, media_type="application/json")


def predict_endpoint(
    answer: Callable[[np.ndarray], bytes], spec: Callable[[], ModelSpec] = lambda: SEED
) -> Callable[[Request], Awaitable[Response]]:
    """POST /predict: the body decoded as the service decodes it for the model `spec()` names
    (the seed CNN unless told), then `answer(images)` — (k, C, H, W) → the JSON answer — or the
    decoder's InputError."""

    async def predict(request: Request) -> Response:
        try:
            images = await decode_request(request, spec())
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
        app_path, host=args.host, port=args.port, workers=args.workers, log_level=args.log_level, **UVICORN_OPTIONS
    )
