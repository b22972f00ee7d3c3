"""Every gRPC service the server hosts, registered with each request parsed here.

The generated registrations (grpc_predict_v2_pb2_grpc.add_…_to_server, the health and reflection
packages' own) hand grpcio the messages' FromString, and bytes that are not the method's message then
end the call UNKNOWN, "Unexpected <class 'google.protobuf.message.DecodeError'>", before any code of
ours runs, and grpcio logs an ERROR traceback for each: any client could fill the log. Parsed here
instead, they reach the method as `Unparsed`: a call ends INVALID_ARGUMENT saying what was expected,
logged by no one, except on a stream that answers such a message itself and goes on (ModelStreamInfer,
whose answers carry an error_message). Registered as the generated code registers, by exact method path
and as a generic handler.

A method of one request is registered as one that reads a stream of them (the same bytes on the wire: a unary call
is a stream of one message), so that its one message is awaited within a bound (grpc_reads.py). grpcio's unary
handlers wait for it for ever, and a call that ended without one was never answered: a client held a connection (and
a share of the server's connections) with a call that sent headers alone, or a message that never ended.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message import DecodeError
from google.protobuf.message_factory import GetMessageClass

from app.protocols.v2.grpc_reads import reading_one
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
    """A method of one request that never sees Unparsed: the call ends INVALID_ARGUMENT instead. (Its answer, or
    the answers it writes with context.write, as health's Watch does.)"""

    async def call(request: Any, context: Any) -> Any:
        if isinstance(request, Unparsed):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.text())
        return await method(request, context)

    return call


def refusing_unparsed_requests(
    method: Callable[[AsyncIterator[Any], Any], AsyncIterator[Any]],
) -> Callable[[AsyncIterator[Any], Any], AsyncIterator[Any]]:
    """A method that reads a stream of requests (reflection's) never sees Unparsed: the call ends INVALID_ARGUMENT
    at the first."""

    async def call(requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
        async def parsed() -> AsyncIterator[Any]:
            async for request in requests:
                if isinstance(request, Unparsed):
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.text())
                yield request

        async for answer in method(parsed(), context):
            yield answer

    return call


def add_service(
    servicer: Any,
    server: grpc.aio.Server,
    service: ServiceDescriptor,
    *,
    read_within_s: float,
    answers_unparsed: Collection[str] = (),
) -> None:
    """Every method of `service` on `servicer`, as the generated add_…_to_server would, each request parsed here;
    a method of one request waits at most `read_within_s` for it; the streams named in `answers_unparsed` get each
    Unparsed message to answer themselves."""
    handlers = {}
    for method in service.methods:
        request, response = GetMessageClass(method.input_type), GetMessageClass(method.output_type)
        behavior = getattr(servicer, method.name)
        if method.client_streaming and method.server_streaming:
            make = grpc.stream_stream_rpc_method_handler
            behavior = behavior if method.name in answers_unparsed else refusing_unparsed_requests(behavior)
        else:  # one request (none of the hosted services streams requests for one answer)
            assert not method.client_streaming, method.name
            # A stream of answers written with context.write (health's Watch), not yielded: awaited as a call is.
            assert not (method.server_streaming and inspect.isasyncgenfunction(behavior)), method.name
            # Read as a stream of one (the module's docstring says why); a stream of answers written with
            # context.write, as a coroutine: grpc.aio's reader/writer form of a stream handler.
            streams = method.server_streaming
            make = grpc.stream_stream_rpc_method_handler if streams else grpc.stream_unary_rpc_method_handler
            behavior = reading_one(refusing_unparsed(behavior), read_within_s, method.input_type.full_name)
        handlers[method.name] = make(
            behavior, request_deserializer=parser(request), response_serializer=response.SerializeToString
        )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, handlers),))
    server.add_registered_method_handlers(service.full_name, handlers)
