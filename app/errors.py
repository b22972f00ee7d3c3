"""Errors that become HTTP answers, each with a status, a code, what was wrong and what was expected.

Every error body has one shape: {"error": {"code": ..., "message": ..., "expected": ...}}. One error here
never becomes an answer: GpuDecodeError, the GPU decoder's refusal of an upload, which sends it to Pillow.
"""

from __future__ import annotations

import math

import orjson
from starlette.responses import Response


def quoted(text: object, most: int = 60) -> str:
    """A client's string in an error message: its repr, cut after `most` characters. The client does not
    choose the answer's size: a gRPC status travels in trailers of at most 16 KiB, and a 20,000-character
    model name there lost the call's status code to RESOURCE_EXHAUSTED."""
    shown = repr(text)
    return shown if len(shown) <= most else f"{shown[: most - 3]}..."


def error_line(error: BaseException, most: int = 400) -> str:
    """An exception as one line for a start-up problem, "Type: message", at most about `most` characters. A longer
    message keeps its head and its tail: a TorchScript or onnxruntime traceback names the real cause last ("expected
    input to have 3 channels, but got 1"), which a cut at the head alone dropped."""
    text = " ".join(str(error).split())
    if len(text) > most:
        head = most // 3
        text = f"{text[:head]} … {text[len(text) - (most - head) :]}"
    return f"{type(error).__name__}: {text}"


class ServiceError(Exception):
    status: int = 500
    code: str = "internal_error"
    # The label on cgserve_rejections_total.
    reason: str = "engine_error"

    def __init__(self, message: str, *, expected: str = "", headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.expected = expected
        self.headers = headers or {}

    def text(self) -> str:
        """What was wrong, and what was expected where the error says: one line (a gRPC status, the v2 error)."""
        return f"{self.message}; expected {self.expected}" if self.expected else self.message

    def body(self) -> dict[str, dict[str, str]]:
        error = {"code": self.code, "message": self.message}
        if self.expected:
            error["expected"] = self.expected
        return {"error": error}


class InputError(ServiceError):
    """The request itself is wrong: the client must change it."""

    status = 422
    code = "invalid_input"
    reason = "invalid_input"

    def __init__(self, message: str, *, expected: str, status: int = 422, code: str = "invalid_input") -> None:
        super().__init__(message, expected=expected)
        self.status = status
        self.code = code


class BodyTooLargeError(InputError):
    reason = "body_too_large"

    def __init__(self, limit: int, setting: str = "CGSERVE_MAX_BODY_BYTES") -> None:
        super().__init__(
            f"request body exceeds {limit} bytes",
            expected=f"a body of at most {limit} bytes ({setting}); split large requests",
            status=413,
            code="body_too_large",
        )


def retry_after(seconds: float) -> dict[str, str]:
    """Retry-After in whole seconds (HTTP's unit, at least 1) and Retry-After-Ms, the estimate itself."""
    return {"Retry-After": str(max(1, math.ceil(seconds))), "Retry-After-Ms": str(max(1, round(seconds * 1000)))}


class QueueFullError(ServiceError):
    status = 503
    code = "overloaded"
    reason = "queue_full"

    def __init__(self, queued: int, limit: int, *, retry_after_s: float = 1.0, deadline_first: bool = False) -> None:
        if deadline_first:
            message = (
                f"the {queued} rows queued ahead need about {retry_after_s:.3f} s, longer than this request's "
                "deadline allows; it was refused before it was queued (over HTTP, before its body was read)"
            )
        else:
            message = f"the queue holds {queued} rows and its limit is {limit}; the request was not queued"
        super().__init__(message, expected="a retry after the Retry-After interval", headers=retry_after(retry_after_s))


class DeadlineExceededError(ServiceError):
    status = 504
    code = "deadline_exceeded"
    reason = "deadline_exceeded"

    def __init__(self, timeout_s: float) -> None:
        super().__init__(
            f"the request was not answered within its deadline ({timeout_s:.3g} s left when it was taken in)",
            expected="a retry when the service is less loaded, or a longer X-Request-Timeout-Ms",
        )


class NotReadyError(ServiceError):
    status = 503
    code = "not_ready"
    reason = "not_ready"

    def __init__(self, detail: str) -> None:
        super().__init__(detail, expected="a retry once GET /readyz answers 200", headers={"Retry-After": "1"})


class EngineError(ServiceError):
    """The batch this request rode in failed on the engine; the error is logged with its traceback."""

    def __init__(self, detail: str) -> None:
        super().__init__(f"inference failed: {detail}", expected="a retry; the failure is logged on the server")


class UnknownModelError(ServiceError):
    status = 404
    code = "unknown_model"
    reason = "unknown_model"

    def __init__(
        self, name: str | None, names: list[str], *, version: str | None = None, versions: list[str] | None = None
    ) -> None:
        served = ", ".join(names)
        if version is not None:  # the model is served, not this version of it
            message = f"model {name} has no version {quoted(version, 40)} served"
            expected = f"one of its versions: {', '.join(versions or []) or 'none is loaded'}"
        elif name is None and names:  # app/service.py's decide_default: the server started with several
            message = (
                "POST /predict has no default model: CGSERVE_DEFAULT_MODEL is unset and the server first served "
                f"several models (served now: {served})"
            )
            expected = "POST /v1/models/{name}/predict, or CGSERVE_DEFAULT_MODEL set to one of them"
        elif name is None:
            message = "no model is served"
            expected = "a model loaded first (POST /v2/repository/models/{name}/load)"
        else:
            message = f"no model named {quoted(name)} is served"
            expected = f"one of: {served}" if names else "a model loaded first: none is served now"
        super().__init__(message, expected=expected)


class RouteError(ServiceError):
    """404 and 405 from the router, in the service's error envelope."""

    reason = "invalid_route"

    def __init__(self, status: int, message: str, expected: str) -> None:
        super().__init__(message, expected=expected)
        self.status = status
        self.code = {404: "not_found", 405: "method_not_allowed"}.get(status, "http_error")


def error_body(error: ServiceError, *, v2: bool = False) -> bytes:
    """The service's envelope, or the Open Inference Protocol's {"error": "…"} for its routes."""
    if not v2:
        return orjson.dumps(error.body())
    return orjson.dumps({"error": error.text()})


def error_response(error: ServiceError) -> Response:
    return Response(error_body(error), status_code=error.status, headers=error.headers, media_type="application/json")


class ClientClosedError(ServiceError):
    """The client went away before its answer: nothing to answer, nothing wrong with the service."""

    status = 499  # nginx's "client closed request": in metrics and logs only, never sent
    code = "client_closed"
    reason = "client_closed"


class RequestTimeoutError(ServiceError):
    """The body paused longer than the body-read timeout (slow or half-sent)."""

    status = 408
    code = "request_timeout"
    reason = "request_timeout"

    def __init__(self, timeout_s: float) -> None:
        super().__init__(
            f"the request body paused for more than {timeout_s:g} s",
            expected="the whole body, sent without long pauses (CGSERVE_BODY_TIMEOUT_S)",
            headers={"Connection": "close"},
        )


class UnauthorizedError(ServiceError):
    """No bearer token, or one that is not among the tokens for this kind of route (401)."""

    status = 401
    code = "unauthorized"
    reason = "unauthorized"

    def __init__(self, message: str, *, expected: str, invalid: bool) -> None:
        # RFC 6750: a wrong token is "invalid_token"; a missing one gets the bare challenge.
        challenge = 'Bearer realm="cudagraph-serve"' + (', error="invalid_token"' if invalid else "")
        super().__init__(message, expected=expected, headers={"WWW-Authenticate": challenge})


class BudgetExhaustedError(ServiceError):
    status = 503
    code = "overloaded"
    reason = "bytes_in_flight"

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"request bodies of {limit} bytes are being read and decoded already; this one was refused",
            expected="a retry after the Retry-After interval (CGSERVE_MAX_INFLIGHT_BYTES)",
            headers=retry_after(0.05),
        )


class GpuDecodeError(Exception):
    """nvJPEG could not decode this upload: Pillow decodes it instead (or answers it 422). Never an answer."""
