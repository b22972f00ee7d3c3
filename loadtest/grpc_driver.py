"""The v2 form over gRPC, with grpc.aio: a ModelInfer call a request (`--client grpc`), or a request at
a time on ModelStreamInfer streams (`--client grpc-stream`, as perf_analyzer --streaming sends).

Each request's message is serialized once, before the run, and sent as bytes (grpcio passes bytes
through where a method has no serializer); answers are parsed only to check them. A process has at
most `connections` lanes, each a channel on a TCP connection of its own (a local subchannel pool:
channels with the same arguments would otherwise share one connection) carrying one request at a
time, lent last in, first out as the HTTP drivers lend connections: so a server's workers, which
share the port connection by connection, each get some (Triton's client shares one channel among up
to 6 of its contexts). A stream lane keeps its stream open between requests and opens a new one on
the same channel when it ended or failed.

The deadline is the client's own, as over HTTP (no gRPC deadline is sent, so the server does not
refuse work for it): past `timeout_s` a request is cancelled and counted `timeout`. A call or stream
that ends without an answer is a TransportFailure of kind grpc_<STATUS>, or grpc_stream_ended; a
request refused on a stream (its error_message) is checked as grpc_stream_error.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import grpc
from google.protobuf.message import DecodeError

from app.protocols.v2.proto import grpc_predict_v2_pb2 as pb
from loadtest.connections import LifoPool, TransportFailure
from loadtest.payloads import Payloads
from loadtest.worker import check_outputs

SERVICE = "/inference.GRPCInferenceService/"
# A channel's own connection; messages as large as the service takes (perf_analyzer's 32 FP32 images).
CHANNEL_OPTIONS = [
    ("grpc.use_local_subchannel_pool", 1),
    ("grpc.max_send_message_length", 64 * 2**20),
    ("grpc.max_receive_message_length", 64 * 2**20),
]


def infer_request(payloads: Payloads, j: int) -> bytes:
    """Body j of the v2 form as a serialized ModelInferRequest: its pixels as one UINT8 raw input."""
    shape = [payloads.images_per_request, *payloads.image_shape]
    tensor = pb.ModelInferRequest.InferInputTensor(name="input", datatype="UINT8", shape=shape)
    message = pb.ModelInferRequest(model_name=payloads.model, inputs=[tensor], raw_input_contents=[payloads.pixels[j]])
    return message.SerializeToString()


@dataclass
class Lane:
    """One channel (one connection), its ModelInfer, and for streams the stream open on it (None: none yet,
    or it ended)."""

    channel: grpc.aio.Channel
    infer: Any  # the channel's ModelInfer
    stream: Any = None


class GrpcDriver:
    """Sends the v2 form's requests to `base_url` (grpc://host:port) over at most `connections` lanes."""

    def __init__(
        self, base_url: str, payloads: Payloads, *, connections: int, timeout_s: float, stream: bool = False
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "grpc" or parts.hostname is None or parts.port is None:
            raise ValueError(f"the gRPC client takes grpc://host:port, got {base_url!r}")
        if payloads.form != "v2":
            raise ValueError(f"gRPC sends the v2 form (--form v2), not {payloads.form!r}")
        host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
        self.target, self.timeout_s, self.streams = f"{host}:{parts.port}", timeout_s, stream
        self.requests = [infer_request(payloads, j) for j in range(len(payloads.bodies))]
        self.lanes: LifoPool[Lane] = LifoPool(connections, self._open, timeout_s)
        self.stale_retries = 0  # no keep-alive race to retry: a channel reconnects by itself

    async def _open(self) -> Lane:
        channel = grpc.aio.insecure_channel(self.target, options=CHANNEL_OPTIONS)
        return Lane(channel, channel.unary_unary(SERVICE + "ModelInfer"))

    @property
    def connection_waits(self) -> int:
        return self.lanes.waits

    async def send(self, j: int) -> tuple[int, bytes]:
        """(200, the answer's serialized message): a ModelInferResponse, or on a stream a ModelStreamInferResponse."""
        lane = await self.lanes.take()
        try:
            async with asyncio.timeout(self.timeout_s):
                answer = await (self._on_stream(lane, self.requests[j]) if self.streams else self._call(lane, j))
        except TimeoutError:
            self._drop_stream(lane)  # its answer may still come: the stream cannot carry the next request
            raise TransportFailure("timeout", f"no answer within {self.timeout_s:g} s") from None
        except grpc.aio.AioRpcError as error:
            self._drop_stream(lane)
            raise TransportFailure(f"grpc_{error.code().name}", error.details() or "") from None
        except (asyncio.InvalidStateError, grpc.aio.UsageError) as error:  # the stream had ended meanwhile
            self._drop_stream(lane)
            raise TransportFailure("grpc_stream_ended", f"the stream had ended: {error}") from None
        finally:
            self.lanes.give_back(lane)
        return 200, answer

    async def _call(self, lane: Lane, j: int) -> bytes:
        answer: bytes = await lane.infer(self.requests[j])
        return answer

    async def _on_stream(self, lane: Lane, request: bytes) -> bytes:
        if lane.stream is None or lane.stream.done():  # none yet, or the server ended it (its connection's age)
            lane.stream = lane.channel.stream_stream(SERVICE + "ModelStreamInfer")()
        await lane.stream.write(request)
        answer = await lane.stream.read()
        if answer is grpc.aio.EOF:
            self._drop_stream(lane)
            raise TransportFailure("grpc_stream_ended", "the server ended the stream without an answer")
        return bytes(answer)

    @staticmethod
    def _drop_stream(lane: Lane) -> None:
        if lane.stream is not None:
            lane.stream.cancel()
            lane.stream = None

    async def aclose(self) -> None:
        for lane in self.lanes.opened:
            self._drop_stream(lane)
            await lane.channel.close()


def check_grpc_answer(
    status: int, body: bytes, expected: tuple[int, ...] | None, n_images: int
) -> tuple[str | None, str, dict[str, Any] | None]:
    """check_answer for a ModelInferResponse: its `probabilities` output (raw float32) against the labels."""
    try:
        response = pb.ModelInferResponse.FromString(body)
    except DecodeError as error:
        return "bad_response", f"not a ModelInferResponse: {error}", None
    return _check(response, expected, n_images)


def check_grpc_stream_answer(
    status: int, body: bytes, expected: tuple[int, ...] | None, n_images: int
) -> tuple[str | None, str, dict[str, Any] | None]:
    """check_answer for a ModelStreamInferResponse: its error_message, or its answer as a call's."""
    try:
        answer = pb.ModelStreamInferResponse.FromString(body)
    except DecodeError as error:
        return "bad_response", f"not a ModelStreamInferResponse: {error}", None
    if answer.error_message:
        return "grpc_stream_error", answer.error_message, None
    return _check(answer.infer_response, expected, n_images)


def _check(
    response: Any, expected: tuple[int, ...] | None, n_images: int
) -> tuple[str | None, str, dict[str, Any] | None]:
    names = [output.name for output in response.outputs]
    return check_outputs(names, list(response.raw_output_contents), response.model_name, expected, n_images)
