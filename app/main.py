"""The FastAPI application: routes, the body-size limit, error envelopes and the service's lifespan."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.telemetry import TelemetryConfig
from fastapi_offline import FastAPIOffline
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from app import __version__
from app.access.middleware import AccessLayers, access_layers
from app.config import Settings, get_settings
from app.dataplane import DataPlane
from app.engines.factory import EngineOptions
from app.errors import RouteError, error_response
from app.front_door.server import attach as attach_front_door
from app.http.fast_path import FastPath
from app.http.inline import InlinePredict
from app.http.inline_routes import PREDICT, V2_INFER, count_refused
from app.http.limits import BodyBudget, RequestGuard
from app.http.openapi import build_openapi
from app.http.protocol import HOOKS_KEY, ProtocolHooks
from app.http.routes import models, probes
from app.http.routes.predict import PredictCodec, predict
from app.model_control import ModelControl, RemoteModelControl, RepositoryControl
from app.ops import daemon_thread, metrics, tracing
from app.ops.loop_lag import GcPauses, sample_loop_lag
from app.protocols.v2 import repository as v2_repository
from app.protocols.v2 import rest as v2_rest
from app.protocols.v2.batch_limits import repository_infer_body_limit
from app.protocols.v2.rest import V2Codec
from app.repository import LoadedModel
from app.runtime.drain import drain_on_signals
from app.service import Service

log = logging.getLogger(__name__)

# No OpenTelemetry (Prometheus is the metrics path): with it off FastAPI skips its per-request
# provider look-ups, a few % of the request path under load (py-spy). The benchmark's no-op and
# naive servers use the same setting, so the comparison stays like for like.
NO_TELEMETRY: TelemetryConfig = {"tracing": False, "metrics": False, "logs": False}
ROUTES = (
    "POST /predict, POST /v1/models/{name}/predict, GET /v1/models[/{name}[/ready]], /healthz, /readyz, /metrics, "
    "/docs; the Open Inference Protocol under /v2"
)


def create_app(
    settings: Settings | None = None,
    *,
    prepared: list[tuple[LoadedModel, EngineOptions]] | None = None,
    on_fatal: Callable[[], None] = lambda: None,
    on_ready: Callable[[], None] = lambda: None,
    peers_ready: Callable[[], tuple[bool, str]] | None = None,
    owns_process: bool = False,
    engine_process: tuple[str, str] | None = None,
) -> FastAPI | AccessLayers:
    """The app; `prepared` models (loaded and checked by the CLI) save loading them twice.

    With several workers (app/runtime/workers.py), `on_ready` tells the others this one is ready and
    `peers_ready` says whether all of them are. `owns_process`: a server process ends itself at
    once after its shutdown when a device died, or where a model's forward or factory is still at work (in-process
    test clients keep their process).
    `engine_process`: (socket, segment folder) of the engine process that runs the engines."""
    settings = settings or get_settings()
    budget = BodyBudget(settings.max_inflight_bytes)  # bodies in flight, by the guard and the protocol alike
    # A v2 infer body's (HTTP) and message's (gRPC) limit, the same for both: read off the repository once.
    infer_body_bytes = repository_infer_body_limit(settings)
    hooks = ProtocolHooks.from_settings(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, ProtocolHooks]]:
        service = Service(
            settings, prepared=prepared, on_fatal=on_fatal, on_ready=on_ready, peers_ready=peers_ready,
            engine_process=engine_process,
        )  # fmt: skip
        app.state.service = service
        # The one infer path, and each HTTP wire format's codec for it (app/dataplane.py).
        plane = app.state.plane = DataPlane(service)
        app.state.predict_codec, app.state.v2_codec = PredictCodec(service), V2Codec(service)
        # Load and unload while serving: here, or in the engine process that holds the models.
        control: RepositoryControl = RemoteModelControl(service) if engine_process else ModelControl(service)
        app.state.control = control
        attach_front_door(service)  # where this process holds the engines and front_door_port is set
        service.start()
        control.start()
        gc_pauses = GcPauses()
        gc_pauses.install()
        lag_sampler = asyncio.create_task(sample_loop_lag(gc_pauses), name="loop-lag")
        grpc_server = None
        if settings.grpc_port:
            from app.protocols.v2.grpc_server import GrpcServer  # grpcio loads only where gRPC is on

            grpc_server = GrpcServer(plane, control, settings, message_limit=infer_body_bytes,
                                     reuse_port=settings.workers > 1)  # fmt: skip
            await grpc_server.start()
        if settings.inline_predict and not access_layers_on:
            codecs = {PREDICT: app.state.predict_codec, V2_INFER: app.state.v2_codec}
            hooks.inline = InlinePredict(plane, codecs, budget)  # the protocol answers small predicts
        try:
            with drain_on_signals(settings.drain_seconds, service.begin_drain, service.stop_accepting):
                yield {HOOKS_KEY: hooks}  # the server's protocol reads this app's limits and inline handler here
        finally:
            hooks.inline = None
            if grpc_server is not None:
                await grpc_server.stop()
            await control.stop()
            await service.stop()
            await asyncio.to_thread(tracing.flush)  # the last requests' and batches' spans
            lag_sampler.cancel()
            gc_pauses.remove()
            if service.device_dead and owns_process:
                # A kernel that never ends holds the interpreter's exit (CUDA's teardown waits for it,
                # and so does a thread stuck in a forward): leave now, non-zero, for the supervisor.
                logging.shutdown()
                os._exit(1)
            if owns_process:
                # A forward stuck in a model's code on the CPU (its batch outlived the stop's wait), a load's factory
                # still reading its model: neither is waited for (their threads would hold the interpreter's exit).
                # Non-zero: work was cut short (uvicorn's own ending, which this skips, would say 0 or the signal).
                daemon_thread.leave_now_if_unfinished(log, status=1)

    # FastAPIOffline serves Swagger UI and ReDoc from files in its wheel: /docs works offline.
    app = FastAPIOffline(
        title="cudagraph-serve",
        summary="CNNs served with dynamic batching and one CUDA graph per batch size.",
        version=__version__,
        lifespan=lifespan,
        telemetry=NO_TELEMETRY,
    )
    # No 307 from /predict/ to /predict: Starlette builds its Location from the client's Host header
    # (a redirect anywhere the client names), and a client that posts to a wrong path should learn
    # the right one from a 404 that lists the routes, not have its body re-sent. Triton answers 404.
    app.router.redirect_slashes = False
    app.include_router(probes.router)
    app.include_router(models.router)
    app.include_router(v2_rest.router)
    app.include_router(v2_repository.router)
    # The inference routes first: the router tries routes in order, and every request of the hot
    # path would otherwise be matched against each docs, probe, model and v2 route before its own.
    inference = [Route(path, predict, methods=["POST"], include_in_schema=False)
                 for path in ("/predict", "/v1/models/{name}/predict")]  # fmt: skip
    app.router.routes[:0] = [*inference, *v2_rest.INFER_ROUTES]
    limits = {"max_instances": settings.max_instances, "max_body_bytes": settings.max_body_bytes}
    app.openapi = lambda: build_openapi(app, **limits)  # type: ignore[method-assign]
    app.add_exception_handler(HTTPException, route_error)
    app.add_middleware(FastPath)  # inside the guard: the inference routes on their own task (app/http/fast_path.py)
    app.add_middleware(
        RequestGuard,
        max_body_bytes=settings.max_body_bytes,
        infer_body_bytes=infer_body_bytes,
        budget=budget,
        request_timeout_s=settings.request_timeout_s,
        body_timeout_s=settings.body_timeout_s,
        on_refused=count_refused,  # its refused inference requests in cgserve_requests_total, as routes count
    )
    layers = access_layers(settings)  # tokens, CORS, request ids, access log: none unless set
    # Access layers or tracing on: each request needs the ASGI stack (its layers, the data plane's
    # request span), so no inline path.
    access_layers_on = bool(layers) or settings.tracing != "off"
    return AccessLayers(app, layers) if layers else app


async def route_error(request: Request, error: Exception) -> Response:
    """404 and 405 from the router, in the same {"error": …} envelope as every other error."""
    assert isinstance(error, HTTPException)
    message = f"{request.method} {request.url.path}: {error.detail}"
    allowed = (error.headers or {}).get("Allow")  # 405: the route is right, its method is not
    expected = f"{allowed} {request.url.path}" if allowed else ROUTES
    route_error = RouteError(error.status_code, message, expected=expected)
    metrics.reject("", route_error.reason)  # no model: a path may name none that is served
    # The v2 protocol's clients expect its own error shape, {"error": "…"}.
    answer = v2_rest.v2_error(route_error) if request.url.path.startswith("/v2") else error_response(route_error)
    if error.headers:
        answer.headers.update(error.headers)  # 405's Allow
    return answer
