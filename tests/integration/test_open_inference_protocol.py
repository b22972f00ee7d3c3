"""Triton's own clients, unmodified, against the real server on the CPU: HTTP and gRPC.

Every answer of the Open Inference Protocol must equal POST /predict's for the same images.
"""

from __future__ import annotations

import gzip
import io
import queue
import sys
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import numpy as np
import orjson
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from models.fashion_mnist import load_test_sample
from tests.integration.server_process import free_port, running_server

MODEL = "fashion-cnn"
SERVE = (sys.executable, "-m", "app.cli", "serve")
CLIENTS = {"http": triton_http, "grpc": triton_grpc}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    grpc_port = free_port()
    log = tmp_path_factory.mktemp("oip") / "server.log"
    with running_server(log, command=SERVE, device="cpu", grpc_port=str(grpc_port), max_instances="64") as url:
        yield {"url": url, "http": url.removeprefix("http://"), "grpc": f"127.0.0.1:{grpc_port}"}


@pytest.fixture(scope="module")
def images() -> np.ndarray:
    return load_test_sample()[0][:6].reshape(6, 1, 28, 28)  # (6, 1, 28, 28) uint8, real test images


@pytest.fixture(scope="module")
def predicted(server: dict[str, str], images: np.ndarray) -> np.ndarray:
    """POST /predict's probabilities for the same images: what every v2 answer must equal."""
    answer = httpx.post(
        f"{server['url']}/predict", content=images.tobytes(), headers={"content-type": "application/octet-stream"}
    )
    return np.array([p["scores"] for p in answer.json()["predictions"]], dtype=np.float32)


def client(kind: str, server: dict[str, str]) -> object:
    return CLIENTS[kind].InferenceServerClient(server[kind])


@pytest.mark.parametrize("kind", list(CLIENTS))
def test_server_and_model_metadata(kind: str, server: dict[str, str]) -> None:
    triton = client(kind, server)
    assert triton.is_server_live() and triton.is_server_ready() and triton.is_model_ready(MODEL)  # type: ignore[attr-defined]
    as_json = {"as_json": True} if kind == "grpc" else {}  # the HTTP client always answers JSON
    metadata = triton.get_server_metadata(**as_json)  # type: ignore[attr-defined]
    assert {"binary_tensor_data", "classification"} <= set(metadata["extensions"])
    model = triton.get_model_metadata(MODEL, **as_json)  # type: ignore[attr-defined]
    (tensor,) = model["inputs"]
    assert tensor["name"] == "input" and [int(d) for d in tensor["shape"]] == [-1, 1, 28, 28]
    assert tensor["datatype"] == "UINT8"  # the shipped model.toml's input_datatype: clients send 8-bit pixels
    (output,) = model["outputs"]
    assert output["name"] == "probabilities" and [int(d) for d in output["shape"]] == [-1, 10]
    config = triton.get_model_config(MODEL, **as_json)  # type: ignore[attr-defined]
    config = config.get("config", config)
    assert int(config["max_batch_size"]) == 64  # CGSERVE_MAX_INSTANCES, under the largest bucket (128)
    assert config["input"][0]["data_type"] == "TYPE_UINT8"


@pytest.mark.parametrize("kind", list(CLIENTS))
@pytest.mark.parametrize("datatype", ["UINT8", "FP32"])
@pytest.mark.parametrize("binary", [True, False])
def test_infer_equals_predict(
    kind: str, datatype: str, binary: bool, server: dict[str, str], images: np.ndarray, predicted: np.ndarray
) -> None:
    module = CLIENTS[kind]
    data = images if datatype == "UINT8" else (images / 255).astype(np.float32)
    tensor = module.InferInput("input", list(data.shape), datatype)
    outputs = [module.InferRequestedOutput("probabilities")]
    if kind == "http":
        tensor.set_data_from_numpy(data, binary_data=binary)
        outputs = [module.InferRequestedOutput("probabilities", binary_data=binary)]
    else:
        tensor.set_data_from_numpy(data)  # gRPC sends raw_input_contents
    result = client(kind, server).infer(MODEL, [tensor], outputs=outputs, request_id="req-7")  # type: ignore[attr-defined]
    np.testing.assert_allclose(result.as_numpy("probabilities"), predicted, rtol=1e-5, atol=1e-7)
    response = result.get_response()
    assert (response["id"] if kind == "http" else response.id) == "req-7"


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_bodies_answer_as_plain_ones(
    algorithm: str, server: dict[str, str], images: np.ndarray, predicted: np.ndarray
) -> None:
    """tritonclient's request_compression_algorithm, as Triton's HTTP server takes it (the compressed bytes were
    read as the inference header: a 400 about JSON); and /predict's raw body compressed alike."""
    triton = triton_http.InferenceServerClient(server["http"])
    for binary in (True, False):
        tensor = triton_http.InferInput("input", list(images.shape), "UINT8")
        tensor.set_data_from_numpy(images, binary_data=binary)
        result = triton.infer(MODEL, [tensor], request_compression_algorithm=algorithm)
        np.testing.assert_allclose(result.as_numpy("probabilities"), predicted, rtol=1e-5, atol=1e-7)
    compress = gzip.compress if algorithm == "gzip" else zlib.compress
    raw = {"content-type": "application/octet-stream", "content-encoding": algorithm}
    answer = httpx.post(f"{server['url']}/predict", content=compress(images.tobytes()), headers=raw)
    assert answer.status_code == 200
    scores = np.array([p["scores"] for p in answer.json()["predictions"]], dtype=np.float32)
    np.testing.assert_allclose(scores, predicted, rtol=1e-5, atol=1e-7)
    cut = httpx.post(f"{server['url']}/predict", content=compress(images.tobytes())[:-9], headers=raw)
    assert cut.status_code == 400 and f"not {algorithm} data" in cut.json()["error"]["message"]
    brotli = httpx.post(f"{server['url']}/predict", content=images.tobytes(), headers={**raw, "content-encoding": "br"})
    assert brotli.status_code == 415 and "gzip or deflate" in brotli.json()["error"]["expected"]


def test_tritons_other_extensions_are_refused_by_name(server: dict[str, str], images: np.ndarray) -> None:
    """Statistics, trace, logging and shared memory: 501 / UNIMPLEMENTED naming the extension and what to use
    instead (GET /v2/models/stats was the metadata of a model named "stats"; gRPC said "Method not found!")."""
    http = triton_http.InferenceServerClient(server["http"])
    grpc_client = triton_grpc.InferenceServerClient(server["grpc"])
    calls = [
        ("statistics", lambda c: c.get_inference_statistics()),
        ("statistics", lambda c: c.get_inference_statistics(MODEL)),
        ("trace", lambda c: c.get_trace_settings()),
        ("logging", lambda c: c.get_log_settings()),
        ("system_shared_memory", lambda c: c.get_system_shared_memory_status()),
        ("cuda_shared_memory", lambda c: c.unregister_cuda_shared_memory()),
    ]
    for client_of, refusal in ((http, "501"), (grpc_client, "StatusCode.UNIMPLEMENTED")):
        for extension, call in calls:
            with pytest.raises(InferenceServerException, match=f"{extension} extension is not implemented") as no:
                call(client_of)
            assert no.value.status() == refusal, (extension, no.value.status())
    with grpc.insecure_channel(server["grpc"]) as channel:
        with pytest.raises(grpc.RpcError) as unknown:
            channel.unary_unary("/inference.GRPCInferenceService/Nope")(b"", timeout=10)
        assert unknown.value.code() == grpc.StatusCode.UNIMPLEMENTED and "ModelInfer" in unknown.value.details()
    assert "model_repository" in http.get_server_metadata()["extensions"]
    numbered = orjson.dumps({"id": 5, "inputs": [{"name": "input", "shape": [1, 1, 28, 28], "datatype": "UINT8",
                                                  "data": images[0].ravel().tolist()}]})  # fmt: skip
    answer = httpx.post(f"{server['url']}/v2/models/{MODEL}/infer", content=numbered)
    assert answer.status_code == 400 and "the request id is a number" in answer.json()["error"]


@pytest.mark.parametrize("kind", list(CLIENTS))
def test_classification_gives_top_k_score_index_label(kind: str, server: dict[str, str], images: np.ndarray) -> None:
    module = CLIENTS[kind]
    tensor = module.InferInput("input", list(images.shape), "UINT8")
    tensor.set_data_from_numpy(images)
    outputs = [module.InferRequestedOutput("probabilities", class_count=3)]
    top = client(kind, server).infer(MODEL, [tensor], outputs=outputs).as_numpy("probabilities")  # type: ignore[attr-defined]
    assert top.shape == (6, 3)
    score, index, label = (top[0][0].decode() if isinstance(top[0][0], bytes) else top[0][0]).split(":")
    assert (index, label) == ("9", "Ankle boot") and float(score) > 0.9


@pytest.mark.parametrize("kind", list(CLIENTS))
def test_async_infer(kind: str, server: dict[str, str], images: np.ndarray, predicted: np.ndarray) -> None:
    module = CLIENTS[kind]
    tensor = module.InferInput("input", list(images.shape), "UINT8")
    tensor.set_data_from_numpy(images)
    triton = client(kind, server)
    if kind == "http":
        result = triton.async_infer(MODEL, [tensor]).get_result()  # type: ignore[attr-defined]
    else:
        done = threading.Event()
        results: list[object] = []

        def finished(result: object, error: object) -> None:
            results.append(error if error is not None else result)
            done.set()

        triton.async_infer(MODEL, [tensor], callback=finished)  # type: ignore[attr-defined]
        assert done.wait(30)
        result = results[0]
    np.testing.assert_allclose(result.as_numpy("probabilities"), predicted, rtol=1e-5, atol=1e-7)  # type: ignore[attr-defined]


BAD = [
    # (case, model, name, datatype, array, http status, grpc status, words)
    ("unknown model", "nope", "input", "UINT8", np.zeros((1, 1, 28, 28), np.uint8), 404, "NOT_FOUND", "fashion-cnn"),
    ("wrong shape", MODEL, "input", "UINT8", np.zeros((1, 1, 28, 27), np.uint8), 400, "INVALID_ARGUMENT", "shape"),
    ("wrong dtype", MODEL, "input", "INT32", np.zeros((1, 1, 28, 28), np.int32), 400, "INVALID_ARGUMENT", "INT32"),
    ("wrong name", MODEL, "pixels", "UINT8", np.zeros((1, 1, 28, 28), np.uint8), 400, "INVALID_ARGUMENT", "pixels"),
    ("out of range", MODEL, "input", "FP32", np.full((1, 1, 28, 28), 2.0, np.float32), 400, "INVALID_ARGUMENT",
     "[0, 1]"),
    ("too many images", MODEL, "input", "UINT8", np.zeros((65, 1, 28, 28), np.uint8), 413, "INVALID_ARGUMENT",
     "at most 64"),
]  # fmt: skip


@pytest.mark.parametrize("kind", list(CLIENTS))
@pytest.mark.parametrize(
    ("case", "model", "name", "datatype", "array", "status", "code", "words"), BAD, ids=[b[0] for b in BAD]
)
def test_bad_requests_get_the_protocols_error_and_the_server_keeps_serving(
    kind: str, case: str, model: str, name: str, datatype: str, array: np.ndarray, status: int, code: str,
    words: str, server: dict[str, str], images: np.ndarray,
) -> None:  # fmt: skip
    module = CLIENTS[kind]
    tensor = module.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    with pytest.raises(InferenceServerException) as raised:
        client(kind, server).infer(model, [tensor])  # type: ignore[attr-defined]
    got = raised.value.status()
    assert got == (str(status) if kind == "http" else f"StatusCode.{code}"), raised.value
    assert words in raised.value.message()
    good = module.InferInput("input", list(images.shape), "UINT8")
    good.set_data_from_numpy(images)
    assert client(kind, server).infer(MODEL, [good]).as_numpy("probabilities").shape == (6, 10)  # type: ignore[attr-defined]


@pytest.mark.parametrize("kind", list(CLIENTS))
def test_tritonclients_own_request_parameters_are_taken(kind: str, server: dict[str, str], images: np.ndarray) -> None:
    """Sent as tritonclient sends them (priority, timeout, a custom parameter): type-checked, taken, not acted on."""
    module = CLIENTS[kind]
    tensor = module.InferInput("input", list(images.shape), "UINT8")
    tensor.set_data_from_numpy(images)
    result = client(kind, server).infer(MODEL, [tensor], priority=1, timeout=10_000_000,  # type: ignore[attr-defined]
                                        parameters={"tenant": "a", "weight": 0.5})  # fmt: skip
    assert result.as_numpy("probabilities").shape == (6, 10)


MALFORMED_PARAMETERS = [
    # (REST "parameters", gRPC (key, InferParameter field, value), words): each answered 200 / OK before
    ({"priority": "high"}, ("priority", "string_param", "high"), "an unsigned integer"),
    ({"timeout": -5}, ("timeout", "int64_param", -5), "an unsigned integer"),
    ({"sequence_start": "yes"}, ("sequence_start", "int64_param", 1), "true or false"),
    ({"triton_anything": 1}, ("triton_anything", "int64_param", 1), "reserved"),
    ({"tenant": {"a": 1}}, ("tenant", None, None), "a string, a number or true or false"),
]


@pytest.mark.parametrize(
    ("rest", "grpc_parameter", "words"), MALFORMED_PARAMETERS, ids=[str(m[0]) for m in MALFORMED_PARAMETERS]
)
def test_request_parameters_triton_refuses_are_refused(
    rest: dict[str, object], grpc_parameter: tuple[str, str | None, object], words: str, server: dict[str, str]
) -> None:
    pixels = [0] * 784
    body = {
        "parameters": rest,
        "inputs": [{"name": "input", "datatype": "UINT8", "shape": [1, 1, 28, 28], "data": pixels}],
    }
    answer = httpx.post(f"{server['url']}/v2/models/{MODEL}/infer", json=body)
    assert answer.status_code == 400 and words in answer.json()["error"], answer.text
    request = service_pb2.ModelInferRequest(model_name=MODEL)
    request.inputs.add(name="input", datatype="UINT8", shape=[1, 1, 28, 28])
    request.raw_input_contents.append(bytes(784))
    key, field, value = grpc_parameter
    parameter = request.parameters[key]  # with no field set: a parameter without a value
    if field is not None:
        setattr(parameter, field, value)
    with grpc.insecure_channel(server["grpc"]) as channel, pytest.raises(grpc.RpcError) as raised:
        service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT and words in str(raised.value.details())


def test_rest_errors_and_unknown_routes_use_the_protocols_error_form(server: dict[str, str]) -> None:
    url = server["url"]
    for answer, status in (
        (httpx.post(f"{url}/v2/models/{MODEL}/infer", content=b"{"), 400),
        (httpx.post(f"{url}/v2/models/{MODEL}/infer", json={"inputs": []}), 400),
        (httpx.get(f"{url}/v2/models/{MODEL}/versions/7"), 404),
        (httpx.get(f"{url}/v2/nothing/here"), 404),
    ):
        assert answer.status_code == status and isinstance(answer.json()["error"], str), answer.text
    assert httpx.get(f"{url}/v2/health/ready").status_code == 200


def test_grpc_health_service_and_metrics_label_the_protocol(server: dict[str, str], images: np.ndarray) -> None:
    with grpc.insecure_channel(server["grpc"]) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        answer = health.Check(health_pb2.HealthCheckRequest(service=""))
        watched = health.Watch(health_pb2.HealthCheckRequest(service="inference.GRPCInferenceService"), timeout=30)
        # The status it holds, then one at each change: it follows readiness within HEALTH_POLL_S (Check reads it).
        statuses = [next(watched).status]
        while statuses[-1] != health_pb2.HealthCheckResponse.SERVING:
            statuses.append(next(watched).status)
        watched.cancel()
        ask = reflection_pb2.ServerReflectionRequest(list_services="")
        (listed,) = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(iter([ask]), timeout=30)
    assert answer.status == health_pb2.HealthCheckResponse.SERVING and len(statuses) <= 2, statuses
    assert {s.name for s in listed.list_services_response.service} == {
        "inference.GRPCInferenceService", "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"
    }  # fmt: skip
    # One request over each protocol, made here: under random test order no other test need have run.
    raw = {"content-type": "application/octet-stream"}
    httpx.post(f"{server['url']}/predict", content=images[:1].tobytes(), headers=raw)
    for kind in CLIENTS:
        tensor = CLIENTS[kind].InferInput("input", list(images[:1].shape), "UINT8")
        tensor.set_data_from_numpy(images[:1])
        client(kind, server).infer(MODEL, [tensor])  # type: ignore[attr-defined]
    exposition = httpx.get(f"{server['url']}/metrics").text
    for protocol in ("rest", "v2", "grpc"):
        assert f'protocol="{protocol}"' in exposition


def test_grpc_port_in_use_stops_start_up(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        with (
            pytest.raises(RuntimeError, match=f"cannot listen on 127.0.0.1:{port}"),
            running_server(tmp_path / "log", command=SERVE, device="cpu", grpc_port=port),
        ):
            pass


def png(image: np.ndarray) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.mark.parametrize("kind", list(CLIENTS))
def test_bytes_inputs_carrying_pngs_answer_as_uploads_do(kind: str, server: dict[str, str], images: np.ndarray) -> None:
    """A BYTES input of encoded images goes into the uploads' decoder: the same scores as /predict's upload."""
    encoded = [png(image[0]) for image in images[:3]]
    uploads = [
        httpx.post(f"{server['url']}/predict", files={"file": ("x.png", data, "image/png")}).json()["predictions"][0]
        for data in encoded
    ]
    triton = client(kind, server)
    tensor = CLIENTS[kind].InferInput("input", [len(encoded)], "BYTES")
    tensor.set_data_from_numpy(np.array(encoded, dtype=np.object_))
    result = triton.infer(MODEL, [tensor])  # type: ignore[attr-defined]
    got = result.as_numpy("probabilities")
    np.testing.assert_allclose(got, np.array([u["scores"] for u in uploads], dtype=np.float32), rtol=1e-5, atol=1e-7)


def test_bytes_in_json_are_base64(server: dict[str, str], images: np.ndarray) -> None:
    import base64

    data = png(images[0][0])
    body = {"inputs": [{"name": "input", "datatype": "BYTES", "shape": [1], "data": [base64.b64encode(data).decode()]}]}
    answer = httpx.post(f"{server['url']}/v2/models/{MODEL}/infer", json=body)
    assert answer.status_code == 200, answer.text
    upload = httpx.post(f"{server['url']}/predict", files={"file": ("x.png", data, "image/png")}).json()
    np.testing.assert_allclose(answer.json()["outputs"][0]["data"], upload["predictions"][0]["scores"], rtol=1e-5)
    body["inputs"][0]["data"] = ["not base64!"]
    refused = httpx.post(f"{server['url']}/v2/models/{MODEL}/infer", json=body)
    assert refused.status_code == 400 and "base64" in refused.json()["error"]


def test_a_stream_answers_every_request_it_carries_as_single_calls_do(
    server: dict[str, str], images: np.ndarray, predicted: np.ndarray
) -> None:
    """Triton's streaming extension (ModelStreamInfer), as tritonclient's start_stream uses it: every request
    sent at once, each answered on the stream with its id; a refused one with its error, the stream going on."""
    triton = triton_grpc.InferenceServerClient(server["grpc"])
    answers: queue.Queue[tuple[object, object]] = queue.Queue()
    triton.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for index, image in enumerate(images):  # one image a request, all in flight together
            tensor = triton_grpc.InferInput("input", [1, 1, 28, 28], "UINT8")
            tensor.set_data_from_numpy(image[None])
            triton.async_stream_infer(MODEL, [tensor], request_id=str(index))
        wrong = triton_grpc.InferInput("input", [1, 1, 28, 27], "UINT8")
        wrong.set_data_from_numpy(np.zeros((1, 1, 28, 27), np.uint8))
        triton.async_stream_infer(MODEL, [wrong], request_id="wrong")
        both = triton_grpc.InferInput("input", list(images[:2].shape), "UINT8")
        both.set_data_from_numpy(images[:2])  # its answer marked as its last, as asked (Triton's flag)
        triton.async_stream_infer(MODEL, [both], request_id="two", enable_empty_final_response=True)
        got = [answers.get(timeout=30) for _ in range(len(images) + 2)]
    finally:
        triton.stop_stream()
    errors = [str(error) for _, error in got if error is not None]
    assert len(errors) == 1 and "shape is [1, 1, 28, 27]" in errors[0], errors
    results = {result.get_response().id: result for result, error in got if error is None}  # type: ignore[attr-defined]
    assert sorted(results) == sorted([*map(str, range(len(images))), "two"])
    for index in range(len(images)):
        answer = results[str(index)].as_numpy("probabilities")  # type: ignore[attr-defined]
        np.testing.assert_allclose(answer, predicted[index : index + 1], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(results["two"].as_numpy("probabilities"), predicted[:2], rtol=1e-5, atol=1e-7)  # type: ignore[attr-defined]
    flags = {id_: result.get_response().parameters.get("triton_final_response") for id_, result in results.items()}  # type: ignore[attr-defined]
    assert flags["two"].bool_param and flags["0"] is None


def test_input_data_in_two_places_or_bytes_no_input_claims_are_refused(server: dict[str, str]) -> None:
    """Triton refuses each; here the binary section won over "data", stray bytes were dropped, and a gRPC input's
    other contents were ignored, each answered 200 / OK."""
    url, pixels = f"{server['url']}/v2/models/{MODEL}/infer", bytes(784)
    both = {"name": "input", "datatype": "UINT8", "shape": [1, 1, 28, 28], "data": [0] * 784,
            "parameters": {"binary_data_size": 784}}  # fmt: skip
    header = orjson.dumps({"inputs": [both]})
    answer = httpx.post(url, content=header + pixels, headers={"Inference-Header-Content-Length": str(len(header))})
    assert answer.status_code == 400 and 'both "data" and parameters.binary_data_size' in answer.json()["error"]
    json_only = orjson.dumps({"inputs": [{k: v for k, v in both.items() if k != "parameters"}]})
    answer = httpx.post(
        url, content=json_only + pixels, headers={"Inference-Header-Content-Length": str(len(json_only))}
    )
    assert answer.status_code == 400 and "784 bytes follow the inference header" in answer.json()["error"]
    empty = orjson.dumps({"inputs": [{"name": "input", "datatype": "UINT8", "shape": [0, 1, 28, 28], "data": []}]})
    answer = httpx.post(url, content=empty)  # was "UINT8 data must be integers 0–255"
    assert answer.status_code == 400 and "UINT8 data" not in answer.json()["error"], answer.text
    request = service_pb2.ModelInferRequest(model_name=MODEL)
    tensor = request.inputs.add(name="input", datatype="FP32", shape=[1, 1, 28, 28])
    tensor.contents.fp32_contents.extend([0.0] * 784)
    tensor.contents.uint_contents.extend([7])
    with grpc.insecure_channel(server["grpc"]) as channel, pytest.raises(grpc.RpcError) as raised:
        service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "carries uint_contents beside fp32_contents" in str(raised.value.details())


def test_tritons_raw_binary_request_is_the_models_one_input(server: dict[str, str], images: np.ndarray) -> None:
    """Inference-Header-Content-Length: 0: the whole body is the input, in the declared datatype (Triton's raw binary
    request; it was 400, "the inference header is not valid JSON")."""
    url = f"{server['url']}/v2/models/{MODEL}/infer"
    raw = httpx.post(url, content=images.tobytes(), headers={"Inference-Header-Content-Length": "0"})
    assert raw.status_code == 200, raw.text
    (output,) = raw.json()["outputs"]
    assert output["shape"] == [len(images), 10]
    tensor = triton_http.InferInput("input", list(images.shape), "UINT8")
    tensor.set_data_from_numpy(images)
    expected = client("http", server).infer(MODEL, [tensor]).as_numpy("probabilities")  # type: ignore[attr-defined]
    np.testing.assert_allclose(np.asarray(output["data"]).reshape(expected.shape), expected, rtol=1e-6)
    cut = httpx.post(url, content=images.tobytes()[:-1], headers={"Inference-Header-Content-Length": "0"})
    assert cut.status_code == 400 and "not whole UINT8 images" in cut.json()["error"], cut.text
