"""The front door's gRPC calls: each ModelInfer checked as the gRPC port checks it, once per distinct request, and
answered with the gRPC port's ModelInferResponse, built for the k rows of a piece at once where it can be.

grpc.c takes ModelInfer whose one raw_input_contents entry is one image's uint8 pixels and hands Python the
request's other fields as they were sent (the model's name, the input's name, shape and datatype, the outputs
asked: ~100 bytes), its id's field first. A client sends the same fields with every call but for its id (Triton's
clients number theirs where asked), so the id is cut off the front and the rest looked up by its bytes: a request is
parsed and checked by the gRPC port's own decode only where those bytes are new (a numbered call: 2.7 µs of the
event loop parsing each, 1.4 µs cutting its id; bench/results/2026-12-04-cpu-grpc-request-ids.md).
"""

from __future__ import annotations

import grpc
import numpy as np
from google.protobuf.message import DecodeError, Message

from app.errors import InputError, NotReadyError, ServiceError
from app.front_door.v2_headers import KnownHeaders, remember
from app.protocols.v2 import tensors
from app.protocols.v2.grpc_server import (
    SERVICE_NAME,
    STATUS_CODES,
    asked_outputs,
    config_response,
    infer_response,
    input_images,
    metadata_response,
    model_ready,
)
from app.protocols.v2.proto import grpc_predict_v2_pb2 as pb
from app.protocols.v2.rest import Asked
from app.service import ServedModel, Service

OK_TRAILERS = b"grpc-status: 0\r\n"
ID_FIELD = b"\x1a"  # ModelInferRequest's field 3 (id), length-delimited: grpc.c puts it first
EXPECTED = "a ModelInferRequest (inference.GRPCInferenceService) with one UINT8 image in raw_input_contents"


def grpc_key(method: str, request: bytes) -> bytes:
    """What grpc.c looks a call's answer up by (find_get): its path, "?", its request message's bytes in hex."""
    return f"/{SERVICE_NAME}/{method}?{request.hex()}".encode()


def error_trailers(error: ServiceError) -> tuple[bytes, str]:
    """A refused call's trailers, as the gRPC port aborts it (its code and text), and the code's name."""
    code = STATUS_CODES.get(error.status, grpc.StatusCode.INTERNAL)
    return b"grpc-status: %d\r\ngrpc-message: %s\r\n" % (code.value[0], _percent(error.text())), code.name


def _percent(text: str) -> bytes:
    """grpc-message's encoding: UTF-8, every byte outside printable ASCII and "%" itself as %XX."""
    return b"".join(
        bytes([byte]) if 0x20 <= byte <= 0x7E and byte != 0x25 else b"%%%02X" % byte for byte in text.encode()
    )


class GrpcHeaders(KnownHeaders):
    """A ModelInfer's fields but its pixels → what it asks (the HTTP port's `Asked`: its id and outputs), or the error
    the gRPC port answers it."""

    def __init__(self, service: Service, served: ServedModel) -> None:
        super().__init__(served.spec)
        self.service, self.served = service, served

    def __call__(self, header: bytes) -> Asked | ServiceError:
        """`header`: the request's fields but its pixels as grpc.c hands them, its id's field first where it has one."""
        found = self.known.get(header)
        if found is not None:
            return found
        if header[:1] != ID_FIELD:
            return remember(self.known, header, lambda: self._check(header, id_first=False))
        start, length = _id_field(header)
        if start + length > len(header):
            return InputError("the request is not a ModelInferRequest", expected=EXPECTED)
        rest = header[start + length :]
        found = remember(self.known_but_id, rest, lambda: self._check(rest, id_first=True))
        if isinstance(found, ServiceError):
            return found
        try:
            return Asked(tensors.checked_id(header[start : start + length].decode()), found.outputs)
        except UnicodeDecodeError:  # as protobuf's parse of the whole request refuses it
            return InputError("the request is not a ModelInferRequest (its id is not UTF-8)", expected=EXPECTED)
        except ServiceError as error:
            return error

    def _check(self, fields: bytes, *, id_first: bool) -> Asked | ServiceError:
        try:
            request = pb.ModelInferRequest.FromString(fields)
        except DecodeError:
            return InputError("the request is not a ModelInferRequest", expected=EXPECTED)
        try:
            served = self.service.model(request.model_name, request.model_version or None)
            if served is not self.served:  # the door grouped it with another model's (replaced since, say)
                raise NotReadyError(f"the model {request.model_name} changed while this call was taken: retry")
            if any(tensor.datatype != "UINT8" for tensor in request.inputs):  # its bytes are not what grpc.c copied
                return self._not_one_image()
            # Without an id cut off the front, an id among the fields (a tag in an unusual encoding) is the request's,
            # as the gRPC port reads it; with one, that one wins (protobuf's last), and one left here is an earlier.
            request_id = None if id_first else tensors.checked_id(request.id) or None
            asked = Asked(request_id, asked_outputs(request, self.spec))
            whole = pb.ModelInferRequest()
            whole.CopyFrom(request)
            whole.raw_input_contents.append(self.probe)
            images = input_images(whole, self.probe, self.spec, self.service.settings.max_instances)
        except ServiceError as error:  # what the gRPC port answers this call
            return error
        if not self.as_copied(images):
            return self._not_one_image()
        return asked

    def _not_one_image(self) -> InputError:
        return InputError(
            "the front door takes one image's pixels as the one UINT8 input, in raw_input_contents",
            expected=f"an input of shape {list(self.image_shape)} and datatype UINT8; send any other tensor, "
            "or encoded images (BYTES), to the service's gRPC port",
        )


class GrpcAnswers:
    """The gRPC port's ModelInferResponse for each row of a piece. Where every output asked is values (no top-k),
    the message is the same for every row but for those values and the id: the fields but them are serialized once
    a group, and each row's values appended as raw_output_contents (field 6) and its id (field 3) after them
    (protobuf reads fields in any order: checked against the gRPC port's own message when the template is made)."""

    ok = OK_TRAILERS  # a call answered: its trailers

    def __init__(self, served: ServedModel) -> None:
        self.served, self.spec = served, served.spec
        self._templates: dict[tuple[tensors.Wanted, ...], bytes | None] = {}  # None: row by row

    def __call__(self, scores: np.ndarray, asked: list[Asked]) -> list[bytes]:
        """(k, width) scores → k ModelInferResponse messages."""
        messages: list[bytes] = [b""] * len(scores)
        groups: dict[tuple[tensors.Wanted, ...], list[int]] = {}
        for i, wanted in enumerate(asked):
            groups.setdefault(wanted.outputs, []).append(i)
        for outputs, rows in groups.items():
            template = self._template(outputs, scores[rows[0]])
            if template is None:
                for i in rows:
                    response = infer_response(asked[i].id or "", self.served, scores[i : i + 1], outputs)
                    messages[i] = response.SerializeToString()
                continue
            for i, message in zip(rows, self._with(template, scores[rows], outputs, [asked[i].id or "" for i in rows]),
                                  strict=True):  # fmt: skip
                messages[i] = message
        return messages

    def _template(self, outputs: tuple[tensors.Wanted, ...], row: np.ndarray) -> bytes | None:
        if outputs not in self._templates:
            self._templates[outputs] = self._made(outputs, row)
        return self._templates[outputs]

    def _made(self, outputs: tuple[tensors.Wanted, ...], row: np.ndarray) -> bytes | None:
        if any(want.classes for want in outputs):
            return None
        response = infer_response("", self.served, row[None], outputs)
        response.ClearField("raw_output_contents")
        template: bytes = response.SerializeToString()
        for request_id in ("", "front-door-template-id"):
            (ours,) = self._with(template, row[None], outputs, [request_id])
            if pb.ModelInferResponse.FromString(ours) != infer_response(request_id, self.served, row[None], outputs):
                return None
        return template

    def _with(self, template: bytes, scores: np.ndarray, outputs: tuple[tensors.Wanted, ...],
              ids: list[str]) -> list[bytes]:  # fmt: skip
        k = len(scores)
        raws = [tensors.raw_bytes(*answered) for answered in tensors.answer_tensors(self.spec, scores, outputs)]
        widths = [len(raw) // k for raw in raws]  # each output's bytes a row
        fields = [b"\x32" + _varint_bytes(width) for width in widths]  # field 6, length-delimited
        messages = []
        for i, request_id in enumerate(ids):
            parts = [template]
            for raw, width, field in zip(raws, widths, fields, strict=True):
                parts += (field, raw[i * width : (i + 1) * width])
            if request_id:
                encoded = request_id.encode()
                parts += (ID_FIELD, _varint_bytes(len(encoded)), encoded)  # field 3
            messages.append(b"".join(parts))
        return messages


def _varint(data: bytes, at: int) -> tuple[int, int]:
    """The protobuf varint at data[at:]: (its value, where what follows it starts)."""
    value = shift = 0
    while at < len(data):
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at += 1
        if byte < 0x80:
            return value, at
        shift += 7
    return value, len(data) + 1  # cut short: past the end, which the caller refuses


def _id_field(header: bytes) -> tuple[int, int]:
    """Where the id's value starts in a header that begins with ID_FIELD, and its length (which may run past the end
    of a header cut short: the caller's check)."""
    length, start = _varint(header, 1)
    return start, length


def _model_named(fields: bytes) -> tuple[str, str | None] | None:
    try:
        request = pb.ModelInferRequest.FromString(fields)
    except DecodeError:
        return None
    return request.model_name, request.model_version or None


def _varint_bytes(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


class GrpcRows:
    """The front door's gRPC calls, for the feeder and the door's life: which model each names, each model's checks
    and answers, refusals' trailers, and the messages grpc.c answers the calls before a client's inferences with."""

    def __init__(self, service: Service) -> None:
        self.service = service
        self._models: dict[bytes, tuple[str, str | None] | None] = {}  # a request's fields but its id → its model

    def parts(self, served: ServedModel) -> tuple[GrpcHeaders, GrpcAnswers]:
        """`served`'s checks and answers (app/front_door/models.py keeps them while it is served)."""
        return GrpcHeaders(self.service, served), GrpcAnswers(served)

    def model_of(self, header: bytes) -> tuple[str, str | None] | None:
        """The model a call names, (model_name, model_version or None), read once per distinct request but its id;
        None where the request does not parse (its model's check says why; such a request is read each time)."""
        rest = header
        if header[:1] == ID_FIELD:
            start, length = _id_field(header)
            rest = header[start + length :]
        return remember(self._models, rest, lambda: _model_named(rest))

    @staticmethod
    def refusal(error: ServiceError) -> tuple[bytes, str]:
        return error_trailers(error)

    def server_gets(self) -> list[tuple[bytes, bytes, bytes, bool]]:
        """gRPC's server calls before a client's inferences, answered as the gRPC port answers them: each (key,
        trailers, response message, asks for a token)."""
        service = self.service
        return [
            (grpc_key("ServerLive", b""), OK_TRAILERS, pb.ServerLiveResponse(live=True).SerializeToString(), False),
            (grpc_key("ServerReady", b""), OK_TRAILERS,
             pb.ServerReadyResponse(ready=service.readiness()[0]).SerializeToString(), False),
            (grpc_key("ServerMetadata", b""), OK_TRAILERS,
             pb.ServerMetadataResponse(**tensors.server_metadata()).SerializeToString(), True),
        ]  # fmt: skip

    def ready_gets(self, model: str, versions: list[str]) -> list[tuple[bytes, bytes, bytes, bool]]:
        """ModelReady for a model served but not at the door (other images), by name and by each of `versions`, as
        the gRPC port answers it: grpc.c answers one it has not been given false."""
        answers = []
        for version in versions:
            ready = model_ready(self.service, model, version or None)
            request = pb.ModelReadyRequest(name=model, version=version).SerializeToString()
            message = pb.ModelReadyResponse(ready=ready).SerializeToString()
            answers.append((grpc_key("ModelReady", request), OK_TRAILERS, message, True))
        return answers

    def model_gets(self, model: str, versions: list[str]) -> list[tuple[bytes, bytes, bytes, bool]]:
        """gRPC's calls before a client's inferences for `model`, by name ("") and by each of `versions`, answered as
        the gRPC port answers them (for a model unloaded since, what the port says of it)."""
        answers: list[tuple[bytes, bytes, bytes, bool]] = []
        for version in versions:
            try:
                served = self.service.model(model, version or None)
                asked: dict[str, Message] = {
                    "ModelMetadata": metadata_response(self.service, served),
                    "ModelConfig": config_response(self.service, served),
                    "ModelReady": pb.ModelReadyResponse(ready=served.readiness()[0]),
                }
                found = {method: (OK_TRAILERS, response.SerializeToString()) for method, response in asked.items()}
            except ServiceError as error:
                found = dict.fromkeys(("ModelMetadata", "ModelConfig"), (error_trailers(error)[0], b""))
                found["ModelReady"] = (OK_TRAILERS, b"")  # not ready, as the gRPC port says (model_ready)
            request = pb.ModelMetadataRequest(name=model, version=version).SerializeToString()
            for method, (trailers, message) in found.items():  # the three requests have the same fields
                answers.append((grpc_key(method, request), trailers, message, True))
        return answers
