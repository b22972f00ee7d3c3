"""The FastAPI application: routes, the body-size limit and the service's lifespan."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.telemetry import TelemetryConfig
from starlette.routing import Route

from app.body_limit import BodyLimitMiddleware
from app.config import Settings, get_settings
from app.routes import predict, router
from app.service import Service

# No OpenTelemetry (Prometheus is the metrics path): with it off FastAPI skips its per-request
# provider look-ups, a few % of the request path under load (py-spy). The benchmark's no-op and
# naive servers use the same setting, so the comparison stays like for like.
NO_TELEMETRY: TelemetryConfig = {"tracing": False, "metrics": False, "logs": False}


def create_app(settings: Settings | None = None, *, on_fatal: Callable[[], None] = lambda: None) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        service = Service(settings, on_fatal=on_fatal)
        app.state.service = service
        service.start()
        try:
            yield
        finally:
            await service.stop()

    app = FastAPI(
        title="cudagraph-serve",
        summary="A Fashion-MNIST CNN served with dynamic batching and one CUDA graph per batch size.",
        version="0.1.0",
        lifespan=lifespan,
        telemetry=NO_TELEMETRY,
    )
    app.include_router(router)
    # POST /predict is served by a plain Starlette route placed ahead of its FastAPI twin, which
    # stays only to document the three body forms in OpenAPI. FastAPI's per-route machinery
    # (exit stacks, dependency solving, response-model plumbing) cost a third of each request
    # under load (py-spy) and the handler uses none of it; bench/results/README.md has the figures.
    app.router.routes.insert(0, Route("/predict", predict, methods=["POST"], include_in_schema=False))
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    return app
