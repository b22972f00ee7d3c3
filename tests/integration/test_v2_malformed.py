"""Malformed Open Inference Protocol requests (issue 24.5): each is a 400 (REST) or INVALID_ARGUMENT
(gRPC) that says what was wrong, refused before its batch runs, alike through the inline path
(app/http/inline.py) and the ASGI route; never a 500, never an answer larger than asked for.
"""

from __future__ import annotations

import base64
import io
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import numpy as np
import orjson
import pytest
from PIL import Image
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.grpc import service_pb2, service_pb2_grpc

from loadtest.server_process import free_port
from tests.integration.server_process import running_server
from tests.reliability.common import SERVE

MODEL = "fashion-cnn"
MESSAGE_WITHIN_S = 4  # the gRPC server's CGSERVE_REQUEST_TIMEOUT_S
V2 = f"/v2/models/{MODEL}/infer"
IMAGE = [0] * 784
CLASSIFY = {"name": "probabilities", "parameters": {"classification": 3}}


def png_base64() -> str:
    """One 28×28 grey PNG, base64: a BYTES element the seed CNN takes."""
    encoded = io.BytesIO()
    Image.fromarray(np.zeros((28, 28), np.uint8)).save(encoded, "PNG")
    return base64.b64encode(encoded.getvalue()).decode()


PNG = png_base64()


def v2(tensor: dict[str, object] | None = None, **document: object) -> bytes:
    """A JSON request for one image, with `tensor`'s fields and the document's replaced."""
    base = {"name": "input", "datatype": "UINT8", "shape": [1, 1, 28, 28], "data": IMAGE}
    return orjson.dumps({"inputs": [base | (tensor or {})], **document})


BINARY_HEADER = orjson.dumps(
    {
        "inputs": [
            {"name": "input", "datatype": "UINT8", "shape": [1, 1, 28, 28], "parameters": {"binary_data_size": 784}}
        ]
    }
)
# (case, body, extra headers, words the error must hold). Inline and ASGI decode with the same function.
MALFORMED = [
    ("request parameters a list", v2(parameters=[1]), {}, "parameters"),
    ("request parameters a string", v2(parameters="binary"), {}, "parameters"),
    ("tensor parameters a list", v2({"parameters": ["binary_data_size"]}), {}, "parameters"),
    ("tensor parameters a string", v2({"parameters": "x"}), {}, "parameters"),
    ("true among the numbers", v2({"data": [0] * 783 + [True]}), {}, "true or false"),
    ("false among FP32 numbers", v2({"datatype": "FP32", "data": [0.5] * 783 + [False]}), {}, "true or false"),
    ("shape entry true", v2({"shape": [True, 1, 28, 28]}), {}, "shape"),
    ("classification a string", v2(outputs=[{"name": "probabilities", "parameters": {"classification": "3"}}]), {},
     "classification"),
    ("classification a list", v2(outputs=[{"name": "probabilities", "parameters": {"classification": [3]}}]), {},
     "classification"),
    ("classification negative", v2(outputs=[{"name": "probabilities", "parameters": {"classification": -2}}]), {},
     "classification"),
    ("classification true", v2(outputs=[{"name": "probabilities", "parameters": {"classification": True}}]), {},
     "classification"),
    ("output parameters a list", v2(outputs=[{"name": "probabilities", "parameters": [3]}]), {}, "parameters"),
    ("output a string", v2(outputs=["probabilities"]), {}, "output"),
    ("outputs an object", v2(outputs={"name": "probabilities"}), {}, "outputs"),
    ("unknown output", v2(outputs=[{"name": "logits"}]), {}, "logits"),
    ("repeated outputs", v2(outputs=[CLASSIFY] * 1000), {}, "1000 times"),
    ("binary_data_output a string", v2(parameters={"binary_data_output": "yes"}), {}, "binary_data_output"),
    ("binary_data a number", v2(outputs=[{"name": "probabilities", "parameters": {"binary_data": 1}}]), {},
     "binary_data"),
    ("binary_data_size true", v2({"parameters": {"binary_data_size": True}}), {}, "binary_data_size"),
    ("header length of 5,000 digits", BINARY_HEADER + bytes(784), {"inference-header-content-length": "1" * 5000},
     "Inference-Header-Content-Length"),
    ("timeout of 312 digits", v2(), {"x-request-timeout-ms": "9" * 312}, "X-Request-Timeout-Ms"),
    ("raw pixels without a header length", bytes(range(256)) * 3 + bytes(16), {},
     "no Inference-Header-Content-Length"),
    ("timeout not a number", v2(), {"x-request-timeout-ms": "abc"}, "X-Request-Timeout-Ms is 'abc'"),  # not b'abc'
    # base64's decoder raises a plain ValueError (not binascii.Error) for text outside ASCII: it was a 500
    ("a BYTES element outside ASCII", v2({"datatype": "BYTES", "shape": [1], "data": ["iVBORé"]}), {}, "base64"),
    ("an input name of 20,000 characters", v2({"name": "x" * 20_000}), {}, "the input is named 'xxx"),
    ("an id of 2,000 characters", v2(id="i" * 2000), {}, "the request id is 2000 characters"),
    ("a datatype of 20,000 characters", v2({"datatype": "F" * 20_000}), {}, "datatype is 'FFF"),
    # The datatype, not its data: "holds non-numeric elements" never said the datatype was the wrong one
    ("datatype STRING with strings", v2({"datatype": "STRING", "data": ["a"] * 784}), {}, "datatype is 'STRING'"),
    ("datatype bytes in lower case", v2({"datatype": "bytes", "shape": [1], "data": [PNG]}), {}, "datatype is 'bytes'"),
    # Which of a tensor's images could not be decoded
    ("a bad image among two", v2({"datatype": "BYTES", "shape": [2], "data": [PNG, "aGVsbG8="]}), {},
     "element 1 of the 2: the upload could not be decoded"),
    # Triton's shared-memory extension: ignored, the client read its output region's stale bytes as the answer
    ("an input in shared memory", v2({"parameters": {"shared_memory_region": "in", "shared_memory_byte_size": 784}}),
     {}, "shared-memory region ('shared_memory_region')"),
    ("an output to shared memory",
     v2(outputs=[{"name": "probabilities", "parameters": {"shared_memory_region": "out"}}]), {},
     "shared-memory region ('shared_memory_region')"),
]  # fmt: skip
LONGEST_ERROR = 2048  # bytes: no client string is echoed whole (a gRPC status travels in 16 KiB of trailers)


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    logs = tmp_path_factory.mktemp("malformed")
    grpc_port = free_port()
    with (
        # Its timeout short, for the gRPC call whose message never comes whole (within the timeout: DEADLINE_EXCEEDED)
        running_server(
            logs / "inline.log",
            command=SERVE,
            device="cpu",
            grpc_port=str(grpc_port),
            request_timeout_s=str(MESSAGE_WITHIN_S),
        ) as inline,  # fmt: skip
        running_server(logs / "asgi.log", command=SERVE, device="cpu", inline_predict="false") as asgi,
    ):
        yield {"inline": inline, "asgi": asgi, "grpc": f"127.0.0.1:{grpc_port}", "grpc_log": str(logs / "inline.log")}


def batches(url: str) -> float:
    """Batches the server has launched. Each server here is one process (one worker, no engine process), whose
    /metrics flushes its own buffered figures as it answers: exact at once, with no wait for other processes'
    flushes (settled_metrics' 0.3 s, twice a case, was 40 of this module's 52 s)."""
    return sum(
        sample.value
        for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text)
        for sample in family.samples
        if sample.name == "cgserve_batches_total"
    )


@pytest.mark.parametrize("path", ["inline", "asgi"])
@pytest.mark.parametrize(
    ("case", "body", "headers", "words"),
    [pytest.param(*m, id=m[0]) for m in MALFORMED],
)
def test_malformed_v2_requests_get_400_before_their_batch(
    servers: dict[str, str], path: str, case: str, body: bytes, headers: dict[str, str], words: str
) -> None:
    url = servers[path]
    launched = batches(url)
    answer = httpx.post(url + V2, content=body, headers={"content-type": "application/json", **headers})
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert isinstance(error, str) and words in error and "expected" in error, error
    assert len(answer.content) < LONGEST_ERROR, len(answer.content)
    assert batches(url) == launched  # refused before its batch ran
    good = httpx.post(url + V2, content=v2(outputs=[CLASSIFY]), headers={"content-type": "application/json"})
    assert good.status_code == 200 and good.json()["outputs"][0]["shape"] == [1, 3]


def test_both_paths_give_the_same_400(servers: dict[str, str]) -> None:
    for case, body, headers, _ in MALFORMED:
        inline, asgi = (
            httpx.post(servers[path] + V2, content=body, headers={"content-type": "application/json", **headers})
            for path in ("inline", "asgi")
        )
        assert (inline.status_code, inline.content) == (asgi.status_code, asgi.content), case


def grpc_request() -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=MODEL)
    request.inputs.add(name="input", datatype="UINT8", shape=[1, 1, 28, 28])
    request.raw_input_contents.append(bytes(784))
    return request


def classified(parameter: service_pb2.InferParameter, repeats: int = 1) -> service_pb2.ModelInferRequest:
    request = grpc_request()
    for _ in range(repeats):
        output = request.outputs.add(name="probabilities")
        output.parameters["classification"].CopyFrom(parameter)
    return request


UNKNOWN_OUTPUT = grpc_request()
UNKNOWN_OUTPUT.outputs.add(name="logits")
TWO_RAW_TENSORS = grpc_request()  # one input, two raw tensors: the second was ignored
TWO_RAW_TENSORS.raw_input_contents.append(b"not a tensor at all")
CONTENTS_AND_RAW = grpc_request()  # typed contents beside the raw tensor: they were ignored
CONTENTS_AND_RAW.inputs[0].contents.uint_contents.extend([0] * 784)
LONG_INPUT_NAME = grpc_request()  # echoed whole, its status lost to RESOURCE_EXHAUSTED (trailers over 16 KiB)
LONG_INPUT_NAME.inputs[0].name = "x" * 20_000
LONG_ID = grpc_request()
LONG_ID.id = "i" * 2000
SHARED_INPUT = grpc_request()
SHARED_INPUT.inputs[0].parameters["shared_memory_region"].string_param = "in"
SHARED_OUTPUT = grpc_request()
SHARED_OUTPUT.outputs.add(name="probabilities").parameters["shared_memory_region"].string_param = "out"
NEGATIVE_BATCH = grpc_request()  # gRPC's shape is int64s: the count of elements it was told was -784
NEGATIVE_BATCH.inputs[0].shape[0] = -1
GRPC_MALFORMED = [
    ("a negative batch", NEGATIVE_BATCH, "the input's shape is [-1, 1, 28, 28]"),
    ("an input in shared memory", SHARED_INPUT, "shared-memory region ('shared_memory_region')"),
    ("an output to shared memory", SHARED_OUTPUT, "shared-memory region ('shared_memory_region')"),
    ("an id of 2,000 characters", LONG_ID, "the request id is 2000 characters"),
    ("unknown output", UNKNOWN_OUTPUT, "logits"),
    ("two raw tensors for one input", TWO_RAW_TENSORS, "raw_input_contents holds 2 tensors"),
    ("contents and raw_input_contents", CONTENTS_AND_RAW, "both contents and raw_input_contents"),
    ("an input name of 20,000 characters", LONG_INPUT_NAME, "the input is named 'xxx"),
    ("classification a string", classified(service_pb2.InferParameter(string_param="3")), "classification"),
    ("classification a bool", classified(service_pb2.InferParameter(bool_param=True)), "classification"),
    ("classification negative", classified(service_pb2.InferParameter(int64_param=-1)), "classification"),
    ("repeated outputs", classified(service_pb2.InferParameter(int64_param=3), repeats=200_000), "200000 times"),
]


@pytest.mark.parametrize(("case", "request_", "words"), GRPC_MALFORMED, ids=[m[0] for m in GRPC_MALFORMED])
def test_malformed_grpc_requests_get_invalid_argument(
    servers: dict[str, str], case: str, request_: service_pb2.ModelInferRequest, words: str
) -> None:
    with grpc.insecure_channel(servers["grpc"]) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        launched = batches(servers["inline"])
        with pytest.raises(grpc.RpcError) as raised:
            stub.ModelInfer(request_, timeout=30)
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT, raised.value
        assert words in str(raised.value.details()), raised.value.details()
        assert len(raised.value.details()) < LONGEST_ERROR
        assert batches(servers["inline"]) == launched
        good = stub.ModelInfer(classified(service_pb2.InferParameter(int64_param=3)), timeout=30)
    assert list(good.outputs[0].shape) == [1, 3]
    assert np.frombuffer(good.raw_output_contents[0][:4], "<u4")[0] > 0  # a length-prefixed string


def test_a_model_name_of_20000_characters_is_not_found_over_grpc(servers: dict[str, str]) -> None:
    """Its status is NOT_FOUND with the name cut short, not RESOURCE_EXHAUSTED from trailers over 16 KiB."""
    request = grpc_request()
    request.model_name = "m" * 20_000
    with grpc.insecure_channel(servers["grpc"]) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        for call, message in (
            (stub.ModelInfer, request),
            (stub.ModelMetadata, service_pb2.ModelMetadataRequest(name="m" * 20_000)),
        ):
            with pytest.raises(grpc.RpcError) as raised:
                call(message, timeout=30)
            assert raised.value.code() == grpc.StatusCode.NOT_FOUND, raised.value
            details = str(raised.value.details())
            assert "no model named 'mmm" in details and len(details) < LONGEST_ERROR, details[:200]


NOT_PROTOBUF = b"\xff\xff\xff\xff"  # field 31, wire type 7: no such wire type


@pytest.mark.parametrize("method", ["ModelInfer", "ModelMetadata", "ModelStreamInfer"])
def test_bytes_that_are_not_a_protobuf_message_get_invalid_argument(servers: dict[str, str], method: str) -> None:
    """grpcio's own answer to a request it cannot parse was UNKNOWN, "Exception deserializing request!"."""
    path = f"/inference.GRPCInferenceService/{method}"
    with grpc.insecure_channel(servers["grpc"]) as channel:
        if method == "ModelStreamInfer":  # each message of a stream: an answer that says so, the stream goes on
            stream = channel.stream_stream(path, response_deserializer=service_pb2.ModelStreamInferResponse.FromString)
            answers = list(stream(iter([NOT_PROTOBUF, grpc_request().SerializeToString()]), timeout=30))
            assert "not parse as a protobuf inference.ModelInferRequest" in answers[0].error_message, answers[0]
            assert not answers[1].error_message and answers[1].infer_response.outputs
            return
        with pytest.raises(grpc.RpcError) as raised:
            channel.unary_unary(path)(NOT_PROTOBUF, timeout=30)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT, raised.value
    assert "do not parse as a protobuf inference.Model" in str(raised.value.details()), raised.value.details()


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("/grpc.health.v1.Health/Check", "grpc.health.v1.HealthCheckRequest"),
        ("/grpc.health.v1.Health/Watch", "grpc.health.v1.HealthCheckRequest"),
        (
            "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
            "grpc.reflection.v1alpha.ServerReflectionRequest",
        ),
    ],
)
def test_bytes_that_are_not_a_protobuf_message_get_invalid_argument_from_health_and_reflection(
    servers: dict[str, str], path: str, message: str
) -> None:
    """They were UNKNOWN, "Unexpected <class 'google.protobuf.message.DecodeError'>", and grpcio logged an ERROR
    traceback for each: any client could fill the server's log."""
    with grpc.insecure_channel(servers["grpc"]) as channel, pytest.raises(grpc.RpcError) as raised:
        if path.endswith("Check"):
            channel.unary_unary(path)(NOT_PROTOBUF, timeout=30)
        elif path.endswith("Watch"):
            list(channel.unary_stream(path)(NOT_PROTOBUF, timeout=30))
        else:
            list(channel.stream_stream(path)(iter([NOT_PROTOBUF]), timeout=30))
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT, raised.value
    assert f"do not parse as a protobuf {message}" in str(raised.value.details()), raised.value.details()
    log = Path(servers["grpc_log"]).read_text()
    assert "DecodeError" not in log, log[-3000:]


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("/inference.GRPCInferenceService/ModelInfer", "inference.ModelInferRequest"),
        ("/grpc.health.v1.Health/Check", "grpc.health.v1.HealthCheckRequest"),
    ],
)
def test_a_call_that_ends_without_its_message_is_refused_at_once(
    servers: dict[str, str], path: str, message: str
) -> None:
    """HEADERS that end the call, no message: grpcio's unary handler waited for one for ever, and the call (and its
    connection) stayed open with no answer."""
    with grpc.insecure_channel(servers["grpc"]) as channel, pytest.raises(grpc.RpcError) as raised:
        channel.stream_unary(path)(iter([]), timeout=30)  # the client sends its headers and ends the call
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT, raised.value
    assert raised.value.details() == f"the call ended without a request message; expected one {message}"


def test_a_call_whose_message_never_comes_ends_at_the_timeout(servers: dict[str, str]) -> None:
    """A call whose message does not come (a client that sends headers and stops): DEADLINE_EXCEEDED at the
    service's timeout, not a call and a connection held open until the connection's age ends it (30 minutes)."""
    released = threading.Event()

    def never() -> Iterator[bytes]:
        released.wait(60)  # the call has ended by then: grpcio stops asking
        yield from ()

    started = time.monotonic()
    with grpc.insecure_channel(servers["grpc"]) as channel, pytest.raises(grpc.RpcError) as raised:
        try:
            channel.stream_unary("/inference.GRPCInferenceService/ModelInfer")(never(), timeout=60)
        finally:
            released.set()
    assert raised.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED, raised.value
    assert f"did not come whole within {MESSAGE_WITHIN_S} s" in str(raised.value.details()), raised.value.details()
    assert time.monotonic() - started < 40  # the server's bound, not the client's deadline


def test_a_streamed_request_with_a_long_id_is_refused_without_echoing_it(servers: dict[str, str]) -> None:
    """An answer echoes its request's id, and a stream holds up to 256 unsent answers: 16 MiB ids held
    gigabytes. Past 1024 characters the request is refused on the stream, its answer without the id."""
    with grpc.insecure_channel(servers["grpc"]) as channel:
        stream = channel.stream_stream(
            "/inference.GRPCInferenceService/ModelStreamInfer",
            request_serializer=service_pb2.ModelInferRequest.SerializeToString,
            response_deserializer=service_pb2.ModelStreamInferResponse.FromString,
        )
        answers = list(stream(iter([LONG_ID, grpc_request()]), timeout=30))
    assert "the request id is 2000 characters" in answers[0].error_message, answers[0].error_message
    assert answers[0].infer_response.id == "" and not answers[1].error_message
