"""Health probes and /metrics: what orchestrators and Prometheus poll."""

from __future__ import annotations

from typing import Annotated

import orjson
from fastapi import APIRouter, Depends, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST

from app.ops import metrics
from app.service import Service

router = APIRouter()


async def get_service(request: Request) -> Service:
    # async: FastAPI runs a plain `def` dependency on a worker thread, a thread hop per request.
    service: Service = request.app.state.service
    return service


ServiceDep = Annotated[Service, Depends(get_service)]


@router.get("/healthz", summary="Liveness: the process answers")
async def healthz() -> dict[str, str]:
    return {"status": "alive"}


@router.get(
    "/readyz",
    summary="Readiness: 200 once every model's graphs are captured and validated, 503 before or when broken",
    responses={503: {"description": "Starting, failed or broken device; `detail` says which model"}},
)
async def readyz(service: ServiceDep) -> Response:
    ready, detail = service.readiness()
    return Response(
        orjson.dumps({"status": "ready" if ready else "not_ready", "detail": detail}),
        status_code=200 if ready else 503,
        media_type="application/json",
    )


@router.get("/metrics", summary="Prometheus metrics", response_class=Response)
async def prometheus_metrics() -> Response:
    return Response(await metrics.exposition_off_loop(), media_type=CONTENT_TYPE_LATEST)
