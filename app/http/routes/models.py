"""GET /v1/models and /v1/models/{name}: what is served, how, and what it measured at start-up."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import APIRouter, Response

from app.codecs.bodies import IMAGE_EXPECTED, json_expected, raw_expected
from app.errors import NotReadyError, ServiceError, error_response
from app.http.routes.probes import ServiceDep
from app.http.schemas import ErrorResponse
from app.service import ServedModel, Service

router = APIRouter()


@router.get("/v1/models", summary="Every served model, as GET /v1/models/{name} describes it")
async def list_models(service: ServiceDep) -> dict[str, Any]:
    return {"default": service.default_name, "models": [card(m, service) for m in service.models.values()]}


@router.get(
    "/v1/models/{name}",
    summary="One model: input, labels, format, engine, device, buckets, dtype, capture and validation figures, "
    "and its versions (the one described is the newest ready)",
    responses={404: {"model": ErrorResponse, "description": "No model of that name; the message lists those served"}},
)
async def describe_model(name: str, service: ServiceDep) -> Any:
    try:
        return card(service.model(name), service)
    except ServiceError as error:
        return error_response(error)


@router.get(
    "/v1/models/{name}/ready",
    summary="One model's readiness: 200 once its graphs are captured and validated, 503 before or when broken",
    responses={404: {"model": ErrorResponse}, 503: {"description": "Starting, failed or broken device"}},
)
async def model_ready(name: str, service: ServiceDep) -> Response:
    try:
        ready, detail = service.model(name).readiness()
    except NotReadyError as error:  # the repository is still being read
        ready, detail = False, error.message
    except ServiceError as error:
        return error_response(error)
    body = {"name": name, "status": "ready" if ready else "not_ready", "detail": detail}
    return Response(orjson.dumps(body), status_code=200 if ready else 503, media_type="application/json")


def card(served: ServedModel, service: Service) -> dict[str, Any]:
    spec, options, settings = served.spec, served.options, service.settings
    config = spec.config
    versions = service.versions.get(spec.name, {})
    described: dict[str, Any] = {
        "name": spec.name,
        "version": spec.version,  # the one described: the version calls that name none get
        "versions": {v: {"ready": versions[v].ready()} for v in sorted(versions, key=int)},
        "format": config.format,
        "input": {
            "shape": list(spec.input_shape),
            "dtypes": {"uint8": "pixels 0–255 (raw bytes, image uploads)", "float32": "intensities in [0, 1]"},
            "max_instances": settings.max_instances,
            "forms": {"json": json_expected(spec), "image": IMAGE_EXPECTED, "raw": raw_expected(spec)},
            "preprocess": config.preprocess.model_dump(exclude_none=True) | {"color": config.color},
        },
        "labels": list(spec.class_names),
        "ready": served.readiness()[0],
        "engine": options.engine,
        "device": ",".join(options.devices),  # as CGSERVE_DEVICE names them; per device: "devices"
        "devices": devices(served),
        "buckets": list(options.buckets),
        "dtype": options.dtype,
        "channels_last": options.channels_last,
        "batching": {
            "max_delay_ms": options.max_delay_ms,
            "queue_limit_rows": settings.queue_limit,
            "in_flight": settings.in_flight,
            "request_timeout_s": settings.request_timeout_s,
        },
    }
    if options.engine == "cuda-graph":
        described["compile"] = options.compile
    if config.format == "torchvision":
        described["architecture"] = config.architecture
        described["random_weights"] = config.weights is None
    if served.failure is not None:
        described["failure"] = served.failure
    if served.engines:  # the first device's figures; every device's engine is built alike
        report = served.engines[0].report
        described["startup_seconds"] = round(report.startup_seconds, 3)
        if report.capture_seconds:  # CUDA graphs only
            described["capture_seconds"] = {str(b): round(s, 6) for b, s in sorted(report.capture_seconds.items())}
            described["graph_pool_bytes"] = report.pool_bytes
        if report.validation_error:  # engines on a GPU, checked against fp32 eager
            described["validation_relative_error"] = {str(b): e for b, e in sorted(report.validation_error.items())}
        described.update(report.facts)
        if report.compile_fallback is not None:  # inductor failed: the graphs run the eager module
            asked = options.compile_mode if options.engine == "compile" else options.compile  # torch.compile's mode
            described["compile"] = f"none (compile {asked} failed: {report.compile_fallback})"
    return described


def devices(served: ServedModel) -> dict[str, dict[str, Any]]:
    """Device → its engine's state (starting, ready, dead …), GPU and batches launched and in flight."""
    states = served.device_states()
    described: dict[str, dict[str, Any]] = {device: {"state": state} for device, state in states.items()}
    for engine in served.engines:
        if "gpu" in engine.report.facts:
            described[engine.device]["gpu"] = engine.report.facts["gpu"]
    if served.batcher is not None:
        for device, figures in served.batcher.device_figures().items():
            described[device].update(figures)
    return described
