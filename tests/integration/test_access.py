"""Access control and request tracing in the real server process: tokens over HTTP and gRPC
(Triton's own client, with and without `headers=`), request ids in answers and in the server's
log, the access log's JSON lines, CORS."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import numpy as np
import orjson
import pytest
import tritonclient.grpc as triton_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from models.fashion_mnist import load_test_sample
from tests.integration.server_process import free_port, running_server

MODEL = "fashion-cnn"
SERVE = (sys.executable, "-m", "app.cli", "serve")
INFERENCE = "inference-token-0123456789abcdef"
ADMIN = "admin-token-from-a-file-0123456789"
WRONG = "not-a-token-of-this-server-01234"
ORIGIN = "https://ui.example"
RAW = {"content-type": "application/octet-stream"}
LOG_WAIT_S = 10.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    folder = tmp_path_factory.mktemp("access")
    admin_file = folder / "admin-tokens"
    admin_file.write_text(f"# for Prometheus\n{ADMIN}\n")
    grpc_port, log = free_port(), folder / "server.log"
    settings = {
        "device": "cpu",
        "grpc_port": str(grpc_port),
        "auth_tokens": INFERENCE,
        "admin_tokens_file": str(admin_file),
        "cors_origins": ORIGIN,
        "access_log": "true",
        "log_level": "debug",
    }
    with running_server(log, command=SERVE, **settings) as url:
        yield {"url": url, "grpc": f"127.0.0.1:{grpc_port}", "log": log}


@pytest.fixture(scope="module")
def images() -> np.ndarray:
    return load_test_sample()[0][:3].reshape(3, 1, 28, 28)  # (3, 1, 28, 28) uint8, real test images


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def log_lines(server: dict[str, Any], wanted: str) -> list[str]:
    """The server log's lines once one holds `wanted` (the access log is written by a thread)."""
    deadline = time.monotonic() + LOG_WAIT_S
    while True:
        lines = server["log"].read_text(errors="replace").splitlines()
        if any(wanted in line for line in lines) or time.monotonic() > deadline:
            return lines
        time.sleep(0.05)  # a file offers nothing to await


def access_record(server: dict[str, Any], request_id: str) -> dict[str, Any]:
    lines = log_lines(server, f'"request_id":"{request_id}"')
    records = [orjson.loads(line) for line in lines if line.startswith("{")]  # every JSON line parses
    (record,) = (r for r in records if r["request_id"] == request_id)
    return record


def test_http_each_kind_of_route_with_no_token_a_wrong_one_the_other_kind_and_its_own(
    server: dict[str, Any], images: np.ndarray
) -> None:
    tensor = {"name": "input", "datatype": "UINT8", "shape": [3, 1, 28, 28], "data": images.reshape(-1).tolist()}
    routes = [
        ("POST", "/predict", images.tobytes(), INFERENCE),
        ("POST", f"/v2/models/{MODEL}/infer", orjson.dumps({"inputs": [tensor]}), INFERENCE),
        ("GET", f"/v2/models/{MODEL}", b"", INFERENCE),
        ("GET", "/metrics", b"", ADMIN),
        ("GET", f"/v1/models/{MODEL}", b"", ADMIN),
    ]
    # One connection throughout: a 401 that leaves the body unread must not spoil the next request.
    with httpx.Client(base_url=server["url"], trust_env=False, timeout=30) as client:
        for method, path, body, token in routes:
            other = ADMIN if token == INFERENCE else INFERENCE
            for sent in ({}, bearer(WRONG), bearer(other)):
                answer = client.request(method, path, content=body, headers=RAW | sent)
                assert answer.status_code == 401, (path, sent)
                assert answer.headers["www-authenticate"].startswith("Bearer")
                error = answer.json()["error"]
                assert isinstance(error, str) if path.startswith("/v2") else error["code"] == "unauthorized"
            answer = client.request(method, path, content=body, headers=RAW | bearer(token))
            assert answer.status_code == 200, answer.text
        for path in ("/healthz", "/readyz", "/v2/health/live", "/v2/health/ready"):
            assert client.get(path).status_code == 200


def test_request_ids_are_echoed_or_made_and_written_in_the_servers_log(server: dict[str, Any]) -> None:
    url = server["url"]
    refused = httpx.post(f"{url}/predict", content=bytes(784), headers=RAW | {"x-request-id": "it-refused-1"})
    assert refused.status_code == 401 and refused.headers["x-request-id"] == "it-refused-1"
    made = httpx.get(f"{url}/healthz", headers={"x-request-id": "no spaces allowed"}).headers["x-request-id"]
    assert len(made) == 32 and made != httpx.get(f"{url}/healthz").headers["x-request-id"]
    # The diagnostic log (app/cli.py's format, debug level): the refusal, tagged with its request.
    lines = log_lines(server, "[it-refused-1]")
    (line,) = (line for line in lines if "[it-refused-1]" in line)
    assert line.endswith("DEBUG app.access.auth: [it-refused-1] refused POST /predict: no inference token")


def test_access_log_lines_are_json_with_the_fields(server: dict[str, Any], images: np.ndarray) -> None:
    headers = RAW | bearer(INFERENCE) | {"x-request-id": "it-access-1"}
    answer = httpx.post(f"{server['url']}/predict", content=images.tobytes(), headers=headers)
    assert answer.status_code == 200
    record = access_record(server, "it-access-1")
    assert record | {"time": "", "duration_ms": 0} == {
        "time": "", "request_id": "it-access-1", "protocol": "http", "method": "POST", "path": "/predict",
        "status": 200, "duration_ms": 0, "bytes_in": images.size, "bytes_out": len(answer.content),
        "client": "127.0.0.1", "model": MODEL,
    }  # fmt: skip
    assert record["time"].endswith("Z") and record["duration_ms"] > 0


def test_cors_preflight_is_answered_for_the_configured_origin(server: dict[str, Any]) -> None:
    preflight = {
        "origin": ORIGIN,
        "access-control-request-method": "POST",
        "access-control-request-headers": "authorization",
    }
    answer = httpx.options(f"{server['url']}/predict", headers=preflight)
    assert answer.status_code == 200 and answer.headers["access-control-allow-origin"] == ORIGIN
    other = httpx.options(f"{server['url']}/predict", headers=preflight | {"origin": "https://elsewhere.example"})
    assert "access-control-allow-origin" not in other.headers


def test_grpc_with_tritons_client_needs_the_inference_token_in_its_headers(
    server: dict[str, Any], images: np.ndarray
) -> None:
    triton = triton_grpc.InferenceServerClient(server["grpc"])
    tensor = triton_grpc.InferInput("input", list(images.shape), "UINT8")
    tensor.set_data_from_numpy(images)
    for headers in (None, bearer(WRONG), bearer(ADMIN), {"authorization": INFERENCE}):
        with pytest.raises(InferenceServerException) as raised:
            triton.infer(MODEL, [tensor], headers=headers)
        assert raised.value.status() == "StatusCode.UNAUTHENTICATED" and "bearer token" in raised.value.message()
        with pytest.raises(InferenceServerException):
            triton.get_model_metadata(MODEL, headers=headers)
    result = triton.infer(MODEL, [tensor], headers=bearer(INFERENCE))
    predicted = httpx.post(f"{server['url']}/predict", content=images.tobytes(), headers=RAW | bearer(INFERENCE))
    want = np.array([p["scores"] for p in predicted.json()["predictions"]], dtype=np.float32)
    np.testing.assert_allclose(result.as_numpy("probabilities"), want, rtol=1e-5, atol=1e-7)
    assert triton.get_model_metadata(MODEL, headers=bearer(INFERENCE)).name == MODEL
    # The probes stay open: liveness, readiness, the health service; and reflection.
    assert triton.is_server_live() and triton.is_server_ready()
    with grpc.insecure_channel(server["grpc"]) as channel:
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""))
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        ask = reflection_pb2.ServerReflectionRequest(list_services="")
        (listed,) = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(iter([ask]))
        assert "inference.GRPCInferenceService" in {s.name for s in listed.list_services_response.service}


def test_grpc_request_ids_come_back_in_the_trailing_metadata_and_the_access_log(server: dict[str, Any]) -> None:
    with grpc.insecure_channel(server["grpc"]) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        request = service_pb2.ModelMetadataRequest(name=MODEL)
        metadata = (("authorization", f"Bearer {INFERENCE}"), ("x-request-id", "it-grpc-1"))
        answer, call = stub.ModelMetadata.with_call(request, metadata=metadata)
        assert answer.name == MODEL and ("x-request-id", "it-grpc-1") in call.trailing_metadata()
        with pytest.raises(grpc.RpcError) as raised:
            stub.ModelMetadata(request, metadata=(("x-request-id", "it-grpc-refused"),))
        assert raised.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert ("x-request-id", "it-grpc-refused") in raised.value.trailing_metadata()
    record = access_record(server, "it-grpc-1")
    assert record | {"time": "", "duration_ms": 0, "bytes_in": 0, "bytes_out": 0} == {
        "time": "", "request_id": "it-grpc-1", "protocol": "grpc", "method": "POST",
        "path": "/inference.GRPCInferenceService/ModelMetadata", "status": "OK", "duration_ms": 0,
        "bytes_in": 0, "bytes_out": 0, "client": "127.0.0.1", "model": MODEL,
    }  # fmt: skip
    assert record["bytes_in"] == request.ByteSize() and record["bytes_out"] == answer.ByteSize() > 0
    assert access_record(server, "it-grpc-refused")["status"] == "UNAUTHENTICATED"
    refusal = (
        "DEBUG app.access.grpc_interceptor: [it-grpc-refused] refused /inference.GRPCInferenceService/ModelMetadata"
    )
    assert any(line.endswith(f"{refusal}: no inference token") for line in log_lines(server, refusal))


def test_a_grpc_stream_takes_the_inference_token_and_is_logged_as_one_call(
    server: dict[str, Any], images: np.ndarray
) -> None:
    """ModelStreamInfer: refused whole without the token (no request on it answered), served with it, its id
    in the trailing metadata and one access-log line for the stream."""
    tensor = service_pb2.ModelInferRequest.InferInputTensor(name="input", datatype="UINT8", shape=[1, 1, 28, 28])
    requests = [
        service_pb2.ModelInferRequest(
            model_name=MODEL, id=str(n), inputs=[tensor], raw_input_contents=[image.tobytes()]
        )
        for n, image in enumerate(images)
    ]
    with grpc.insecure_channel(server["grpc"]) as channel:
        stream = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer
        refused = stream(iter(requests), metadata=(("x-request-id", "it-stream-refused"),))
        with pytest.raises(grpc.RpcError) as raised:
            list(refused)
        assert raised.value.code() == grpc.StatusCode.UNAUTHENTICATED and "bearer token" in raised.value.details()
        metadata = (("authorization", f"Bearer {INFERENCE}"), ("x-request-id", "it-stream-1"))
        served = stream(iter(requests), metadata=metadata)
        answers = list(served)
        assert ("x-request-id", "it-stream-1") in served.trailing_metadata()
    assert sorted(answer.infer_response.id for answer in answers) == ["0", "1", "2"]
    assert all(not answer.error_message for answer in answers)
    record = access_record(server, "it-stream-1")
    assert record["path"] == "/inference.GRPCInferenceService/ModelStreamInfer" and record["status"] == "OK"
    assert record["model"] == MODEL and record["bytes_in"] == sum(r.ByteSize() for r in requests)
    assert record["bytes_out"] == sum(answer.ByteSize() for answer in answers)
    assert access_record(server, "it-stream-refused")["status"] == "UNAUTHENTICATED"
