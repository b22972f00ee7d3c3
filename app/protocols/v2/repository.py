"""Triton's model repository extension over HTTP: the translator in front of app/model_control.py.

    POST /v2/repository/index                    [{"name", "version", "state", "reason"}, …]; body {"ready": true}
                                                 lists the ready ones only
    POST /v2/repository/models/{name}/load       read the model's folder afresh, build it beside what serves,
                                                 switch to it once ready: 200 {} when it serves
    POST /v2/repository/models/{name}/unload     its calls stop now; what it admitted is answered, then freed

Load and unload need CGSERVE_MODEL_CONTROL=explicit (otherwise 503 with Triton's words); admin tokens
where they are set (app/access/auth.py). Errors are the protocol's {"error": "…"}.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import Response

from app.errors import ServiceError
from app.http.schemas import V2_CONTROL_ERRORS
from app.model_control import IGNORED_LOAD_PARAMETERS, LOAD_EXPECTED, ControlError, RepositoryControl
from app.protocols.v2.rest import JSON, v2_error

router = APIRouter(prefix="/v2/repository", tags=["Open Inference Protocol: model repository extension"])


def _control(request: Request) -> RepositoryControl:
    control: RepositoryControl = request.app.state.control
    return control


async def _parameters(request: Request) -> dict[str, Any]:
    """The body's "parameters" (an empty body or none: {}); ControlError 400 for a malformed body."""
    body = await request.body()
    try:
        document = orjson.loads(body) if body.strip() else {}
    except orjson.JSONDecodeError as error:
        raise ControlError(
            400, f"the body is not valid JSON: {error}", expected='{"parameters": {…}} or none'
        ) from None
    if not isinstance(document, dict) or not isinstance(document.get("parameters", {}), dict):
        raise ControlError(400, "the body is not a JSON object with a parameters object", expected="{}")
    parameters: dict[str, Any] = document.get("parameters", {})
    return parameters


@router.post("/index", summary="Every model of the repository, each version with its state")
async def index(request: Request) -> Response:
    body = await request.body()
    try:
        document = orjson.loads(body) if body.strip() else {}
    except orjson.JSONDecodeError:
        document = {}
    ready_only = isinstance(document, dict) and document.get("ready") is True
    return Response(orjson.dumps(await _control(request).index(ready_only=ready_only)), media_type=JSON)


@router.post(
    "/models/{name}/load", summary="Load (or reload) a model from the repository, beside what serves",
    responses=V2_CONTROL_ERRORS,
)  # fmt: skip
async def load(name: str, request: Request) -> Response:
    return await _call(request, lambda control: control.load(name), check_load_parameters=True)


@router.post(
    "/models/{name}/unload", summary="Unload a model: what it admitted is answered, then it is freed",
    responses=V2_CONTROL_ERRORS,
)  # fmt: skip
async def unload(name: str, request: Request) -> Response:
    # unload_dependents is taken and not acted on: there are no ensembles, so nothing depends on a model.
    return await _call(request, lambda control: control.unload(name), check_load_parameters=False)


async def _call(
    request: Request, operation: Callable[[RepositoryControl], Awaitable[None]], *, check_load_parameters: bool
) -> Response:
    """A load or an unload: {} once done, or the protocol's {"error": "…"} with its status."""
    try:
        parameters = await _parameters(request)
        unsupported = sorted(key for key in parameters if key not in IGNORED_LOAD_PARAMETERS)
        if check_load_parameters and unsupported:
            raise ControlError(400, f"load parameters {unsupported} are not supported", expected=LOAD_EXPECTED)
        await operation(_control(request))
    except ServiceError as error:
        return v2_error(error)
    return Response(b"{}", media_type=JSON)
