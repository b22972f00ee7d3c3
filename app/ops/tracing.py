"""OpenTelemetry traces, off by default: a span per request and one per batch, linked.

    ingress (HTTP: RequestContextMiddleware, ─ CARRIER ─▶ DataPlane.infer: span "POST /predict" / "ModelInfer"
    gRPC: AccessInterceptor): traceparent                 (model, protocol, form, status), current in its task
                                                          ─▶ Batcher.enqueue: its span context, kept for the batch
                                                          ─▶ span "batch": linked to each request it carried;
                                                             events collected, staged, replayed, handed back

Off costs nothing: `configure` leaves the tracer None, the data plane and the batcher keep their
plain methods (they choose the traced ones once, at start-up, from `active()`), and opentelemetry is
never imported: every import of it is inside a function that runs only with tracing on.

A batch carries several requests, each with its own trace: it cannot be their child, so it is a
root span of its own whose links name them (OpenTelemetry's answer for fan-in). The ingress layer
hands the incoming traceparent down, and the request span's ids back up for the access log, in a
Carrier: a mutable object in a context variable, because the route may run on a task of its own
(app/http/fast_path.py) whose context changes never reach the layer above.
"""

from __future__ import annotations

import threading
import time
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Span, SpanContext, Tracer

NAME = "cudagraph-serve"


class Carrier:
    """One request's trace between its ingress layer and the data plane: the traceparent it came with
    (None: a new trace), and the ids of its span once made (lowercase hex, as W3C writes them)."""

    __slots__ = ("span_id", "trace_id", "traceparent")

    def __init__(self, traceparent: str | None) -> None:
        self.traceparent = traceparent
        self.trace_id: str | None = None
        self.span_id: str | None = None


CARRIER: ContextVar[Carrier | None] = ContextVar("trace_carrier", default=None)

_tracer: Tracer | None = None
_provider: TracerProvider | None = None  # flushed at shutdown: its batch processor holds the last spans
_configured: tuple[str, str] = ("off", "")
FLUSH_TIMEOUT_S = 2.0  # at shutdown, for spans still queued: a collector that does not answer holds it no longer


def active() -> bool:
    """Whether spans are made; read at start-up, not per request."""
    return _tracer is not None


def configure(mode: str, endpoint: str, *, exporter: SpanExporter | None = None) -> None:
    """Start-up: mode off | otlp | console (`exporter`, for tests, replaces the mode's own). The same
    mode and endpoint again (each app made in a process) keeps the tracer it has."""
    global _tracer, _provider, _configured
    if (mode, endpoint) == _configured and exporter is None:
        return
    _configured = (mode, endpoint)
    if mode == "off":
        _tracer = _provider = None
        return
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SimpleSpanProcessor

    # Not shut down at the interpreter's exit by the SDK: that sends what is queued with no time limit (`flush` does
    # it at the server's stop, within FLUSH_TIMEOUT_S).
    provider = TracerProvider(resource=Resource.create({"service.name": NAME}), shutdown_on_exit=False)
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    elif mode == "console":
        provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
    elif mode == "otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        # Exported in batches by the processor's own thread: the event loop only queues the span.
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    else:
        raise ValueError(f"tracing must be off, otlp or console; got {mode!r}")
    _tracer, _provider = provider.get_tracer(NAME), provider


def flush() -> None:
    """At shutdown, the spans still queued sent, waited for FLUSH_TIMEOUT_S at most: the batch processor's thread
    sends every few seconds, and a server stopped by SIGTERM lost its last ones (the operator review). On a daemon
    thread of its own, left behind past the limit: the SDK's force_flush does not keep to its timeout (it sends every
    queued batch, each within the exporter's 10 s and its retries: 40.1 s against a collector that did not answer,
    bench/results/2026-12-06-cpu-review-probes/)."""
    if _provider is not None:
        sending = threading.Thread(target=_provider.force_flush, name="trace-flush", daemon=True)
        sending.start()
        sending.join(FLUSH_TIMEOUT_S)


def start_request(name: str, protocol: str, form: str) -> tuple[Span, object]:
    """The request's span, current in this task's context until `end_request`; its parent the carrier's
    traceparent (none, or an invalid one: a new trace)."""
    from opentelemetry import context, trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    assert _tracer is not None
    carrier = CARRIER.get()
    parent = None
    if carrier is not None and carrier.traceparent:
        parent = TraceContextTextMapPropagator().extract({"traceparent": carrier.traceparent})
    kind = trace.SpanKind.SERVER
    span = _tracer.start_span(name, context=parent, kind=kind, attributes={"protocol": protocol, "form": form})
    if carrier is not None:
        ids = span.get_span_context()
        carrier.trace_id, carrier.span_id = f"{ids.trace_id:032x}", f"{ids.span_id:016x}"
    return span, context.attach(trace.set_span_in_context(span))


def end_request(span: Span, token: object, model: str, status: str) -> None:
    from opentelemetry import context

    span.set_attribute("model", model)
    span.set_attribute("status", status)
    if not status.startswith("2") and status not in ("OK",):
        from opentelemetry.trace import Status, StatusCode

        span.set_status(Status(StatusCode.ERROR, status))
    span.end()
    context.detach(token)  # type: ignore[arg-type]


def current() -> SpanContext | None:
    """The span context of the request whose task this is (to link its batch to), or None."""
    from opentelemetry import trace

    ids = trace.get_current_span().get_span_context()
    return ids if ids.is_valid else None


def start_batch(
    links: list[SpanContext], *, model: str, rows: int, bucket: int, device: str, queued_since: float
) -> Span:
    """A batch's span: a root of its own, linked to each request span it carries, started when its oldest
    request was queued (`queued_since`, a time.monotonic()) so that the queue wait is its first part."""
    from opentelemetry.context import Context
    from opentelemetry.trace import Link

    assert _tracer is not None
    waited_ns = int((time.monotonic() - queued_since) * 1e9)
    attributes: dict[str, Any] = {"model": model, "rows": rows, "bucket": bucket, "device": device}
    span = _tracer.start_span(
        "batch",
        context=Context(),
        links=[Link(ids) for ids in links],
        start_time=time.time_ns() - waited_ns,
        attributes=attributes,
    )
    span.add_event("collected", {"queue_wait_ms": waited_ns / 1e6})
    return span
