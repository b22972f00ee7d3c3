"""GRPCInferenceService's methods registered with the server, each request parsed here.

The generated registration (grpc_predict_v2_pb2_grpc.add_…_to_server) hands grpcio the messages'
FromString, and bytes that are not the method's message then end the call UNKNOWN, "Unexpected
<class 'google.protobuf.message.DecodeError'>", before any code of ours runs. Parsed here instead,
they reach the method as `Unparsed`: a unary call ends INVALID_ARGUMENT saying what was expected,
and a stream answers that one message with an error_message and goes on (ModelStreamInfer checks).
Registered as the generated code registers, by exact method path and as a generic handler.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from app.protocols.v2.proto import grpc_predict_v2_pb2 as pb

SERVICE = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]


@dataclass(frozen=True, slots=True)
class Unparsed:
    """A request's bytes that did not parse as its method's message."""

    expected: str  # the message's full name, inference.ModelInferRequest

    def text(self) -> str:
        return f"the request's bytes do not parse as a protobuf {self.expected}: expected that message, serialized"


def parser(message: Any) -> Callable[[bytes], Any]:
    """`message`'s FromString, or Unparsed where the bytes are not one."""
    parse, name = message.FromString, message.DESCRIPTOR.full_name

    def parsed(data: bytes) -> Any:
        try:
            return parse(data)
        except DecodeError:  # its words, "Error parsing message with type …", say no more than Unparsed's
            return Unparsed(name)

    return parsed


def refusing_unparsed(method: Callable[[Any, Any], Awaitable[Any]]) -> Callable[[Any, Any], Awaitable[Any]]:
    async def call(request: Any, context: Any) -> Any:
        if isinstance(request, Unparsed):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.text())
        return await method(request, context)

    return call


def add_inference_service(servicer: Any, server: grpc.aio.Server) -> None:
    """Every method of the service on `servicer`, as the generated add_…_to_server would, parsed here."""
    handlers = {}
    for method in SERVICE.methods:
        request, response = getattr(pb, method.input_type.name), getattr(pb, method.output_type.name)
        behavior = getattr(servicer, method.name)
        if method.client_streaming:  # ModelStreamInfer: each message may be Unparsed, answered in the stream
            assert method.server_streaming, method.name
            make, behavior = grpc.stream_stream_rpc_method_handler, behavior
        else:
            assert not method.server_streaming, method.name
            make, behavior = grpc.unary_unary_rpc_method_handler, refusing_unparsed(behavior)
        handlers[method.name] = make(
            behavior, request_deserializer=parser(request), response_serializer=response.SerializeToString
        )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE.full_name, handlers),))
    server.add_registered_method_handlers(SERVICE.full_name, handlers)
