"""What the reference servers share with the service: the body decoding (app.codecs, dispatched
on content type as app/routes.py does), the error shape, the probes and the uvicorn settings.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import numpy as np
import orjson
import uvicorn
from fastapi import FastAPI, Request, Response
from starlette.datastructures import UploadFile

from app.codecs import IMAGE_EXPECTED, decode_image, decode_json, decode_raw
from app.errors import InputError

MAX_INSTANCES = 1024  # the service's default CGSERVE_MAX_INSTANCES
MAX_IMAGE_PIXELS = 4096 * 4096  # the service's default CGSERVE_MAX_IMAGE_PIXELS


async def decode_request(request: Request) -> np.ndarray:
    """The body as float32 (k, 1, 28, 28), decoded by app.codecs; raises InputError."""
    media = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if media == "application/json":
        return decode_json(await request.body(), max_instances=MAX_INSTANCES)
    if media == "application/octet-stream":
        dtype = request.query_params.get("dtype", "uint8")
        return decode_raw(await request.body(), dtype=dtype, max_instances=MAX_INSTANCES)
    if media == "multipart/form-data":
        async with request.form(max_files=1, max_fields=8) as form:
            upload = form.get("file")
            if not isinstance(upload, UploadFile):
                raise InputError("the multipart body has no file in the field `file`", expected=IMAGE_EXPECTED)
            return decode_image(await upload.read(), max_pixels=MAX_IMAGE_PIXELS)
    raise InputError(f"content type {media!r} is not accepted", expected="json, multipart or octet-stream", status=415)


def error_response(error: InputError) -> Response:
    return Response(orjson.dumps(error.body()), status_code=error.status, media_type="application/json")


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
