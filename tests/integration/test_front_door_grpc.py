"""gRPC on the front door (app/front_door/grpc.c) in the real server process: Triton's gRPC client gets the gRPC
port's own answers from it (inferences, metadata, configuration, readiness); many calls on one connection each get
their own image's answer; every call it does not take is a gRPC status that says what to do, and the connection
goes on; it counts into /metrics; idle and stalled connections are closed. door.c and grpc.c are built by the server
itself, with the machine's C compiler and nghttp2's headers."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
from tritonclient.grpc import service_pb2 as pb  # Triton's messages (ours register the same names)
from tritonclient.utils import InferenceServerException

from tests.integration.server_process import free_port, requests_counted, running_server, settled_metrics
from tests.integration.test_front_door import SERVE, TOKEN, closed_within, compiler, read_answer, sample_images

__all__ = ["compiler"]  # the C compiler's check, for every test here too
METADATA = {"authorization": f"Bearer {TOKEN}"}
INFER = "/inference.GRPCInferenceService/ModelInfer"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    door_port, door_grpc_port, grpc_port = free_port(), free_port(), free_port()
    settings = {
        "device": "cpu",
        "front_door_port": str(door_port),
        "front_door_grpc_port": str(door_grpc_port),
        "grpc_port": str(grpc_port),
        "front_door_threads": "2",
        "auth_tokens": TOKEN,
        "keepalive_timeout_s": "1",
        "header_timeout_s": "1",
        "body_timeout_s": "1",
        "log_level": "debug",
    }
    with running_server(tmp_path_factory.mktemp("front-door-grpc") / "server.log", SERVE, **settings) as url:
        yield {"url": url, "door": f"127.0.0.1:{door_grpc_port}", "grpc": f"127.0.0.1:{grpc_port}",
               "http_door": door_port}  # fmt: skip


def uint8_input(image: np.ndarray) -> triton_grpc.InferInput:
    tensor = triton_grpc.InferInput("input", [1, 1, 28, 28], "UINT8")
    tensor.set_data_from_numpy(image.reshape(1, 1, 28, 28).astype(np.uint8))
    return tensor


def images(count: int) -> list[np.ndarray]:
    return [np.frombuffer(image, np.uint8) for image in sample_images(count)]


def test_tritons_grpc_client_gets_the_grpc_ports_answers(server: dict[str, Any]) -> None:
    door, port = (triton_grpc.InferenceServerClient(server[name]) for name in ("door", "grpc"))
    for client in (door, port):
        assert client.is_server_live() and client.is_server_ready(headers=METADATA)
        assert client.is_model_ready("fashion-cnn", headers=METADATA)
    for ask in ({}, {"model_version": "1"}):
        assert door.get_model_metadata("fashion-cnn", headers=METADATA, **ask) == port.get_model_metadata(
            "fashion-cnn", headers=METADATA, **ask
        )
        assert door.get_model_config("fashion-cnn", headers=METADATA, **ask) == port.get_model_config(
            "fashion-cnn", headers=METADATA, **ask
        )
    labels = set()
    for i, image in enumerate(images(16)):
        outputs = [triton_grpc.InferRequestedOutput("probabilities", class_count=3 if i % 4 == 3 else 0)]
        asked = {"request_id": f"call-{i}" if i % 2 else "", "outputs": outputs, "headers": METADATA}
        ours = door.infer("fashion-cnn", [uint8_input(image)], **asked).get_response()
        theirs = port.infer("fashion-cnn", [uint8_input(image)], **asked).get_response()
        assert ours == theirs, i
        labels.add(int(np.frombuffer(ours.raw_output_contents[0], np.float32).argmax()) if i % 4 != 3 else -1)
    assert len(labels) > 3  # images of several classes: a mix-up would show


def test_many_calls_on_one_connection_each_get_their_own(server: dict[str, Any]) -> None:
    """HTTP/2 multiplexes: 64 calls at once on one channel (one connection), each answered with its own image's
    scores (within float rounding: batched with other rows), as the gRPC port answers them."""
    requests = []
    for i, image in enumerate(images(64)):
        tensor = pb.ModelInferRequest.InferInputTensor(name="input", datatype="UINT8", shape=[1, 1, 28, 28])
        requests.append(pb.ModelInferRequest(model_name="fashion-cnn", id=str(i), inputs=[tensor],
                                             raw_input_contents=[image.tobytes()]))  # fmt: skip
    answers = {}
    for name in ("door", "grpc"):
        with grpc.insecure_channel(server[name]) as channel:
            infer = channel.unary_unary(INFER, pb.ModelInferRequest.SerializeToString, pb.ModelInferResponse.FromString)
            calls = [infer.future(request, metadata=tuple(METADATA.items())) for request in requests]
            answers[name] = [call.result(timeout=30) for call in calls]
    assert [answer.id for answer in answers["door"]] == [str(i) for i in range(64)]
    for ours, theirs in zip(answers["door"], answers["grpc"], strict=True):  # batched otherwise: within rounding
        assert ours.outputs == theirs.outputs
        mine, want = (np.frombuffer(answer.raw_output_contents[0], np.float32) for answer in (ours, theirs))
        assert mine.argmax() == want.argmax() and np.allclose(mine, want, atol=1e-5), ours.id


def refused(channel: grpc.Channel, method: str, message: bytes, **call: Any) -> grpc.RpcError:
    """The error a call of `message`'s bytes as they are gets."""
    stub = channel.unary_unary(f"/inference.GRPCInferenceService/{method}", lambda m: m, lambda m: m)
    with pytest.raises(grpc.RpcError) as caught:
        stub(message, timeout=10, **call)
    return caught.value


def test_every_call_it_does_not_take_is_a_status_that_says_where_to_send_it(server: dict[str, Any]) -> None:
    image = images(1)[0].tobytes()
    tensor = pb.ModelInferRequest.InferInputTensor(name="input", datatype="UINT8", shape=[1, 1, 28, 28])
    good = pb.ModelInferRequest(model_name="fashion-cnn", inputs=[tensor], raw_input_contents=[image])
    fp32 = pb.ModelInferRequest()
    fp32.CopyFrom(good)
    fp32.inputs[0].datatype, fp32.raw_input_contents[0] = "FP32", image * 4
    other = pb.ModelInferRequest()
    other.CopyFrom(good)
    other.model_name = "other"
    auth = tuple(METADATA.items())
    cases = [  # (method, message, call options, code, what its text says)
        ("ModelInfer", fp32.SerializeToString(), {"metadata": auth}, grpc.StatusCode.INVALID_ARGUMENT,
         "one image's uint8 pixels (784 bytes)"),
        ("ModelInfer", other.SerializeToString(), {"metadata": auth}, grpc.StatusCode.NOT_FOUND, "other"),
        ("ModelInfer", b"\xff\xff", {"metadata": auth}, grpc.StatusCode.INVALID_ARGUMENT, "not a ModelInferRequest"),
        ("ModelInfer", good.SerializeToString(), {}, grpc.StatusCode.UNAUTHENTICATED,
         "no bearer token; expected `authorization: Bearer <token>`"),
        ("ModelInfer", good.SerializeToString(), {"metadata": (("authorization", "Bearer nope"),)},
         grpc.StatusCode.UNAUTHENTICATED, "not one of the inference tokens"),
        # Two entries, the right one last: refused as the gRPC port refuses them (the door took the last one).
        ("ModelInfer", good.SerializeToString(), {"metadata": (("authorization", "Bearer nope"), *auth)},
         grpc.StatusCode.UNAUTHENTICATED, "sent twice"),
        ("ModelInfer", good.SerializeToString(), {"metadata": auth, "compression": grpc.Compression.Gzip},
         grpc.StatusCode.UNIMPLEMENTED, "uncompressed"),
        # A model it does not serve: NOT_FOUND, as the gRPC port says of a name it does not serve (a typo).
        ("ModelMetadata", pb.ModelMetadataRequest(name="other").SerializeToString(), {"metadata": auth},
         grpc.StatusCode.NOT_FOUND, "service's gRPC port serves every model"),
        ("ModelMetadata", b"\x0a\x0bfashion-cnn\x0a\x05other", {"metadata": auth}, grpc.StatusCode.NOT_FOUND,
         "no model of that name"),  # a repeated name: protobuf keeps the last
        ("ModelMetadata", pb.ModelMetadataRequest(name="fashion-cnn").SerializeToString(), {},
         grpc.StatusCode.UNAUTHENTICATED, "bearer token"),
        ("RepositoryIndex", b"", {"metadata": auth}, grpc.StatusCode.UNIMPLEMENTED, "service's gRPC port"),
        # Not ready, for a model not served: said to a client with a token only, as the gRPC port says it.
        ("ModelReady", pb.ModelReadyRequest(name="nowhere").SerializeToString(), {}, grpc.StatusCode.UNAUTHENTICATED,
         "bearer token"),
        ("ModelMetadata", pb.ModelMetadataRequest(name="nowhere").SerializeToString(), {},
         grpc.StatusCode.UNAUTHENTICATED, "bearer token"),  # as the gRPC port: the token before the model
    ]  # fmt: skip
    with grpc.insecure_channel(server["door"]) as channel:
        for method, message, call, code, says in cases:
            error = refused(channel, method, message, **call)
            assert error.code() == code and says in (error.details() or ""), (method, call, error)
        # A service of the same length as Triton's, not it: no model call of it is answered.
        look_alike = channel.unary_unary("/inference.GRPCInferenceServicX/ModelReady", lambda m: m, lambda m: m)
        with pytest.raises(grpc.RpcError) as other_service:
            look_alike(pb.ModelReadyRequest(name="nowhere").SerializeToString(), metadata=auth, timeout=10)
        assert other_service.value.code() == grpc.StatusCode.UNIMPLEMENTED
        infer = channel.unary_unary(INFER, pb.ModelInferRequest.SerializeToString, pb.ModelInferResponse.FromString)
        assert infer(good, metadata=auth, timeout=10).model_name == "fashion-cnn"  # the connection goes on
        # A stream whose client never ends its side (as Triton's start_stream): refused at its headers, not left open.
        stream = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer", lambda m: m, lambda m: m)
        ended = threading.Event()

        def requests() -> Iterator[bytes]:
            yield good.SerializeToString()
            ended.wait(10)

        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as caught:
            list(stream(requests(), metadata=auth, timeout=10))
        ended.set()
        assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED and time.monotonic() - started < 5
    for address in (server["door"], server["grpc"]):  # not served: not ready, as Triton answers (not NOT_FOUND)
        with triton_grpc.InferenceServerClient(address) as client:
            assert not client.is_model_ready("fashion-cnn", "9", headers=METADATA)
            assert not client.is_model_ready("nowhere", headers=METADATA)
    client = triton_grpc.InferenceServerClient(server["door"])
    with pytest.raises(InferenceServerException, match="one image's uint8 pixels"):
        tensor32 = triton_grpc.InferInput("input", [1, 1, 28, 28], "FP32")
        tensor32.set_data_from_numpy(np.zeros((1, 1, 28, 28), np.float32))
        client.infer("fashion-cnn", [tensor32], headers=METADATA)


def test_a_stream_that_writes_then_reads_is_told_unimplemented(server: dict[str, Any]) -> None:
    """Refused at its headers, the status raced grpcio's aio client's first write: INTERNAL ("Internal error from
    Core") in 6 of 10 calls. Refused at its first message, each says where to send it."""
    message = pb.ModelInferRequest(model_name="fashion-cnn").SerializeToString()

    async def calls() -> list[grpc.StatusCode]:
        codes = []
        async with grpc.aio.insecure_channel(server["door"]) as channel:
            stream = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")
            for _ in range(10):
                call = stream(metadata=tuple(METADATA.items()), timeout=10)
                with contextlib.suppress(grpc.aio.AioRpcError):
                    await call.write(message)
                    await call.read()
                codes.append(await call.code())
        return codes

    assert asyncio.run(calls()) == [grpc.StatusCode.UNIMPLEMENTED] * 10


def test_a_model_call_is_answered_however_its_request_is_encoded(server: dict[str, Any]) -> None:
    """A second review: answers are keyed by protobuf's own encoding of the request, so an explicit empty version
    or the fields in the other order got NOT_FOUND for the model the door serves."""
    served = pb.ModelMetadataRequest(name="fashion-cnn").SerializeToString()
    with grpc.insecure_channel(server["door"]) as channel:
        stub = channel.unary_unary("/inference.GRPCInferenceService/ModelMetadata", lambda m: m, lambda m: m)
        want = stub(served, metadata=tuple(METADATA.items()), timeout=10)
        for request in (served + b"\x12\x00", b"\x12\x00" + served):
            assert stub(request, metadata=tuple(METADATA.items()), timeout=10) == want, request


def test_a_model_calls_unknown_fields_are_skipped_as_protobuf_skips_them(server: dict[str, Any]) -> None:
    """A third review: a field the door did not know (a newer client's, or the name as a varint) made the request
    not one it keyed, so it answered UNIMPLEMENTED where the gRPC port, whose parser keeps such a field aside,
    answered the request. A fourth: groups are such fields too, and a tag protobuf refuses (over 5 bytes or 32 bits)
    or a name not UTF-8 was taken. Bytes protobuf refuses are INVALID_ARGUMENT at both, saying so at the door, once
    the token is checked (as at the port, before anything of the message: a fifth review)."""
    served = pb.ModelMetadataRequest(name="fashion-cnn").SerializeToString()
    unknown = [
        b"\x18\x96\x01",  # field 3, a varint
        b"\x21" + bytes(8),  # field 4, fixed64
        b"\x2a\x03abc",  # field 5, length-delimited
        b"\x35" + bytes(4),  # field 6, fixed32
        b"\x08\x01",  # the name as a varint
        b"\x1b\x1c",  # a group (field 3), empty
        b"\x1b\x08\x01\x23\x24\x1c",  # a group holding a varint and a group
        b"\x0b\x0c",  # the name as a group
        b"\x1b\x0a\x05other\x1c",  # a name inside a group: the group's, not the request's
    ]
    broken = [
        served + b"\x18",  # a varint past the end
        served + b"\x2a\x09abc",  # a length past the end
        served + b"\x21\x00",  # a fixed64 cut short
        served + b"\x1b",  # a group left open
        served + b"\x1c",  # a group closed without its start
        served + b"\x1b\x24",  # closed as another field
        b"\x02\x00",  # field 0
        served + b"\x80\x80\x80\x80\x10\x01",  # a tag over 32 bits
        b"\x8a\x80\x80\x80\x80\x00\x0bfashion-cnn",  # the name's tag in 6 bytes
        b"\x0a\x0bfashion-cn\xff",  # a name not UTF-8
        b"\x0a\x03\xed\xa0\x80" + served,  # a surrogate in a name then replaced
        served + b"\x12\x02\xc0\x81",  # an overlong version
    ]
    auth = tuple(METADATA.items())
    with grpc.insecure_channel(server["door"]) as door, grpc.insecure_channel(server["grpc"]) as port:
        method = "/inference.GRPCInferenceService/ModelMetadata"
        door_call, port_call = (c.unary_unary(method, lambda m: m, lambda m: m) for c in (door, port))
        want = port_call(served, metadata=auth, timeout=10)
        for field in unknown:
            for request in (served + field, field + served):
                assert port_call(request, metadata=auth, timeout=10) == want, request
                assert door_call(request, metadata=auth, timeout=10) == want, request
        ready_method = "/inference.GRPCInferenceService/ModelReady"
        ready = door.unary_unary(ready_method, lambda m: m, pb.ModelReadyResponse.FromString)
        ready_request = pb.ModelReadyRequest(name="fashion-cnn").SerializeToString() + b"\x18\x01"
        assert ready(ready_request, metadata=auth, timeout=10).ready
        for request in broken:
            at_port = refused(port, "ModelMetadata", request, metadata=auth)
            error = refused(door, "ModelMetadata", request, metadata=auth)
            assert error.code() == at_port.code() == grpc.StatusCode.INVALID_ARGUMENT, request
            assert "not a model's name and version" in (error.details() or ""), request
            no_token = (refused(channel, "ModelMetadata", request) for channel in (door, port))
            assert [e.code() for e in no_token] == [grpc.StatusCode.UNAUTHENTICATED] * 2, request
        # Larger than the door reads for a model call (an unknown field of 5000 bytes): the token first there too. With
        # one, the door says where to send it, as it does for any message past its limits.
        large = served + b"\x2a\x88\x27" + b"a" * 5000
        no_token = (refused(channel, "ModelMetadata", large) for channel in (door, port))
        assert [e.code() for e in no_token] == [grpc.StatusCode.UNAUTHENTICATED] * 2
        assert refused(door, "ModelMetadata", large, metadata=auth).code() == grpc.StatusCode.INVALID_ARGUMENT


def test_it_counts_into_metrics(server: dict[str, Any]) -> None:
    before = settled_metrics(server["url"])
    client = triton_grpc.InferenceServerClient(server["door"])
    for image in images(3):
        client.infer("fashion-cnn", [uint8_input(image)], headers=METADATA)
    with pytest.raises(InferenceServerException):
        client.infer("fashion-cnn", [uint8_input(images(1)[0])])  # no token: refused in C
    time.sleep(1.5)  # the C side's refusals are counted every second
    after = settled_metrics(server["url"])

    ok, unauthenticated = 'protocol="door",format="grpc",code="200"', 'format="grpc",code="UNAUTHENTICATED"'
    assert requests_counted(after, ok) - requests_counted(before, ok) == 3
    assert requests_counted(after, unauthenticated) - requests_counted(before, unauthenticated) >= 1
    assert 'cgserve_request_duration_seconds_count{format="grpc",model="fashion-cnn",protocol="door"}' in after


def frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    """An HTTP/2 frame (RFC 9113 §4.1)."""
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def literal(name: bytes, value: bytes) -> bytes:
    """A header as HPACK's literal without indexing, new name, no Huffman (RFC 7541 §6.2.2); short strings."""
    return b"\x00" + bytes([len(name)]) + name + bytes([len(value)]) + value


PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(4, 0, 0, b"")  # the client's preface and its SETTINGS


def call_headers(path: str = INFER) -> bytes:
    """A gRPC call's HEADERS block, with the token."""
    fields = ((b":method", b"POST"), (b":scheme", b"http"), (b":path", path.encode()), (b":authority", b"x"),
              (b"content-type", b"application/grpc"), (b"authorization", f"Bearer {TOKEN}".encode()))  # fmt: skip
    return b"".join(literal(name, value) for name, value in fields)


def one_image_call() -> bytes:
    """A ModelInfer call's body: the gRPC message prefix, then one sample image's request."""
    tensor = pb.ModelInferRequest.InferInputTensor(name="input", datatype="UINT8", shape=[1, 1, 28, 28])
    request = pb.ModelInferRequest(
        model_name="fashion-cnn", inputs=[tensor], raw_input_contents=[images(1)[0].tobytes()]
    )
    message = request.SerializeToString()
    return b"\x00" + struct.pack(">I", len(message)) + message


def frames(data: bytes) -> list[tuple[int, int, int, bytes]]:
    """The whole frames in `data`: (type, flags, stream, payload) each."""
    found = []
    while len(data) >= 9:
        length = int.from_bytes(data[:3], "big")
        if len(data) < 9 + length:
            break
        kind, flags, stream = data[3], data[4], int.from_bytes(data[5:9], "big") & 0x7FFFFFFF
        found.append((kind, flags, stream, data[9 : 9 + length]))
        data = data[9 + length :]
    return found


def test_idle_and_stalled_connections_are_closed(server: dict[str, Any]) -> None:
    """A connection that sends nothing is closed after keepalive_timeout_s (1 s here); a call that stops arriving
    halfway is refused after header + body timeouts (2 s), as the HTTP port refuses a slow request, and its
    connection, without calls then, is closed after a GOAWAY."""
    host, port = server["door"].split(":")
    with socket.create_connection((host, int(port))) as idle:
        assert closed_within(idle, 4) is not None
    with socket.create_connection((host, int(port))) as stalled:
        stalled.sendall(
            PREFACE + frame(1, 4, 1, call_headers()) + frame(0, 0, 1, b"\x00\x00\x00\x03\x10" + b"\x00" * 100)
        )
        started = time.monotonic()
        sent = closed_within(stalled, 8)
        assert sent is not None and time.monotonic() - started > 1.0  # not at once: the call had its time
    kinds = [kind for kind, *_ in frames(sent)]
    assert 1 in kinds and 3 in kinds and kinds[-1] == 7, kinds  # its answer (HEADERS), its reset, then GOAWAY


def test_a_client_that_closes_its_side_still_gets_its_answer(server: dict[str, Any]) -> None:
    """A call sent whole, then the client's last byte (its socket's sending side shut): answered, then closed."""
    host, port = server["door"].split(":")
    with socket.create_connection((host, int(port))) as client:
        client.sendall(PREFACE + frame(1, 4, 1, call_headers()) + frame(0, 1, 1, one_image_call()))
        client.shutdown(socket.SHUT_WR)
        sent = closed_within(client, 5)
    assert sent is not None
    data = b"".join(payload for kind, _, stream, payload in frames(sent) if kind == 0 and stream == 1)
    answer = pb.ModelInferResponse.FromString(data[5:])
    assert answer.model_name == "fashion-cnn" and len(answer.raw_output_contents[0]) == 40


def test_a_client_that_never_opens_its_window_is_closed(server: dict[str, Any]) -> None:
    """A client whose SETTINGS give the answers no window (and that never sends WINDOW_UPDATE) cannot be answered:
    closed once its answer has waited the request timeout (2 s here), not held for ever with its calls."""
    no_window = frame(4, 0, 0, struct.pack(">HI", 4, 0))  # SETTINGS_INITIAL_WINDOW_SIZE = 0
    host, port = server["door"].split(":")
    with socket.create_connection((host, int(port))) as client:
        client.sendall(PREFACE[:24] + no_window + frame(1, 4, 1, call_headers()) + frame(0, 1, 1, one_image_call()))
        started = time.monotonic()
        assert closed_within(client, 8) is not None
        assert time.monotonic() - started > 1.5


def test_the_http_door_does_not_answer_grpcs_calls(server: dict[str, Any]) -> None:
    """The door's HTTP/1.1 port keeps its own answers: a GET of a gRPC call's key there is a 404."""
    with socket.create_connection(("127.0.0.1", server["http_door"])) as connection:
        connection.sendall(b"GET /inference.GRPCInferenceService/ServerLive? HTTP/1.1\r\nHost: x\r\n\r\n")
        assert connection.recv(65536).startswith(b"HTTP/1.1 404 ")


def test_bytes_being_received_are_bounded_by_the_inflight_budget(tmp_path: Any) -> None:
    """CGSERVE_MAX_INFLIGHT_BYTES holds at the door as at the service's ports: HTTP bodies (by Content-Length) and
    gRPC messages being received share it; past it a request is refused 503 before its body is read, a call
    RESOURCE_EXHAUSTED; a body that comes whole, or whose connection closes, gives its bytes back. Without the
    budget a client's 128 calls a connection, each an image being sent, were held however many connections."""
    door_port, door_grpc_port = free_port(), free_port()
    settings = {"device": "cpu", "front_door_port": str(door_port), "front_door_grpc_port": str(door_grpc_port),
                "front_door_threads": "2", "auth_tokens": TOKEN, "max_inflight_bytes": "1024"}  # fmt: skip
    image = sample_images(1)[0]  # 784 bytes: one body fits the budget, a second beside it does not
    head = b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
    head += b"Authorization: Bearer " + TOKEN.encode() + b"\r\nContent-Length: 784\r\n\r\n"
    with running_server(tmp_path / "server.log", SERVE, **settings):
        grpc_door = triton_grpc.InferenceServerClient(f"127.0.0.1:{door_grpc_port}")

        def infer() -> None:
            grpc_door.infer("fashion-cnn", [uint8_input(np.frombuffer(image, np.uint8))], headers=METADATA)

        def full_request() -> bytes:
            """Its status line and body."""
            with socket.create_connection(("127.0.0.1", door_port), timeout=5) as connection:
                connection.sendall(head + image)
                status, _, body = read_answer(connection)
                return status + b"\r\n" + body

        for _ in range(3):  # each call's bytes given back once its row is taken: the next fits again
            infer()
        with socket.create_connection(("127.0.0.1", door_port), timeout=5) as holding:
            holding.sendall(head + image[:100])  # 784 bytes held while the rest is awaited
            time.sleep(0.3)
            refused = full_request()
            assert refused.startswith(b"HTTP/1.1 503") and b"CGSERVE_MAX_INFLIGHT_BYTES" in refused, refused[:300]
            with pytest.raises(InferenceServerException) as caught:
                infer()
            assert "RESOURCE_EXHAUSTED" in str(caught.value.status()) and "CGSERVE_MAX_INFLIGHT_BYTES" in str(
                caught.value
            )
            holding.sendall(image[100:])  # whole now: answered, and its bytes given back
            holding.settimeout(5)
            assert holding.recv(65536).startswith(b"HTTP/1.1 200")
        assert full_request().startswith(b"HTTP/1.1 200")
        with socket.create_connection(("127.0.0.1", door_port), timeout=5) as leaving:
            leaving.sendall(head + image[:100])
            time.sleep(0.3)
        time.sleep(0.3)  # closed mid-body: its bytes given back with the connection
        assert full_request().startswith(b"HTTP/1.1 200")
        infer()


def test_the_door_says_its_bound_on_a_calls_metadata(server: dict[str, Any]) -> None:
    """Its SETTINGS give SETTINGS_MAX_HEADER_LIST_SIZE, 16 KiB as the gRPC port's, for a client to fail a call with
    more metadata by itself (grpc-go's client does; grpcio's, here, sends it anyway). Unsaid, a call's 70 KB value
    went over nghttp2's own bound on a header field, a connection error, and every other call on that connection
    failed with it (a review)."""
    host, port = server["door"].split(":")
    with socket.create_connection((host, int(port)), timeout=5) as client:
        client.sendall(PREFACE)
        data = b""
        while not (found := [payload for kind, _, _, payload in frames(data) if kind == 4 and payload]):
            data += client.recv(65536)
    said = dict(struct.unpack(">HI", found[0][i : i + 6]) for i in range(0, len(found[0]), 6))
    assert said.get(6) == 16384, said  # 6: SETTINGS_MAX_HEADER_LIST_SIZE (RFC 9113 §6.5.2)


def test_a_model_call_it_refuses_is_not_counted_as_a_request(server: dict[str, Any]) -> None:
    """ModelMetadata, ModelConfig and ModelReady are lookups: the gRPC port counts none of them among its requests;
    each of a model the door does not serve added a door request's NOT_FOUND (a review)."""
    from tests.integration.test_front_door import door_requests

    client = triton_grpc.InferenceServerClient(server["door"])
    time.sleep(1.5)  # the C side's refusals of the tests before are counted (every second), not among these
    before = settled_metrics(server["url"])
    for i in range(5):
        with pytest.raises(InferenceServerException, match="serves no model of that name"):
            client.get_model_metadata(f"no-such-model-{i}", headers=METADATA)
        with pytest.raises(InferenceServerException):
            client.get_model_config("fashion-cnn")  # no token
    time.sleep(1.5)  # the C side's refusals are counted every second
    assert door_requests(settled_metrics(server["url"])) == door_requests(before)
