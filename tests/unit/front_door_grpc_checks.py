"""app/front_door's gRPC parts without a server: a piece's ModelInferResponses are the gRPC port's, row by row,
for every model shape; a call's request is checked as the gRPC port checks it, once without its id; refusals carry
the gRPC port's code and text; and a bulk of every kind of request is answered each in its own protocol.

Run by test_front_door_grpc_parts.py in a process of its own: these load the service's protocol messages, whose
names tritonclient's (imported by the protocol tests) already holds in the test process's protobuf pool."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import orjson

from app.errors import ServiceError, UnknownModelError
from app.front_door.door import GRPC, PREDICT, V2
from app.front_door.grpc_calls import OK_TRAILERS, GrpcAnswers, GrpcHeaders, error_trailers
from app.protocols.v2.grpc_server import infer_response
from app.protocols.v2.proto import grpc_predict_v2_pb2 as pb
from app.protocols.v2.rest import Asked
from app.protocols.v2.tensors import Wanted
from tests.seed_model import seed_spec
from tests.unit.test_front_door_parts import feed, specs, v2_header


def test_grpc_answers_of_a_piece_are_the_grpc_ports_row_by_row(tmp_path: Path) -> None:
    """Values and top-k outputs, with and without ids, for every model shape: each row's message is the gRPC port's
    ModelInferResponse for that row alone (the rows of values share one template, their fields in another order)."""
    for spec in specs(tmp_path):
        served: Any = SimpleNamespace(spec=spec)
        answers = GrpcAnswers(served)
        width = len(spec.class_names) if spec.layout.default else spec.layout.width
        scores = np.random.default_rng(2).random((12, width), dtype=np.float32)
        every = tuple(Wanted(name, 0, True) for name in spec.layout.names)
        kinds = [every, every[:1]]
        if spec.layout.classes is not None:
            kinds.append((Wanted(spec.layout.classes.name, 3, True),))
        asked = [Asked(None if i % 3 else f"id-{i}é", kinds[i % len(kinds)]) for i in range(12)]
        messages = answers(scores, asked)
        for i, wanted in enumerate(asked):
            want = infer_response(wanted.id or "", served, scores[i : i + 1], wanted.outputs)
            assert pb.ModelInferResponse.FromString(messages[i]) == want, (spec.name, wanted)
        assert answers._templates[every] is not None  # the shared template was used


def infer_request(shape: list[int], datatype: str = "UINT8", id: str | None = None, **fields: Any) -> bytes:
    """A Triton client's ModelInferRequest for one raw input, as grpc.c hands it to Python: without its
    raw_input_contents, its id's field first."""
    tensor = pb.ModelInferRequest.InferInputTensor(name="input", datatype=datatype, shape=shape)
    request = pb.ModelInferRequest(model_name=fields.pop("model_name", "fashion-cnn"), inputs=[tensor], **fields)
    return (b"" if id is None else pb.ModelInferRequest(id=id).SerializeToString()) + request.SerializeToString()


class OneModel:
    """Service.model for the seed CNN alone, and the settings GrpcHeaders reads."""

    def __init__(self) -> None:
        self.served = SimpleNamespace(spec=seed_spec())
        self.settings = SimpleNamespace(max_instances=128)

    def model(self, name: str | None, version: str | None = None) -> Any:
        if name not in (None, "", self.served.spec.name) or version not in (None, "1"):
            raise UnknownModelError(name, [self.served.spec.name], version=version, versions=["1"])
        return self.served


def test_grpc_requests_are_what_the_grpc_port_makes_of_them() -> None:
    service = OneModel()
    known = GrpcHeaders(service, service.served)  # type: ignore[arg-type]
    outputs = [pb.ModelInferRequest.InferRequestedOutputTensor(name="probabilities")]
    asked = known(infer_request([1, 1, 28, 28], outputs=outputs, id="a"))
    assert isinstance(asked, Asked) and asked.id == "a" and asked.outputs == (Wanted("probabilities", 0, True),)
    numbered = [known(infer_request([1, 1, 28, 28], id=str(i))) for i in range(3000)]  # perf_analyzer's
    assert [a.id for a in numbered if isinstance(a, Asked)] == [str(i) for i in range(3000)]
    assert len(known.known_but_id) == 2 and len(known.known) == 0  # checked once without its id, not 3,000 times
    plain = infer_request([1, 1, 28, 28])
    assert known(plain) is known(plain) and plain in known.known
    # An id grpc.c left among the fields (its tag in two bytes, 0x9a 0x00): the request's, as the gRPC port reads it.
    unusual = infer_request([1, 1, 28, 28]) + b"\x9a\x00\x03odd"
    assert known(unusual) == Asked("odd", (Wanted("probabilities", 0, True),))
    # Two ids: the one grpc.c put first (the last sent) wins, and the earlier one is parsed but not echoed.
    twice = infer_request([1, 1, 28, 28], id="last") + b"\x1a\x05first"
    assert known(twice).id == "last"  # type: ignore[union-attr]
    too_long = known(infer_request([1, 1, 28, 28], id="x" * 10_000))
    assert isinstance(too_long, ServiceError) and "request id" in str(too_long)
    refusals = {
        infer_request([1], datatype="BYTES"): "one UINT8 input",  # an encoded image: the gRPC port decodes it
        infer_request([1, 1, 28, 28], datatype="INT8"): "one UINT8 input",  # the gRPC port's to decode
        infer_request([1, 1, 28, 27]): "[1, 1, 28, 27]",
        infer_request([1, 1, 28, 28], model_name="other"): "other",
        infer_request([1, 1, 28, 28], model_version="7"): "7",
        infer_request(
            [1, 1, 28, 28], outputs=[pb.ModelInferRequest.InferRequestedOutputTensor(name="logits")]
        ): "logits",
        b"\xff\xff\xff": "not a ModelInferRequest",
    }
    for request, says in refusals.items():
        error = known(request)
        assert isinstance(error, ServiceError) and says in str(error), (request, error)


def test_a_refusal_carries_the_grpc_ports_code_and_its_text_percent_encoded() -> None:
    trailers, name = error_trailers(UnknownModelError("mödel 100%", ["fashion-cnn"]))
    assert name == "NOT_FOUND" and trailers.startswith(b"grpc-status: 5\r\ngrpc-message: ")
    message = trailers.split(b"grpc-message: ")[1]
    assert message.endswith(b"\r\n") and b"m%C3%B6del 100%25" in message and max(message[:-2]) < 0x7F


def test_a_bulk_of_every_kind_is_answered_each_in_its_own_protocol() -> None:
    """POST /predict, v2 and gRPC rows in one bulk: each gets its own protocol's answer; a gRPC request the gRPC
    port refuses gets its code with no message, and its row is left out of the batch; the buffer comes back once."""
    headers = [b"", v2_header([1, 1, 28, 28], id="v"), infer_request([1, 1, 28, 28], id="g"),
               infer_request([1, 1, 28, 28], datatype="FP32"), infer_request([1, 1, 28, 28])]  # fmt: skip
    kinds = np.array([PREDICT, V2, GRPC, GRPC, GRPC], np.uint8)
    door = feed([5], {}, headers=headers, kinds=kinds, grpc=True)
    answers = {i: (status, head, body) for i, status, head, body in door.answers}
    assert b'"predictions"' in answers[0][2] and orjson.loads(answers[1][2])["id"] == "v"
    for i, request_id in ((2, "g"), (4, "")):
        _, trailers, message = answers[i]
        response = pb.ModelInferResponse.FromString(message)
        assert trailers == OK_TRAILERS and response.id == request_id and response.model_name == "fashion-cnn"
        assert len(response.raw_output_contents[0]) == 10 * 4  # ten FP32 probabilities
    _, trailers, message = answers[3]
    assert message == b"" and trailers.startswith(b"grpc-status: 3\r\n") and b"one UINT8 input" in trailers
    assert door.released == [1]
