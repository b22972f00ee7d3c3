"""The Open Inference Protocol (KServe v2) over HTTP, beside our own routes, on the same port.

Health, server and model metadata, Triton's model configuration extension (what perf_analyzer
reads), and inference with JSON tensors or the binary tensor data extension
(`Inference-Header-Content-Length`: a JSON header, then each binary tensor's bytes in order).
Inference shares the batchers, limits, deadlines and metrics of POST /predict (protocol "v2").
Every error is the protocol's {"error": "…"} with its HTTP status. The whole request (its input
and what its answer should hold) is checked before its batch runs: a malformed one is a 400.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from app.codecs.bodies import writes_a_boolean
from app.codecs.uploads import Images, upload_images
from app.errors import ClientClosedError, InputError, ServiceError
from app.http.answer import HttpAnswer, HttpBody, error_answer, whole_body
from app.http.limits import deadline_of
from app.http.routes.probes import ServiceDep
from app.http.schemas import V2_NOT_FOUND, ReadyAnswer
from app.ops.off_loop import LARGE_JSON_BYTES, off_loop, off_loop_in_turn
from app.protocols.v2 import tensors
from app.protocols.v2.unsupported import HTTP_ROUTES, UnsupportedExtensionError
from app.repository.model_spec import ModelSpec
from app.service import ServedModel, Service

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v2", tags=["Open Inference Protocol (KServe v2)"])
HEADER_LENGTH = "inference-header-content-length"
JSON = "application/json"
MAX_LENGTH_DIGITS = 12  # Inference-Header-Content-Length: a terabyte; int() of 5,000 digits raises


@dataclass(frozen=True, slots=True)
class Asked:
    """What the answer holds, as the request asked it: checked before its batch runs."""

    id: str | None
    outputs: tuple[tensors.Wanted, ...]  # in the answer's order: those the request names, else every output


def v2_error(error: ServiceError) -> Response:
    """{"error": "…"} with the status Triton gives: 400 for a request whose content is invalid."""
    return error_answer(error, v2=True).response()


def served_model(service: Service, name: str, version: str | None) -> ServedModel:
    """The model's `version` (its newest ready one for None or ""); UnknownModelError (404) otherwise."""
    return service.model(name, version or None)


@router.get("", summary="Server metadata and the protocol extensions supported")
async def server_metadata() -> dict[str, Any]:
    return tensors.server_metadata()


@router.get("/health/live", summary="200 while the process answers")
async def live() -> dict[str, bool]:
    return {"live": True}


@router.get(
    "/health/ready",
    summary="200 once every model is ready, else 503",
    responses={503: {"description": "Starting, draining or a dead device", "model": ReadyAnswer}},
)
async def ready(service: ServiceDep) -> Response:
    is_ready = service.readiness()[0]
    return Response(orjson.dumps({"ready": is_ready}), status_code=200 if is_ready else 503, media_type=JSON)


def _refusing(extension: str) -> Callable[[], Awaitable[Response]]:
    async def refuse() -> Response:
        return v2_error(UnsupportedExtensionError(extension))

    return refuse


# Before /models/{name}: GET /v2/models/stats is Triton's statistics, not a model named "stats".
for _path, _extension in HTTP_ROUTES:
    router.add_api_route(_path, _refusing(_extension), methods=["GET", "POST"], include_in_schema=False)


@router.get("/models/{name}", summary="Model metadata: input and output tensors", responses=V2_NOT_FOUND)
@router.get("/models/{name}/versions/{version}", summary="Model metadata of one version", responses=V2_NOT_FOUND)
async def model_metadata(name: str, service: ServiceDep, version: str | None = None) -> Response:
    try:
        served = served_model(service, name, version)
    except ServiceError as error:
        return v2_error(error)
    return Response(metadata_body(service, served), media_type=JSON)


def metadata_body(service: Service, served: ServedModel) -> bytes:
    """GET /v2/models/{name}'s answer: the model's tensors and every version served now."""
    versions = sorted(service.versions[served.spec.name], key=int)
    platform = tensors.platform(served.options.engine)
    return orjson.dumps(tensors.model_metadata(served.spec, platform, versions))


def config_body(service: Service, served: ServedModel) -> bytes:
    """GET /v2/models/{name}/config's answer: Triton's model configuration (batch sizes, tensors)."""
    return orjson.dumps(tensors.model_config(served.spec, served.options, service.settings.max_instances))


READY_RESPONSES: dict[int | str, dict[str, Any]] = {
    **V2_NOT_FOUND,
    503: {"description": "The model is starting, draining or its device is dead", "model": ReadyAnswer},
}


@router.get("/models/{name}/ready", summary="200 once the model is ready, else 503", responses=READY_RESPONSES)
@router.get("/models/{name}/versions/{version}/ready", summary="Readiness of one version", responses=READY_RESPONSES)
async def model_ready(name: str, service: ServiceDep, version: str | None = None) -> Response:
    try:
        served = served_model(service, name, version)
    except ServiceError as error:
        return v2_error(error)
    is_ready = served.readiness()[0]
    return Response(orjson.dumps({"ready": is_ready}), status_code=200 if is_ready else 503, media_type=JSON)


@router.get(
    "/models/{name}/config",
    summary="Triton's model configuration extension (batch size, tensors)",
    responses=V2_NOT_FOUND,
)
@router.get(
    "/models/{name}/versions/{version}/config", summary="Model configuration of one version", responses=V2_NOT_FOUND
)
async def model_config(name: str, service: ServiceDep, version: str | None = None) -> Response:
    try:
        served = served_model(service, name, version)
    except ServiceError as error:
        return v2_error(error)
    return Response(config_body(service, served), media_type=JSON)


class V2Codec:
    """The Open Inference Protocol's infer over HTTP for the data plane: JSON tensors or the binary tensor
    extension in; probabilities or top-k classes (the classification extension) out."""

    protocol = "v2"

    def __init__(self, service: Service) -> None:
        self.service = service
        self.max_instances = service.settings.max_instances

    def served(self, model: str, version: str | None) -> ServedModel:
        return served_model(self.service, model, version)

    async def decode(self, request: HttpBody, spec: ModelSpec) -> tuple[Images, Asked]:
        parse = (request.body, request.header_length, spec, self.max_instances)
        if len(request.body) >= LARGE_JSON_BYTES:  # the binary form's tensors are views: only its JSON costs
            decode = off_loop if request.header_length is not None else off_loop_in_turn
            asked, images = await decode(parse_infer, *parse)
        else:
            asked, images = parse_infer(*parse)
        if isinstance(images, list):  # encoded images: the uploads' decoder, on the GPU where it can be
            pixels = spec.max_image_pixels(self.service.settings.max_image_pixels)
            gpu = self.service.jpeg_decoder
            return await upload_images(images, max_pixels=pixels, spec=spec, gpu=gpu), asked
        return images, asked

    def decode_now(self, request: HttpBody, spec: ModelSpec) -> tuple[np.ndarray, Asked] | None:
        """A small request checked and decoded here and now; None for encoded images (a BYTES input), which the
        async decode takes to the uploads' decoder, never Pillow on the loop (its JSON, at most DECODE_NOW_BYTES,
        is parsed again there: a rare form, base64 images in JSON, against a decode an image)."""
        asked, images = parse_infer(request.body, request.header_length, spec, self.max_instances)
        if isinstance(images, list):
            return None
        return images, asked

    def decode_cheaply(self, request: HttpBody, spec: ModelSpec) -> tuple[np.ndarray, Asked] | None:
        """A binary-extension request whose input is pixels or values (a view of the body: one 224×224
        UINT8 image is 150 KB behind ~100 bytes of JSON), here and now; None for JSON tensors and for
        encoded images (BYTES), which the async decode takes to the uploads' decoder. Its header is
        parsed here as the async decode would parse it on the loop too (the inline path's bodies are
        under LARGE_JSON_BYTES)."""
        length = request.header_length
        if length is None:
            return None
        document, binary, booleans = _split_body(request.body, length, spec)  # InputError: what the async decode says
        if _declares_bytes(document):
            return None
        images = _input(document, binary, spec, self.max_instances, booleans_written=booleans)
        assert not isinstance(images, list), "only a BYTES input gives encoded images, and it returned above"
        return images, asked_outputs(document, spec)

    def encode(self, scores: np.ndarray, asked: Asked, served: ServedModel, engine: str) -> HttpAnswer:
        content, header_length = infer_answer(asked, served.spec, scores)
        if header_length is None:
            return HttpAnswer(200, content)
        headers = [(HEADER_LENGTH.encode(), b"%d" % header_length), (b"content-type", b"application/octet-stream")]
        return HttpAnswer(200, content, headers)

    def failure(self, error: ServiceError) -> tuple[HttpAnswer, str]:
        answer = error_answer(error, v2=True)
        return answer, str(answer.status)

    def cancelled(self) -> tuple[str, str]:
        return str(ClientClosedError.status), ClientClosedError.reason


async def infer(request: Request) -> Response:
    """POST /v2/models/{name}[/versions/{version}]/infer: the Starlette route, through the data plane."""
    state = request.app.state
    header_length = request.headers.get(HEADER_LENGTH)

    async def read() -> HttpBody:
        return HttpBody(await whole_body(request), "", "", header_length)

    answer = await state.plane.infer(
        state.v2_codec,
        read,
        model=request.path_params["name"],
        version=request.path_params.get("version"),
        form="json" if header_length is None else "binary",
        deadline=deadline_of(request.scope, state.plane.service.settings.request_timeout_s),
        path=request.url.path,
    )
    return answer.response()  # type: ignore[no-any-return]


INFER_ROUTES = [
    Route("/v2/models/{name}/infer", infer, methods=["POST"], include_in_schema=False),
    Route("/v2/models/{name}/versions/{version}/infer", infer, methods=["POST"], include_in_schema=False),
]


def parse_infer(
    body: bytes | bytearray, header_length: str | None, spec: ModelSpec, max_instances: int
) -> tuple[Asked, np.ndarray | list[bytes]]:
    """What the answer should hold and the input: (k, C, H, W) pixels or intensities, or a BYTES input's
    encoded images (still to decode): the whole request, checked."""
    document, binary, booleans = _split_body(body, header_length, spec)
    images = _input(document, binary, spec, max_instances, booleans_written=booleans)
    return asked_outputs(document, spec), images


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _parameters(value: object, where: str) -> dict[str, Any]:
    """A "parameters" object (absent or null: none)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InputError(f"{where} parameters are {_short(value)}", expected='a JSON object, e.g. {"name": value}')
    return value


def _flag(parameters: dict[str, Any], key: str, default: bool) -> bool:
    value = parameters.get(key, default)
    if not isinstance(value, bool):
        raise InputError(f"the parameter {key} is {_short(value)}", expected="true or false")
    return value


def asked_outputs(document: dict[str, Any], spec: ModelSpec) -> Asked:
    """The request's "outputs" and answer parameters, refused here (400) if the answer could not honour them."""
    request_parameters = _parameters(document.get("parameters"), "the request's")
    tensors.check_request_parameters(request_parameters.items())
    wants_binary = _flag(request_parameters, "binary_data_output", False)
    requested = document.get("outputs")
    if requested is None:
        requested = []
    if not isinstance(requested, list):
        expected = f"a list naming {tensors.outputs_expected(spec)}"
        raise InputError(f'"outputs" is {_short(requested)}', expected=expected)
    names = [output.get("name") if isinstance(output, dict) else None for output in requested]
    seen: set[str] = set()
    wanted = []
    for output in requested:
        if not isinstance(output, dict):
            raise InputError(f"an output is {_short(output)}", expected=f'{{"name": "{spec.layout.names[0]}"}}')
        found = tensors.wanted_output(spec, output.get("name"), names, seen)
        parameters = _parameters(output.get("parameters"), f'the output "{found.name}"\'s')
        tensors.refuse_shared_memory(parameters, f'the output "{found.name}"')
        classes = parameters.get("classification", 0)
        if classes is None:
            classes = 0
        if not isinstance(classes, int) or isinstance(classes, bool) or classes < 0:
            raise InputError(
                f"the parameter classification is {_short(classes)}",
                expected="a whole number of classes to answer, most probable first (0: the probabilities)",
            )
        classes = tensors.check_classification(spec, found, classes)
        wanted.append(tensors.Wanted(found.name, classes, _flag(parameters, "binary_data", wants_binary)))
    if not wanted:
        wanted = [tensors.Wanted(name, 0, wants_binary) for name in spec.layout.names]
    request_id = document.get("id")
    return Asked(None if request_id is None else tensors.checked_id(request_id), tuple(wanted))


def _split_body(
    body: bytes | bytearray, header_length: str | None, spec: ModelSpec
) -> tuple[dict[str, Any], memoryview, bool]:
    """The JSON inference header and the binary section after it, a view of the body (150 KB for one
    224×224 UINT8 image: not copied), empty without the extension; and whether the header writes
    `true` or `false` anywhere (a tensor's JSON data may hold them among its numbers). A header length
    of 0 is Triton's raw binary request: the whole body is the model's one input (raw_request)."""
    if header_length == "0":
        return raw_request(len(body), spec), memoryview(body), False
    header, binary = body, memoryview(b"")
    if header_length is not None:
        digits = header_length.isascii() and header_length.isdigit() and len(header_length) <= MAX_LENGTH_DIGITS
        if not digits or int(header_length) > len(body):
            raise InputError(
                f"Inference-Header-Content-Length is {_short(header_length)} for a body of {len(body)} bytes",
                expected="the byte length of the JSON header that starts the body",
                status=400,
            )
        header, binary = body[: int(header_length)], memoryview(body)[int(header_length) :]
    try:
        document = orjson.loads(header)
    except orjson.JSONDecodeError as error:
        if header_length is None and not bytes(header[:64]).lstrip().startswith(b"{"):  # raw bytes, no header length
            raise InputError(
                "the body is not a JSON inference request (it does not begin with '{'), and the request has no "
                "Inference-Header-Content-Length",
                expected="a JSON inference request, or binary tensors after a JSON header whose byte length "
                "Inference-Header-Content-Length gives",
                status=400,
            ) from None
        raise InputError(
            f"the inference header is not valid JSON: {error}", expected="a JSON object", status=400
        ) from None
    if not isinstance(document, dict):
        raise InputError("the inference header is not a JSON object", expected='{"inputs": [...]}', status=400)
    return document, binary, writes_a_boolean(header)


def raw_request(size: int, spec: ModelSpec) -> dict[str, Any]:
    """Triton's raw binary request (Inference-Header-Content-Length: 0): a body of images of the model's declared
    input datatype, nothing else; the header Triton would infer for it, [N, C, H, W] with N the images it holds."""
    datatype = spec.config.input_datatype
    image = spec.pixels * tensors.DATATYPES[datatype].itemsize
    if size == 0 or size % image:
        raise InputError(
            f"a raw binary request (Inference-Header-Content-Length: 0) of {size} bytes, not whole {datatype} images "
            f"of {list(spec.input_shape)}",
            expected=f"a body of {image} bytes an image, or a JSON inference header whose length the header gives",
        )
    shape = [size // image, *spec.input_shape]
    return {"inputs": [{"name": tensors.INPUT, "datatype": datatype, "shape": shape,
                        "parameters": {"binary_data_size": size}}]}  # fmt: skip


def _base64_elements(data: object, spec: ModelSpec) -> list[bytes]:
    """A BYTES input's JSON data: base64 strings, flat or one a row."""
    rows = data if isinstance(data, list) else None
    strings = [row[0] if isinstance(row, list) and len(row) == 1 else row for row in rows or []]
    if rows is None or not all(isinstance(text, str) for text in strings):
        raise InputError("the BYTES input's data is not a list of strings", expected=tensors.expected(spec))
    try:
        return [base64.b64decode(text, validate=True) for text in strings]
    except ValueError:  # binascii.Error, or a character outside ASCII (b64decode's own ValueError)
        raise InputError("a BYTES element is not base64", expected=tensors.expected(spec)) from None


def _declares_bytes(document: dict[str, Any]) -> bool:
    """Whether the request's input is encoded images (BYTES), read off its parsed header alone."""
    inputs = document.get("inputs")
    return isinstance(inputs, list) and any(isinstance(t, dict) and t.get("datatype") == "BYTES" for t in inputs)


def _input(
    document: dict[str, Any],
    binary: bytes | memoryview,
    spec: ModelSpec,
    max_instances: int,
    *,
    booleans_written: bool,
) -> np.ndarray | list[bytes]:
    inputs = document.get("inputs")
    if not isinstance(inputs, list) or len(inputs) != 1 or not isinstance(inputs[0], dict):
        raise InputError('"inputs" must be a list of one tensor', expected=tensors.expected(spec))
    tensor = inputs[0]
    datatype, shape = tensor.get("datatype"), tensor.get("shape")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise InputError(f"the input's shape is {_short(shape)}", expected=tensors.expected(spec))
    parameters = _parameters(tensor.get("parameters"), "the input's")
    tensors.refuse_shared_memory(parameters, "the input")
    size = parameters.get("binary_data_size")
    if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size != len(binary)):
        raise InputError(
            f"binary_data_size is {_short(size)} and the binary section holds {len(binary)} bytes",
            expected="binary_data_size equal to the bytes after the JSON header",
        )
    # Triton refuses data in two places, or bytes after the header no input claims: which would it have read?
    if size is not None and "data" in tensor:
        raise InputError('the input has both "data" and parameters.binary_data_size',
                         expected="its data in one of them")  # fmt: skip
    if size is None and len(binary):
        raise InputError(f"{len(binary)} bytes follow the inference header, and no input has binary_data_size",
                         expected="parameters.binary_data_size on the input those bytes are, or no bytes after the "
                         "header")  # fmt: skip
    if datatype == "BYTES":  # encoded images, decoded as uploads are
        binary_form = size is not None
        # bytes: each element is an upload, which the decoders read as bytes (one copy of the section)
        elements = (
            tensors.length_prefixed(bytes(binary), most=max_instances)
            if binary_form
            else _base64_elements(tensor.get("data"), spec)
        )
        name = str(tensor.get("name"))
        return tensors.encoded_images(spec, name=name, shape=shape, elements=elements, max_instances=max_instances)
    if size is not None:
        data = tensors.binary_elements(str(datatype), binary)
    elif "data" in tensor:
        data = tensors.json_elements(str(datatype), tensor["data"], spec, booleans_written=booleans_written)
    else:
        raise InputError(
            'the input has neither "data" nor parameters.binary_data_size', expected=tensors.expected(spec)
        )
    return tensors.decode_input(
        spec, name=str(tensor.get("name")), datatype=str(datatype), shape=shape, data=data, max_instances=max_instances
    )


def infer_answer(asked: Asked, spec: ModelSpec, probabilities: np.ndarray) -> tuple[bytes, int | None]:
    """The answer's body: each output asked for (every one by default) — probabilities, a named output's
    values, or top-k strings (classification) —, JSON or binary as asked; and the length of its JSON header
    where binary tensors follow it (None: all JSON)."""
    header: dict[str, Any] = {"model_name": spec.name, "model_version": spec.version, "outputs": []}
    if asked.id is not None:
        header["id"] = asked.id
    raw: list[bytes] = []
    for want, output, values in tensors.answer_tensors(spec, probabilities, asked.outputs):
        described: dict[str, Any] = {
            "name": output.name,
            "datatype": tensors.datatype_of(want, output),
            "shape": list(values.shape),
        }
        if output.classes:  # what the scores are: softmax probabilities, sigmoid per class, or the model's own
            described["parameters"] = {"postprocess": spec.config.postprocess}
        if want.binary:
            raw.append(tensors.raw_bytes(want, output, values))
            described.setdefault("parameters", {})["binary_data_size"] = len(raw[-1])
        else:
            described["data"] = [v.decode() for v in values.reshape(-1)] if want.classes else values.reshape(-1)
        header["outputs"].append(described)
    body = orjson.dumps(header, option=orjson.OPT_SERIALIZE_NUMPY)
    if not raw:
        return body, None
    return body + b"".join(raw), len(body)
