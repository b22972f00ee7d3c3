"""OpenTelemetry tracing (app/ops/tracing.py), with the SDK's in-memory exporter: a request span whose
parent is the traceparent (HTTP header, gRPC metadata), a batch span linked to each request it
carried, the ids in the access-log line; and with tracing off, no opentelemetry at all."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from fastapi.testclient import TestClient
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from app.access.access_log import LOGGER, access_log
from app.access.grpc_interceptor import AccessInterceptor
from app.access.tokens import TokenSet
from app.batching.batcher import Batcher
from app.config import Settings
from app.dataplane import DataPlane
from app.main import create_app
from app.ops import tracing
from bench.tracing_cost import Stub  # the benchmark's codec, model and queue, answered at once
from tests.unit.fake_engine import FakeEngine, images

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"
ENDPOINT = Settings.model_fields["otlp_endpoint"].default


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Tracing on, into memory; the same mode and endpoint as the apps' settings, so they keep it."""
    exporter = InMemorySpanExporter()
    tracing.configure("console", ENDPOINT, exporter=exporter)
    try:
        yield exporter
    finally:
        tracing.configure("off", "")


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(orjson.loads(record.getMessage()))


@pytest.fixture
def access_lines() -> Iterator[list[dict[str, Any]]]:
    handler = Lines()
    logging.getLogger(LOGGER).addHandler(handler)
    try:
        yield handler.lines
    finally:
        logging.getLogger(LOGGER).removeHandler(handler)


async def one(request: bytes) -> AsyncIterator[bytes]:
    """A call's one request, as grpc.aio hands it to a handler of a stream of requests."""
    yield request


def named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [span for span in exporter.get_finished_spans() if span.name == name]


def test_an_http_request_span_continues_the_traceparent_and_its_batch_links_to_it(
    spans: InMemorySpanExporter, access_lines: list[dict[str, Any]]
) -> None:
    app = create_app(Settings(tracing="console", access_log=True))
    with TestClient(app) as client:
        client.portal.call(client.app.state.service.wait_started)  # type: ignore[attr-defined]
        assert client.app.state.plane.infer == client.app.state.plane.traced_infer  # type: ignore[attr-defined]
        answer = client.post(
            "/predict",
            content=bytes(784),
            headers={"content-type": "application/octet-stream", "traceparent": TRACEPARENT},
        )
        assert answer.status_code == 200, answer.text
        untraced = client.post("/predict", content=bytes(784), headers={"content-type": "application/octet-stream"})
        assert untraced.status_code == 200
    (request, fresh) = named(spans, "POST /predict")
    assert f"{request.context.trace_id:032x}" == TRACE_ID
    assert request.parent is not None and f"{request.parent.span_id:016x}" == PARENT_ID
    assert request.attributes is not None
    assert dict(request.attributes) == {"protocol": "rest", "form": "raw", "model": "fashion-cnn", "status": "200"}
    assert fresh.parent is None and f"{fresh.context.trace_id:032x}" != TRACE_ID  # no header: a trace of its own
    batches = named(spans, "batch")
    assert [[link.context for link in batch.links] for batch in batches] == [[request.context], [fresh.context]]
    assert [event.name for event in batches[0].events] == ["collected", "staged", "replayed", "handed back"]
    assert access_log().flush()
    logged = [line for line in access_lines if line["path"] == "/predict"]
    assert logged[0]["trace_id"] == TRACE_ID and logged[0]["span_id"] == f"{request.context.span_id:016x}"
    assert logged[1]["trace_id"] == f"{fresh.context.trace_id:032x}"


@pytest.mark.anyio
async def test_one_batch_of_several_requests_is_one_span_linked_to_each(spans: InMemorySpanExporter) -> None:
    batcher = Batcher(FakeEngine((1, 2, 4, 8)), max_delay_s=60, queue_limit=64, request_timeout_s=60)
    assert batcher.enqueue == batcher._traced_enqueue
    batcher.start()

    async def request(value: float) -> None:
        span, token = tracing.start_request("POST /predict", "rest", "raw")
        try:
            await batcher.submit(images(value))
        finally:
            tracing.end_request(span, token, "m", "200")

    try:  # all three are queued before the collector runs: one batch
        await asyncio.wait_for(asyncio.gather(*(request(v) for v in (0.1, 0.2, 0.3))), timeout=10)
    finally:
        await batcher.stop()
    requests = named(spans, "POST /predict")
    (batch,) = named(spans, "batch")
    assert len(requests) == 3
    assert sorted(link.context.span_id for link in batch.links) == sorted(span.context.span_id for span in requests)
    assert batch.attributes is not None and batch.attributes["rows"] == 3 and batch.attributes["bucket"] == 4
    assert not batcher._links  # each request's context is let go with its answer


class Context:
    def set_trailing_metadata(self, metadata: Any) -> None:
        pass

    def code(self) -> None:
        return None

    def peer(self) -> str:
        return "ipv4:127.0.0.1:5000"


@pytest.mark.anyio
async def test_grpc_metadata_traceparent_is_the_request_spans_parent(
    spans: InMemorySpanExporter, access_lines: list[dict[str, Any]]
) -> None:
    settings = SimpleNamespace(tracing="console", otlp_endpoint=ENDPOINT)
    plane = DataPlane(SimpleNamespace(settings=settings))  # type: ignore[arg-type]
    interceptor = AccessInterceptor(tokens=TokenSet([]), tracing=True, access_log=access_log(), traced=True)

    async def infer(requests: Any, context: Any) -> Any:
        async def read() -> bytes:
            return b""

        return await plane.infer(
            Stub("grpc"), read, model="m", version=None, form="raw", deadline=1e18, path="ModelInfer"
        )

    async def continuation(details: Any) -> Any:
        return SimpleNamespace(stream_unary=infer, request_deserializer=None, response_serializer=None)

    details = SimpleNamespace(method="/inference.GRPCInferenceService/ModelInfer",
                              invocation_metadata=(("traceparent", TRACEPARENT),))  # fmt: skip
    handler = await interceptor.intercept_service(continuation, details)
    assert await handler.stream_unary(one(b""), Context()) == "answer"
    (span,) = named(spans, "ModelInfer")
    assert f"{span.context.trace_id:032x}" == TRACE_ID
    assert span.parent is not None and f"{span.parent.span_id:016x}" == PARENT_ID
    assert span.attributes is not None and span.attributes["protocol"] == "grpc" and span.attributes["status"] == "200"
    assert access_log().flush()
    assert access_lines[-1]["trace_id"] == TRACE_ID


def test_with_tracing_off_no_more_of_opentelemetry_is_imported_than_fastapi_imports() -> None:
    """FastAPI (0.165) depends on opentelemetry-api and imports it for its own telemetry, which app/main.py
    turns off; tracing off adds nothing to that: no SDK, no exporter, no propagator, no span."""
    script = """
import sys
from fastapi.testclient import TestClient
fastapis = {name for name in sys.modules if name.startswith("opentelemetry")}
from app.config import Settings
from app.main import create_app
with TestClient(create_app(Settings())) as client:
    client.portal.call(client.app.state.service.wait_started)
    answer = client.post("/predict", content=bytes(784), headers={"content-type": "application/octet-stream",
                                                                  "traceparent": "TRACEPARENT"})
    assert answer.status_code == 200, answer.text
    plane, batcher = client.app.state.plane, client.app.state.service.models["fashion-cnn"].batcher
    assert "infer" not in vars(plane) and "enqueue" not in vars(batcher) and "_run_batch" not in vars(batcher)
print(sorted(name for name in sys.modules if name.startswith("opentelemetry") and name not in fastapis))
""".replace("TRACEPARENT", TRACEPARENT)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_spans_still_queued_for_the_collector_are_sent_by_the_shutdown_s_flush() -> None:
    """The batch processor sends every few seconds: a server stopped by SIGTERM lost its last spans (the operator
    review). A collector on loopback counts the OTLP posts."""
    import http.server
    import threading

    posts: list[int] = []

    class Collector(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            posts.append(len(self.rfile.read(int(self.headers["content-length"]))))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        tracing.configure("otlp", f"http://127.0.0.1:{server.server_port}/v1/traces")
        span, token = tracing.start_request("POST /predict", "rest", "raw")
        tracing.end_request(span, token, "fashion-cnn", "200")
        assert posts == []  # queued in the batch processor
        tracing.flush()
        assert len(posts) == 1 and posts[0] > 0
    finally:
        tracing.configure("off", "")
        server.shutdown()


def test_tracing_without_the_sdk_installed_is_a_start_up_error_naming_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The images lacked the extra, and CGSERVE_TRACING=otlp stopped the server in its lifespan with a traceback."""
    import importlib.util

    from pydantic import ValidationError

    find_spec = importlib.util.find_spec

    def without_the_sdk(name: str, *args: Any) -> Any:
        return None if name.startswith("opentelemetry.sdk") else find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", without_the_sdk)
    for mode in ("otlp", "console"):
        with pytest.raises(
            ValidationError,
            match=rf"tracing {mode} needs OpenTelemetry's opentelemetry.sdk, which is "
            r"not installed: install the tracing extra \(pip install 'cudagraph-serve\[tracing\]'\)",
        ):
            Settings(tracing=mode)
    assert Settings(tracing="off").tracing == "off"


def test_the_shutdown_s_flush_gives_up_on_a_collector_that_does_not_answer_within_its_limit() -> None:
    """The SDK's force_flush does not keep to its timeout: against a collector that took the connection and never
    answered, a stop waited 10-40 s for it (a review of the flush)."""
    import socket
    import threading
    import time

    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    threading.Thread(target=lambda: held.append(listener.accept()[0]), daemon=True).start()
    try:
        tracing.configure("otlp", f"http://127.0.0.1:{listener.getsockname()[1]}/v1/traces")
        span, token = tracing.start_request("POST /predict", "rest", "raw")
        tracing.end_request(span, token, "fashion-cnn", "200")
        began = time.monotonic()
        tracing.flush()
        took = time.monotonic() - began
    finally:
        tracing.configure("off", "")
        for connection in held:
            connection.close()
        listener.close()
    assert tracing.FLUSH_TIMEOUT_S <= took < tracing.FLUSH_TIMEOUT_S + 1.5, took
