"""The Open Inference Protocol over gRPC (GRPCInferenceService), in the server's own process.

It runs on the same event loop as the HTTP server and submits to the same batchers, so both
protocols share engines, graphs, limits and metrics (protocol "grpc"). Beside it: the standard
gRPC health service (SERVING once every model is ready) and server reflection. ModelInfer answers
one call; ModelStreamInfer (Triton's streaming extension) answers every request a stream carries,
so a client that keeps many in flight on one stream pays grpcio's cost of a call once, not per
request (`bench/grpc_cost.py` measures both). A client's deadline bounds the wait for its answer;
a call the client cancels, or whose deadline passes, is counted as CANCELLED or DEADLINE_EXCEEDED.
Messages may be as large as CGSERVE_MAX_BODY_BYTES or a served model's max_batch_size of FP32
images, whichever is larger, as HTTP's v2 infer bodies (app/protocols/v2/batch_limits.py).
Connections are bounded as HTTP's are (`connection_options`): their number, their streams, how long one may sit idle
(CGSERVE_KEEPALIVE_TIMEOUT_S, as an idle HTTP keep-alive) and its age.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
from grpc_health.v1 import health, health_pb2
from grpc_reflection.v1alpha import reflection, reflection_pb2

from app.access.grpc_interceptor import ended_by_client, server_interceptors
from app.codecs.uploads import Images, upload_images
from app.config import Settings
from app.dataplane import DataPlane
from app.errors import (
    ClientClosedError,
    DeadlineExceededError,
    InputError,
    NotReadyError,
    ServiceError,
    UnknownModelError,
    quoted,
)
from app.model_control import IGNORED_LOAD_PARAMETERS, LOAD_EXPECTED, ControlError, RepositoryControl
from app.ops.connection_budgets import connection_budgets
from app.ops.off_loop import LARGE_JSON_BYTES, off_loop, off_loop_in_turn
from app.protocols.v2 import tensors
from app.protocols.v2.grpc_methods import SERVICE, Unparsed, add_service
from app.protocols.v2.grpc_reads import CALL_STARTED
from app.protocols.v2.proto import grpc_predict_v2_pb2 as pb
from app.protocols.v2.proto import grpc_predict_v2_pb2_grpc as pb_grpc
from app.protocols.v2.stream_answers import ConnectionBudgets, StreamStopped, answer_stream
from app.protocols.v2.unsupported import UnsupportedMethods
from app.repository.model_spec import ModelSpec
from app.service import ServedModel, Service

log = logging.getLogger(__name__)

SERVICE_NAME = SERVICE.full_name
# The service's HTTP statuses as gRPC codes.
STATUS_CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    404: grpc.StatusCode.NOT_FOUND,
    413: grpc.StatusCode.INVALID_ARGUMENT,
    415: grpc.StatusCode.INVALID_ARGUMENT,
    422: grpc.StatusCode.INVALID_ARGUMENT,
    503: grpc.StatusCode.UNAVAILABLE,  # model control off: Triton's UNAVAILABLE too
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}
# Health's Watch reports readiness as last polled: a draining or broken server tells gRPC's client-side health
# checking within this (Check reads readiness itself). A poll is a few attribute reads and one glob of the workers'
# ready markers.
HEALTH_POLL_S = 0.25
# A connection is closed (GOAWAY, then its calls' grace) after this long, so that clients rebalance
# across replicas and nothing holds a descriptor for ever.
MAX_CONNECTION_AGE_S = 30 * 60
MAX_STREAMS = 256  # concurrent calls on one connection; a client queues more until some end
# A connection's streamed rows in flight, as a share of a model's queue (CGSERVE_QUEUE_LIMIT): the rest is left to
# other clients.
STREAM_QUEUE_SHARE = 4
STOPPED = (
    "the server is stopping: it answered the requests of this stream it held; send again every request "
    "that has no answer (to another server, or this one once it is back)"
)
# Triton's streaming parameters: a request that sets the first true is told which answer is its last.
FINAL_RESPONSE_ASKED, FINAL_RESPONSE = "triton_enable_empty_final_response", "triton_final_response"


@dataclass(frozen=True, slots=True)
class Abort:
    """A refused or failed call: aborted with this code and text."""

    code: grpc.StatusCode
    text: str


class GrpcCodec:
    """ModelInfer for the data plane: one call's ModelInferRequest in, its ModelInferResponse (or Abort) out."""

    protocol = "grpc"

    def __init__(self, service: Service, context: Any) -> None:
        self.service, self.context = service, context

    def served(self, model: str, version: str | None) -> ServedModel:
        return self.service.model(model, version or None)

    async def decode(self, request: Any, spec: ModelSpec) -> tuple[Images, tuple[tuple[tensors.Wanted, ...], str]]:
        """(k, C, H, W) images, and the outputs asked for (each with its top-k, 0: the values) with the call's
        id: the whole call, checked."""
        asked = asked_outputs(request, spec), tensors.checked_id(request.id)
        settings = self.service.settings
        raw = _raw_contents(request)
        if _payload_bytes(request, raw) < LARGE_JSON_BYTES:  # as the REST path: large decodes off the loop
            images = input_images(request, raw, spec, settings.max_instances)
        else:  # typed contents (repeated numbers) in turn with the other large decodes; raw bytes are a view
            decode = off_loop if raw is not None else off_loop_in_turn
            images = await decode(input_images, request, raw, spec, settings.max_instances)
        if isinstance(images, list):  # encoded images: the uploads' decoder, on the GPU where it can be
            pixels = spec.max_image_pixels(settings.max_image_pixels)
            gpu = self.service.jpeg_decoder
            return await upload_images(images, max_pixels=pixels, spec=spec, gpu=gpu), asked
        return images, asked

    def encode(
        self, scores: np.ndarray, asked: tuple[tuple[tensors.Wanted, ...], str], served: ServedModel, engine: str
    ) -> Any:
        wanted, request_id = asked
        return infer_response(request_id, served, scores, wanted)

    def failure(self, error: ServiceError) -> tuple[Any, str]:
        code = STATUS_CODES.get(error.status, grpc.StatusCode.INTERNAL)
        return Abort(code, error.text()), code.name

    def cancelled(self) -> tuple[str, str]:
        """grpc.aio cancels the handler when the client cancels the call or its deadline passes: nobody is
        left to answer, and it is not an OK."""
        code = ended_by_client(self.context)
        reason = DeadlineExceededError.reason if code is grpc.StatusCode.DEADLINE_EXCEEDED else ClientClosedError.reason
        return code.name, reason


class StreamCodec(GrpcCodec):
    """One request on a ModelStreamInfer stream: answered, or refused, with a ModelStreamInferResponse; a
    refusal is an error_message on the stream, which goes on (as Triton's does), not the call's status."""

    def __init__(self, service: Service, context: Any, request: Any) -> None:
        super().__init__(service, context)
        self.request = request

    def encode(
        self, scores: np.ndarray, asked: tuple[tuple[tensors.Wanted, ...], str], served: ServedModel, engine: str
    ) -> Any:
        return self._streamed(super().encode(scores, asked, served, engine))

    def failure(self, error: ServiceError) -> tuple[Any, str]:
        abort, status = super().failure(error)
        request = self.request  # the refused request's model and id, for the client to pair the answer with
        which = pb.ModelInferResponse(
            model_name=request.model_name, model_version=request.model_version, id=tensors.echoable_id(request.id)
        )
        return self._streamed(which, error_message=abort.text), status

    def _streamed(self, response: Any, error_message: str = "") -> Any:
        """`response` on the stream. Each request has one answer, so it is its last: marked so where the request
        asks for Triton's final-response flag (tritonclient's enable_empty_final_response), whose clients
        otherwise wait for a last answer that never comes."""
        asked = self.request.parameters.get(FINAL_RESPONSE_ASKED)
        if asked is not None and asked.bool_param:
            response.parameters[FINAL_RESPONSE].bool_param = True
        return pb.ModelStreamInferResponse(error_message=error_message, infer_response=response)


class InferenceServicer(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(self, plane: DataPlane, control: RepositoryControl) -> None:
        self.plane = plane
        self.service = plane.service
        self.control = control
        self.stopping = asyncio.Event()  # set as the server stops: every stream stops reading
        # A connection's streams share rows in flight: a quarter of a model's queue (CGSERVE_QUEUE_LIMIT).
        self.stream_rows = ConnectionBudgets(max(1, self.service.settings.queue_limit // STREAM_QUEUE_SHARE))

    async def ServerLive(self, request: Any, context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Any) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.service.readiness()[0])

    async def ModelReady(self, request: Any, context: Any) -> pb.ModelReadyResponse:
        return pb.ModelReadyResponse(ready=model_ready(self.service, request.name, request.version or None))

    async def ServerMetadata(self, request: Any, context: Any) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(**tensors.server_metadata())

    async def ModelMetadata(self, request: Any, context: Any) -> pb.ModelMetadataResponse:
        return metadata_response(self.service, await self._model(request.name, request.version, context))

    async def ModelConfig(self, request: Any, context: Any) -> pb.ModelConfigResponse:
        return config_response(self.service, await self._model(request.name, request.version, context))

    async def ModelInfer(self, request: Any, context: Any) -> pb.ModelInferResponse:
        answer = await self._infer(GrpcCodec(self.service, context), request, context, "ModelInfer")
        if isinstance(answer, Abort):
            await context.abort(answer.code, answer.text)
        response: pb.ModelInferResponse = answer
        return response

    async def ModelStreamInfer(self, requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
        """Every request the stream carries, answered on it as soon as its batch is done: in that order, not
        the order they came in (each answer holds its request's `id`), so that one stream keeps many in
        flight; at most MAX_STREAMS held, as on a connection of single calls, and the connection's streams together
        at most a quarter of a model's queue in rows (app/protocols/v2/stream_answers.py): past either a stream
        waits for answers, and is not refused.
        As the server stops, a stream answers the requests it holds and ends UNAVAILABLE, saying so."""

        async def answer(request: Any) -> Any:
            if isinstance(request, Unparsed):  # this message only: the stream goes on
                return pb.ModelStreamInferResponse(error_message=request.text())
            return await self._infer(StreamCodec(self.service, context, request), request, context, "ModelStreamInfer")

        # An async generator itself, as grpc.aio requires of an async stream handler; closed with it.
        try:
            with self.stream_rows.of(context.peer()) as budget:  # the peer's address and port: its connection
                stream = answer_stream(requests, answer, MAX_STREAMS, self.stopping, rows=_rows, row_budget=budget)
                async with contextlib.aclosing(stream) as answers:
                    async for response in answers:
                        yield response
        except StreamStopped:  # what it held is answered; the client sends the rest again, elsewhere
            await context.abort(grpc.StatusCode.UNAVAILABLE, STOPPED)

    async def _infer(self, codec: GrpcCodec, request: Any, context: Any, path: str) -> Any:
        """One ModelInferRequest through the data plane: `codec`'s answer or refusal."""
        # The end to end: the service's timeout from the call's start (its message's arrival counted, as an HTTP
        # body's is; a stream's request from now), or less if the client's gRPC deadline is nearer.
        now, timeout_s = time.monotonic(), self.service.settings.request_timeout_s
        started = CALL_STARTED.get() or now
        remaining = context.time_remaining()
        deadline = started + timeout_s if remaining is None else min(started + timeout_s, now + remaining)

        async def read() -> Any:
            return request  # the whole message is here already

        return await self.plane.infer(
            codec,
            read,
            model=request.model_name,
            version=request.model_version or None,
            form="raw" if request.raw_input_contents else "typed",
            deadline=deadline,
            path=path,
        )

    # Triton's model repository extension (app/model_control.py); admin tokens where they are set.

    async def RepositoryIndex(self, request: Any, context: Any) -> pb.RepositoryIndexResponse:
        entries = await self.control.index(ready_only=request.ready)
        return pb.RepositoryIndexResponse(models=[pb.RepositoryIndexResponse.ModelIndex(**e) for e in entries])

    async def RepositoryModelLoad(self, request: Any, context: Any) -> pb.RepositoryModelLoadResponse:
        await self._control(self.control.load, request, context)
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(self, request: Any, context: Any) -> pb.RepositoryModelUnloadResponse:
        await self._control(self.control.unload, request, context)
        return pb.RepositoryModelUnloadResponse()

    async def _control(self, operation: Callable[[str], Awaitable[None]], request: Any, context: Any) -> None:
        try:
            unsupported = sorted(key for key in request.parameters if key not in IGNORED_LOAD_PARAMETERS)
            if unsupported:
                raise ControlError(400, f"load parameters {unsupported} are not supported", expected=LOAD_EXPECTED)
            await operation(request.model_name)
        except ServiceError as error:  # what to do instead too, as the HTTP port says it
            await context.abort(STATUS_CODES.get(error.status, grpc.StatusCode.INTERNAL), error.text())

    async def _model(self, name: str, version: str, context: Any) -> ServedModel:
        try:
            return GrpcCodec(self.service, context).served(name, version or None)
        except ServiceError as error:
            await context.abort(STATUS_CODES.get(error.status, grpc.StatusCode.INTERNAL), error.text())
            raise


def model_ready(service: Service, name: str, version: str | None) -> bool:
    """Whether (name, version) is served and ready. A model or version the service does not serve (never loaded,
    unloaded, retired) is not ready rather than an error, as Triton answers it: a client polling for a load or an
    unload gets false, not NOT_FOUND. So is any while the service starts."""
    try:
        served = service.model(name, version)
    except (UnknownModelError, NotReadyError):
        return False
    return served.readiness()[0]


def metadata_response(service: Service, served: ServedModel) -> pb.ModelMetadataResponse:
    versions = sorted(service.versions[served.spec.name], key=int)
    platform = tensors.platform(served.options.engine)
    return pb.ModelMetadataResponse(**tensors.model_metadata(served.spec, platform, versions))


def config_response(service: Service, served: ServedModel) -> pb.ModelConfigResponse:
    config = tensors.model_config(served.spec, served.options, service.settings.max_instances)
    return pb.ModelConfigResponse(config=pb.ModelConfig(**config))


def _rows(request: Any) -> int:
    """The images a stream's request carries, as its first input's shape says (1 where it says nothing usable:
    such a request is refused by its decode, not weighed)."""
    if isinstance(request, Unparsed) or not request.inputs or not request.inputs[0].shape:
        return 1
    return max(1, int(request.inputs[0].shape[0]))


def _raw_contents(request: Any) -> bytes | None:
    """The one raw tensor's bytes, or None (no raw contents, or more than one: `input_images` refuses those). Taken
    once: each read of a bytes field copies it out of the message (upb), 150 KB for one ResNet-50 image."""
    contents = request.raw_input_contents
    return contents[0] if len(contents) == 1 else None


def _payload_bytes(request: Any, raw: bytes | None) -> int:
    """The input's bytes, as decoded: raw contents, or 4 bytes an element of typed contents."""
    if raw is not None:
        return len(raw)
    return sum(4 * (len(t.contents.fp32_contents) + len(t.contents.uint_contents)) for t in request.inputs)


def connection_options(settings: Settings) -> list[tuple[str, int]]:
    """gRPC's connection limits, from the HTTP ones: 1,000 idle connections (a preface each) held
    1,023 of 1,024 descriptors. The cap is gRPC's share of the process's descriptors
    (app/ops/connection_budgets.py): CGSERVE_MAX_CONNECTIONS, or a quarter of the open-file budget."""
    grace_s = settings.request_timeout_s + 1  # a call that started before the GOAWAY gets its whole timeout
    return [
        ("grpc.max_allowed_incoming_connections", connection_budgets(settings).grpc),
        ("grpc.max_concurrent_streams", MAX_STREAMS),
        ("grpc.max_connection_idle_ms", round(settings.keepalive_timeout_s * 1000)),
        ("grpc.max_connection_age_ms", MAX_CONNECTION_AGE_S * 1000),
        ("grpc.max_connection_age_grace_ms", round(grace_s * 1000)),
    ]


# InferTensorContents' field of each datatype taken (decode_input refuses the others)
CONTENTS = {"FP32": "fp32_contents", "UINT8": "uint_contents", "BYTES": "bytes_contents"}


def input_images(request: Any, raw: bytes | None, spec: ModelSpec, max_instances: int) -> np.ndarray | list[bytes]:
    """The request's one input (`raw`: its raw contents, `_raw_contents`) as images, or encoded images."""
    if len(request.inputs) != 1:
        raise InputError(f"the request has {len(request.inputs)} inputs", expected=tensors.expected(spec))
    tensor = request.inputs[0]
    tensors.refuse_shared_memory(tensor.parameters, "the input")
    if request.raw_input_contents:  # one raw tensor an input, in place of its contents (Triton refuses either mix)
        if raw is None:
            raise InputError(
                f"raw_input_contents holds {len(request.raw_input_contents)} tensors for 1 input",
                expected="one raw_input_contents entry an input, or typed contents and no raw_input_contents",
            )
        if tensor.HasField("contents"):
            raise InputError(
                "the input has both contents and raw_input_contents",
                expected="its data in one of them: raw_input_contents, or contents and no raw_input_contents",
            )
    own = CONTENTS.get(tensor.datatype)
    stray = [field.name for field, _ in tensor.contents.ListFields() if field.name != own] if own else []
    if stray:  # Triton refuses them too: which values would be the input's?
        raise InputError(f"the {tensor.datatype} input carries {', '.join(stray)} beside {own}",
                         expected=f"its values in {own} alone")  # fmt: skip
    if tensor.datatype == "BYTES":  # encoded images, decoded as uploads are
        if raw is not None:
            elements = tensors.length_prefixed(raw, most=max_instances)
        else:
            elements = list(tensor.contents.bytes_contents)
        shape = list(tensor.shape)
        return tensors.encoded_images(
            spec, name=tensor.name, shape=shape, elements=elements, max_instances=max_instances
        )
    if raw is not None:
        data = tensors.binary_elements(tensor.datatype, raw)
    elif tensor.datatype == "FP32":
        data = np.asarray(tensor.contents.fp32_contents, dtype=np.float32)
    else:
        contents = np.asarray(tensor.contents.uint_contents, dtype=np.uint32)
        if contents.size and contents.max() > 255:
            raise InputError("UINT8 contents above 255", expected=tensors.expected(spec))
        data = contents.astype(np.uint8)
    return tensors.decode_input(
        spec,
        name=tensor.name,
        datatype=tensor.datatype,
        shape=list(tensor.shape),
        data=data,
        max_instances=max_instances,
    )


def _value(parameter: Any) -> object:
    """An InferParameter's value (None where none of its kinds is set)."""
    kind = parameter.WhichOneof("parameter_choice")
    return getattr(parameter, kind) if kind else None


def asked_outputs(request: Any, spec: ModelSpec) -> tuple[tensors.Wanted, ...]:
    """The outputs the call names, each with its top-k (0: the values), every output where it names none;
    InputError for an unknown output, a repeated one (200,000 repeats made an answer of as many copies), a
    malformed count or a classification of what is not class scores."""
    parameters = ((key, _value(parameter)) for key, parameter in request.parameters.items())
    tensors.check_request_parameters(parameters, reserved_allowed=FINAL_RESPONSE_ASKED)  # a stream's, read there
    names: list[object] = [output.name for output in request.outputs]
    seen: set[str] = set()
    wanted = []
    for output in request.outputs:
        found = tensors.wanted_output(spec, output.name, names, seen)
        tensors.refuse_shared_memory(output.parameters, f'the output "{found.name}"')
        count = 0
        if "classification" in output.parameters:
            parameter = output.parameters["classification"]
            kind = parameter.WhichOneof("parameter_choice")
            count = getattr(parameter, kind) if kind in ("int64_param", "uint64_param") else -1
            if count < 0:
                value = getattr(parameter, kind) if kind else None
                raise InputError(
                    f"the parameter classification is {str(value)[:60]!r} ({kind})",
                    expected="int64_param: a whole number of classes to answer, most probable first "
                    "(0: the probabilities)",
                )
        wanted.append(tensors.Wanted(found.name, tensors.check_classification(spec, found, int(count)), True))
    return tuple(wanted) or tuple(tensors.Wanted(name, 0, True) for name in spec.layout.names)


def infer_response(
    request_id: str, served: ServedModel, probabilities: np.ndarray, wanted: tuple[tensors.Wanted, ...]
) -> pb.ModelInferResponse:
    spec = served.spec
    response = pb.ModelInferResponse(model_name=spec.name, model_version=spec.version, id=request_id)
    for want, output, values in tensors.answer_tensors(spec, probabilities, wanted):
        tensor = response.outputs.add(name=output.name, datatype=tensors.datatype_of(want, output), shape=values.shape)
        if output.classes:  # what the scores are: softmax probabilities, sigmoid per class, or the model's own
            tensor.parameters["postprocess"].string_param = spec.config.postprocess
        response.raw_output_contents.append(tensors.raw_bytes(want, output, values))
    return response


class HealthServicer(health.aio.HealthServicer):  # type: ignore[misc]
    """grpc.health.v1: Check answers from the service's readiness at that moment; Watch streams
    what the watcher task last set (see GrpcServer._report_health)."""

    def __init__(self, service: Service) -> None:
        super().__init__()
        self._service = service

    async def Check(self, request: Any, context: Any) -> health_pb2.HealthCheckResponse:
        if request.service not in ("", SERVICE_NAME):
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no service named {quoted(request.service)}")
        ready = self._service.readiness()[0]
        serving = health_pb2.HealthCheckResponse.SERVING if ready else health_pb2.HealthCheckResponse.NOT_SERVING
        return health_pb2.HealthCheckResponse(status=serving)


def server_credentials(settings: Settings) -> grpc.ServerCredentials | None:
    """TLS credentials from the settings' PEM files (checked readable at start-up), or None: plain gRPC.
    With a client CA, a client must present a certificate it signed (mutual TLS), as over HTTP."""
    if settings.tls_cert_file is None or settings.tls_key_file is None:
        return None
    pair = (settings.tls_key_file.read_bytes(), settings.tls_cert_file.read_bytes())
    client_ca = settings.tls_client_ca_file.read_bytes() if settings.tls_client_ca_file else None
    return grpc.ssl_server_credentials([pair], root_certificates=client_ca, require_client_auth=client_ca is not None)


class GrpcServer:
    """The gRPC server and its health service, started and stopped with the HTTP app."""

    def __init__(self, plane: DataPlane, control: RepositoryControl, settings: Settings, *, message_limit: int,
                 reuse_port: bool) -> None:  # fmt: skip
        """`message_limit`: the largest message taken in, HTTP's v2 infer body limit (batch_limits.py)."""
        service = plane.service
        options = [
            ("grpc.max_receive_message_length", message_limit),
            ("grpc.max_send_message_length", max(message_limit, 64 * 2**20)),
            ("grpc.so_reuseport", 1 if reuse_port else 0),  # workers share the port; one process owns it
            *connection_options(settings),
        ]
        self.server = grpc.aio.server(options=options, interceptors=server_interceptors(settings))
        self.health = HealthServicer(service)
        self.inference = InferenceServicer(plane, control)
        health_service = health_pb2.DESCRIPTOR.services_by_name["Health"]
        reflection_service = reflection_pb2.DESCRIPTOR.services_by_name["ServerReflection"]
        # A call's one message comes within the service's timeout, as an HTTP request's body counts in its own.
        within_s = settings.request_timeout_s
        streams = ("ModelStreamInfer",)
        add_service(self.inference, self.server, SERVICE, read_within_s=within_s, answers_unparsed=streams)
        add_service(self.health, self.server, health_service, read_within_s=within_s)
        names = (SERVICE_NAME, health_service.full_name, reflection_service.full_name)
        add_service(reflection.aio.ReflectionServicer(names), self.server, reflection_service, read_within_s=within_s)
        self.server.add_generic_rpc_handlers((UnsupportedMethods(SERVICE),))
        self.address = f"{settings.host}:{settings.grpc_port}"
        credentials = server_credentials(settings)
        if credentials is None:
            bound = self.server.add_insecure_port(self.address)
        else:
            bound = self.server.add_secure_port(self.address, credentials)
        if bound == 0:
            raise RuntimeError(f"gRPC cannot listen on {self.address}")
        self.security = (
            "" if credentials is None else " with mutual TLS" if settings.tls_client_ca_file else " with TLS"
        )
        self._service = service
        self._watch: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.server.start()
        self._watch = asyncio.create_task(self._report_health(), name="grpc-health")
        log.info("gRPC (Open Inference Protocol) on %s%s", self.address, self.security)

    async def stop(self, grace_s: float = 5.0) -> None:
        """New calls are refused; calls in flight get `grace_s`; streams stop reading, answer the requests they
        hold and end UNAVAILABLE, so that none is cut with requests in flight when the grace ends."""
        self.inference.stopping.set()
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        log.info("gRPC stopping: streams answer the requests they hold, then end; new calls are refused")
        await self.server.stop(grace_s)

    async def _report_health(self) -> None:
        """SERVING exactly while the whole service is ready (a broken device turns it off)."""
        serving = health_pb2.HealthCheckResponse.SERVING
        not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
        while True:
            status = serving if self._service.readiness()[0] else not_serving
            for name in ("", SERVICE_NAME):
                await self.health.set(name, status)
            await asyncio.sleep(HEALTH_POLL_S)
