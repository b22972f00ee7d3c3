"""The v2 form over gRPC, with grpc.aio: a ModelInfer call a request (`--client grpc`), or a request at
a time on ModelStreamInfer streams (`--client grpc-stream`, as perf_analyzer --streaming sends).

Each request's message is serialized once, before the run, and sent as bytes (grpcio passes bytes
through where a method has no serializer); answers are parsed only to check them. The process opens
`connections` channels, each on a TCP connection of its own (a local subchannel pool: channels with
the same arguments would otherwise share one connection), so that a server's workers, which share
the port connection by connection, each get some; Triton's client shares one channel among up to 6
of its contexts. Calls go to the channels in turn; streams are opened on them in turn and lent last
in, first out, as the HTTP drivers lend connections. A call or stream that ends without an answer
is a TransportFailure of kind grpc_<STATUS> (an answer refused on a stream: grpc_stream_error).
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any
from urllib.parse import urlsplit

import grpc
import numpy as np
from google.protobuf.message import DecodeError

from app.protocols.v2.proto import grpc_predict_v2_pb2 as pb
from loadtest.connections import LifoPool, TransportFailure
from loadtest.payloads import Payloads

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


class GrpcDriver:
    """Sends the v2 form's requests to `base_url` (grpc://host:port) over `connections` channels."""

    def __init__(
        self, base_url: str, payloads: Payloads, *, connections: int, timeout_s: float, stream: bool = False
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "grpc" or parts.hostname is None or parts.port is None:
            raise ValueError(f"the gRPC client takes grpc://host:port, got {base_url!r}")
        if payloads.form != "v2":
            raise ValueError(f"gRPC sends the v2 form (--form v2), not {payloads.form!r}")
        target = f"[{parts.hostname}]:{parts.port}" if ":" in parts.hostname else f"{parts.hostname}:{parts.port}"
        self.timeout_s = timeout_s
        self.requests = [infer_request(payloads, j) for j in range(len(payloads.bodies))]
        self.channels = [grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS) for _ in range(connections)]
        self.calls = [channel.unary_unary(SERVICE + "ModelInfer") for channel in self.channels]
        self.turn = itertools.count()
        self.streams: LifoPool[Any] | None = None
        if stream:
            opens = [channel.stream_stream(SERVICE + "ModelStreamInfer") for channel in self.channels]

            async def open_stream() -> Any:
                return opens[next(self.turn) % len(opens)](timeout=None)

            self.streams = LifoPool(connections, open_stream, timeout_s)
        self.stale_retries = 0  # no keep-alive race to retry: gRPC reconnects by itself

    @property
    def connection_waits(self) -> int:
        return self.streams.waits if self.streams is not None else 0

    async def send(self, j: int) -> tuple[int, bytes]:
        """(200, the answer's serialized message): a ModelInferResponse, or on a stream a ModelStreamInferResponse."""
        if self.streams is not None:
            return 200, await self._on_stream(self.requests[j])
        call = self.calls[next(self.turn) % len(self.calls)]
        try:
            answer: bytes = await call(self.requests[j], timeout=self.timeout_s)
        except grpc.aio.AioRpcError as error:
            raise TransportFailure(f"grpc_{error.code().name}", error.details() or "") from None
        return 200, answer

    async def _on_stream(self, request: bytes) -> bytes:
        assert self.streams is not None
        stream = await self.streams.take()
        try:
            async with asyncio.timeout(self.timeout_s):
                await stream.write(request)
                answer = await stream.read()
        except TimeoutError:
            stream.cancel()  # its answer may still come: the stream cannot carry the next request
            self.streams.give_back(None)
            raise TransportFailure("timeout", f"no answer on the stream within {self.timeout_s:g} s") from None
        except grpc.aio.AioRpcError as error:
            self.streams.give_back(None)
            raise TransportFailure(f"grpc_{error.code().name}", error.details() or "") from None
        if answer is grpc.aio.EOF:
            self.streams.give_back(None)
            raise TransportFailure("grpc_stream_ended", "the server ended the stream without an answer")
        self.streams.give_back(stream)
        return bytes(answer)

    async def aclose(self) -> None:
        for channel in self.channels:
            await channel.close()


def check_grpc_answer(
    status: int, body: bytes, expected: tuple[int, ...] | None, n_images: int
) -> tuple[str | None, str, dict[str, Any] | None]:
    """check_answer for a ModelInferResponse: its `probabilities` output (raw float32) against the labels."""
    try:
        return _check(pb.ModelInferResponse.FromString(body), expected, n_images)
    except DecodeError as error:
        return "bad_response", f"not a ModelInferResponse: {error}", None


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
    from loadtest.worker import check_probabilities

    names = [output.name for output in response.outputs]
    if "probabilities" not in names or len(response.raw_output_contents) != len(names):
        return "bad_response", f"outputs {names} with {len(response.raw_output_contents)} raw contents", None
    raw = response.raw_output_contents[names.index("probabilities")]
    probabilities = np.frombuffer(raw, dtype="<f4")
    if probabilities.size != n_images * 10:
        return "bad_response", f"{probabilities.size} probabilities for {n_images} images", None
    return check_probabilities(probabilities.reshape(n_images, 10), expected, n_images, {"model": response.model_name})
