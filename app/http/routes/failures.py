"""How an inference route answers what went wrong, the same in every HTTP ingress."""

from __future__ import annotations

import logging
from collections.abc import Callable

from starlette.requests import ClientDisconnect
from starlette.responses import Response

from app.errors import ClientClosedError, ServiceError
from app.ops import metrics

log = logging.getLogger(__name__)


def failure_response(
    error: Exception, *, model: str, path: str, render: Callable[[ServiceError], Response]
) -> Response:
    """The answer to `error`, counted under its reason; `render` writes the ingress's error body.

    A client that went away gets nothing (it is not there) and is no error of ours: logged at
    info, counted as client_closed. Anything unexpected is logged with its traceback and is 500.
    """
    if isinstance(error, ClientDisconnect):
        log.info("%s: the client went away before its answer", path)
        metrics.reject(model, ClientClosedError.reason)
        return Response(status_code=ClientClosedError.status)
    if not isinstance(error, ServiceError):
        log.error("unexpected error in %s", path, exc_info=error)
        error = ServiceError("unexpected server error; it is logged with its traceback")
    metrics.reject(model, error.reason)
    return render(error)
