"""The Open Inference Protocol's tensors for our models, shared by its REST and gRPC ingress.

Every model has one input, `input`: FP32 intensities in [0, 1] or UINT8 pixels, shape
[-1, C, H, W] (its metadata declares the datatype model.toml's input_datatype names; both are
accepted); and one output, `probabilities`: FP32 [-1, classes], or the named outputs of its
model.toml's [[outputs]], each with its datatype and shape [-1, *one image's]. A request's input becomes the same
(k, C, H, W) array that POST /predict's decoders give the batcher; an output asked for with the
classification extension becomes Triton's top-k strings "score:index:label".
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from app import __version__
from app.codecs.bodies import check_count, checked_intensities, holds_booleans, json_kind, too_many_images
from app.errors import InputError, quoted
from app.protocols.v2.batch_limits import max_batch_size
from app.repository.model_spec import ModelSpec
from app.repository.outputs import DATATYPES as OUTPUT_DATATYPES
from app.repository.outputs import Output

if TYPE_CHECKING:
    from app.engines.factory import EngineOptions

INPUT = "input"
DATATYPES: dict[str, np.dtype[Any]] = {"FP32": np.dtype("<f4"), "UINT8": np.dtype(np.uint8)}
# A request's `id` is echoed in its answer: bounded, or a stream of unread answers to 16 MiB ids held
# gigabytes (a review's attack on ModelStreamInfer).
MAX_ID_CHARS = 1024
EXTENSIONS = ["binary_tensor_data", "classification", "model_configuration", "model_repository"]


def expected(spec: ModelSpec) -> str:
    return _expected(spec.input_shape)


@functools.cache  # every request's decode names it before it knows of an error: written once an input shape
def _expected(shape: tuple[int, int, int]) -> str:
    c, h, w = shape
    return (
        f'one input "{INPUT}", FP32 intensities in [0, 1] or UINT8 pixels 0–255, shape [N, {c}, {h}, {w}] '
        f"with 1 ≤ N; data as a flat or nested list, or binary (binary_tensor_data); or BYTES, shape [N] or "
        f"[N, 1], each element an encoded PNG or JPEG (base64 strings in JSON)"
    )


def encoded_images(
    spec: ModelSpec, *, name: str, shape: list[int], elements: list[bytes], max_instances: int
) -> list[bytes]:
    """A BYTES input: one encoded PNG or JPEG an element, shape [N] or [N, 1]; checked, not yet decoded
    (they go into the same decoder as POST /predict's uploads, on the GPU where it can be)."""
    want = expected(spec)
    if name != INPUT:
        raise InputError(f"the input is named {quoted(name)}", expected=want)
    if len(shape) not in (1, 2) or (len(shape) == 2 and shape[1] != 1) or shape[0] < 0:
        raise InputError(f"the BYTES input's shape is {list(shape)}", expected=want)
    check_count(shape[0], max_instances, want)
    if len(elements) != shape[0]:
        raise InputError(f"the input holds {len(elements)} elements for a shape of {list(shape)}", expected=want)
    return elements


def length_prefixed(raw: bytes, *, most: int) -> list[bytes]:
    """BYTES elements as the binary extension and raw_input_contents carry them: each a 4-byte
    little-endian length, then that many bytes. More than `most` (the images a request may hold) is
    refused as soon as it is seen: 256 KB of empty elements would be 65,536 slices to make first."""
    elements: list[bytes] = []
    at = 0
    while at < len(raw):
        if len(elements) == most:  # the 413 check_count gives a shape of too many images
            raise too_many_images(f"more than {most} elements", most, "one encoded image a BYTES element")
        if at + 4 > len(raw):
            raise InputError("the BYTES input ends inside an element's length", expected="4-byte lengths, then bytes")
        length = int.from_bytes(raw[at : at + 4], "little")
        if at + 4 + length > len(raw):
            raise InputError(f"a BYTES element of {length} bytes runs past the input", expected="whole elements")
        elements.append(raw[at + 4 : at + 4 + length])
        at += 4 + length
    return elements


def decode_input(
    spec: ModelSpec, *, name: str, datatype: str, shape: list[int], data: np.ndarray, max_instances: int
) -> np.ndarray:
    """The input tensor (its elements already in `data`, flat) → (k, C, H, W) uint8 or float32."""
    want = expected(spec)
    if name != INPUT:
        raise InputError(f"the input is named {quoted(name)}", expected=want)
    if datatype not in DATATYPES:
        raise InputError(f"the input's datatype is {quoted(datatype)}", expected=want)
    c, h, w = spec.input_shape
    if len(shape) != 4 or list(shape[1:]) != [c, h, w] or shape[0] < 0:  # gRPC's shape is int64s: -1 too
        raise InputError(f"the input's shape is {list(shape)}", expected=want)
    check_count(shape[0], max_instances, want)
    if data.size != math.prod(shape):
        raise InputError(f"the input holds {data.size} elements for a shape of {list(shape)}", expected=want)
    images = data.reshape(shape)
    return images if datatype == "UINT8" else checked_intensities(images, want)


def json_elements(datatype: str, data: object, spec: ModelSpec, *, booleans_written: bool) -> np.ndarray:
    """The JSON form's "data" (flat or nested list) → a flat array of the datatype's elements.
    `booleans_written`: the request's JSON holds `true` or `false` somewhere (writes_a_boolean)."""
    if datatype not in DATATYPES:  # before its data: "STRING" or "bytes" is what is wrong, not the strings they hold
        raise InputError(f"the input's datatype is {quoted(datatype)}", expected=expected(spec))
    try:
        array = np.asarray(data)
    except (ValueError, OverflowError, RecursionError):
        raise InputError("the input's data is not a regular array", expected=expected(spec)) from None
    if array.size == 0:  # [] reads as float64: the batch's count, not a datatype, is what is wrong (decode_input)
        return np.empty(0, DATATYPES.get(datatype, np.dtype("<f4")))
    if array.dtype.kind not in "iuf" or array.dtype == np.bool_:
        raise InputError("the input's data holds non-numeric elements", expected=expected(spec))
    if booleans_written and holds_booleans(data):  # np.asarray read them as 1 and 0
        raise InputError("the input's data holds true or false among its numbers", expected=expected(spec))
    if datatype == "UINT8" and (array.dtype.kind == "f" or (array.size and (array.min() < 0 or array.max() > 255))):
        raise InputError("UINT8 data must be integers 0–255", expected=expected(spec))
    return array.reshape(-1).astype(DATATYPES.get(datatype, np.dtype("<f4")))


def binary_elements(datatype: str, raw: bytes | memoryview) -> np.ndarray:
    """Raw little-endian bytes (binary_tensor_data, raw_input_contents) → a flat array, no copy where aligned."""
    dtype = DATATYPES.get(datatype, np.dtype(np.uint8))
    if len(raw) % dtype.itemsize:
        raise InputError(
            f"{len(raw)} bytes of input are not whole {datatype} elements",
            expected=f"{dtype.itemsize} bytes an element, little-endian",
        )
    array = np.frombuffer(raw, dtype=dtype)
    # A view after a JSON header of any length: multi-byte values may start off their alignment, which
    # numpy reads at about half speed; one aligned copy then (UINT8, the images' form, never needs it).
    return array if array.flags.aligned else array.copy()


@dataclass(frozen=True, slots=True)
class Wanted:
    """One output the answer holds, as the request asked for it (checked before its batch runs)."""

    name: str
    classes: int  # top-k strings (the classification extension); 0: the output's values
    binary: bool  # REST: its values as binary tensor data after the JSON header


def outputs_expected(spec: ModelSpec) -> str:
    names = spec.layout.names
    if len(names) == 1:
        return f'the output "{names[0]}"'
    return "outputs among " + ", ".join(f'"{name}"' for name in names) + ", each once"


def wanted_output(spec: ModelSpec, name: object, asked: list[object], seen: set[str]) -> Output:
    """The output a request's entry names; InputError for an unknown or repeated one (`asked`: every name the
    request gives, `seen`: those checked so far). 200,000 repeats made an answer of as many copies."""
    output = spec.layout.get(name) if isinstance(name, str) else None
    if output is None:
        raise InputError(f"no output named {quoted(name)}", expected=outputs_expected(spec))
    if output.name in seen:
        count = sum(1 for other in asked if other == output.name)
        raise InputError(f'the output "{output.name}" is asked for {count} times', expected="each output once")
    seen.add(output.name)
    return output


# Triton's request-level parameters, type-checked as Triton checks them (its http_server.cc and grpc infer handler)
# and then not acted on, as a default Triton does not: `timeout` only with a queue policy that allows it, `priority`
# only with priority levels, the sequence ones only with a sequence batcher, none of which a model configuration here
# declares. A client whose deadline matters sends X-Request-Timeout-Ms or a gRPC deadline.
UNSIGNED, SEQUENCE_ID, FLAG = "an unsigned integer", "an unsigned integer or a string", "true or false"
REQUEST_PARAMETERS = {"timeout": UNSIGNED, "priority": UNSIGNED, "sequence_id": SEQUENCE_ID,
                      "sequence_start": FLAG, "sequence_end": FLAG, "binary_data_output": FLAG}  # fmt: skip
RESERVED_PREFIX = "triton_"


def check_request_parameters(parameters: Iterable[tuple[str, object]], *, reserved_allowed: str = "") -> None:
    """InputError for a request-level parameter Triton refuses: one of its own of the wrong type, a key of Triton's
    reserved prefix (but `reserved_allowed`), or a value that is not a string, number or boolean (an object, a list,
    null, or a gRPC parameter with no value set)."""
    for key, value in parameters:
        if key.startswith(RESERVED_PREFIX) and key != reserved_allowed:
            raise InputError(f"the request parameter {quoted(key)} is of the prefix {RESERVED_PREFIX!r}, reserved for "
                             "Triton's own use", expected="parameters of other names")  # fmt: skip
        kind = REQUEST_PARAMETERS.get(key)
        if kind is None:
            valid = isinstance(value, str | int | float)  # bool is an int
        elif kind == FLAG:
            valid = isinstance(value, bool)
        else:
            unsigned = isinstance(value, int) and not isinstance(value, bool) and value >= 0
            valid = unsigned or (kind == SEQUENCE_ID and isinstance(value, str))
        if not valid:
            raise InputError(f"the request parameter {quoted(key)} is {quoted(value)}",
                             expected=kind or "a string, a number or true or false")  # fmt: skip


SHARED_MEMORY_PREFIX = "shared_memory_"  # Triton's shared-memory extension: shared_memory_region, _offset, _byte_size


def refuse_shared_memory(parameters: Iterable[str], where: str) -> None:
    """InputError where a tensor's parameters name a shared-memory region (Triton's system and CUDA shared-memory
    extensions): this server reads tensors from the request and writes them in the answer, and ignoring the
    parameter would leave a client reading its output region's stale bytes as the answer."""
    for key in parameters:
        if key.startswith(SHARED_MEMORY_PREFIX):
            raise InputError(
                f"{where} names a shared-memory region ({quoted(key)}); this server does not implement Triton's "
                "shared-memory extensions",
                expected="the tensor's data in the request (contents, raw_input_contents or the binary extension) "
                "and its outputs in the answer",
            )


def checked_id(request_id: object) -> str:
    """The request's id, to echo: refused (400 / INVALID_ARGUMENT) where it is not a string (JSON's `"id": 5`,
    which Triton refuses too) or is past MAX_ID_CHARS."""
    if not isinstance(request_id, str):
        raise InputError(
            f"the request id is {json_kind(request_id)}",
            expected="an id that is a JSON string (the answer echoes it)",
        )
    if len(request_id) > MAX_ID_CHARS:
        raise InputError(
            f"the request id is {len(request_id)} characters",
            expected=f"an id of at most {MAX_ID_CHARS} characters (the answer echoes it)",
        )
    return request_id


def echoable_id(request_id: str) -> str:
    """The id a refusal may echo: none where it is too long to (checked_id's refusal says why)."""
    return request_id if len(request_id) <= MAX_ID_CHARS else ""


def check_classification(spec: ModelSpec, output: Output, count: int) -> int:
    """The classification extension's top-k (a whole number already) for `output`: class scores only."""
    if count and not output.classes:
        scores = spec.layout.classes
        expected = (
            f'classification on "{scores.name}" alone' if scores else "no classification: no output is class scores"
        )
        raise InputError(
            f'the output "{output.name}" is not class scores, so it has no classification', expected=expected
        )
    return count


def answer_tensors(
    spec: ModelSpec, rows: np.ndarray, wanted: tuple[Wanted, ...]
) -> list[tuple[Wanted, Output, np.ndarray]]:
    """(k, width) answered rows → each wanted output's (k, *shape) values in its datatype, or for a top-k
    its (k, count) BYTES strings; every output in the model's order where none was named."""
    layout = spec.layout
    values = layout.cut(rows)
    answered = []
    for want in wanted:
        output = layout.get(want.name)
        assert output is not None  # wanted_output checked it
        tensor = values[want.name]
        if want.classes:
            tensor = classification(tensor, want.classes, spec.class_names)
        answered.append((want, output, tensor))
    return answered


def datatype_of(want: Wanted, output: Output) -> str:
    return "BYTES" if want.classes else output.datatype


def raw_bytes(want: Wanted, output: Output, values: np.ndarray) -> bytes:
    """An answered tensor as binary tensor data (REST) and raw_output_contents (gRPC): little-endian elements,
    BYTES each a 4-byte length then its bytes."""
    if want.classes:
        return b"".join(len(v).to_bytes(4, "little") + v for v in values.reshape(-1))
    return np.ascontiguousarray(values, dtype=OUTPUT_DATATYPES[output.datatype]).tobytes()


def classification(probabilities: np.ndarray, count: int, labels: tuple[str, ...]) -> np.ndarray:
    """(k, classes) → (k, count) strings "score:index:label", most probable first, as Triton does."""
    count = max(1, min(count, probabilities.shape[1]))
    order = np.argsort(-probabilities, axis=1, kind="stable")[:, :count]
    rows = [
        [f"{row[i]:.6f}:{i}:{labels[i]}".encode() for i in top] for row, top in zip(probabilities, order, strict=True)
    ]
    return np.array(rows, dtype=object)


def server_metadata() -> dict[str, Any]:
    return {"name": "cudagraph-serve", "version": __version__, "extensions": EXTENSIONS}


def platform(engine: str) -> str:
    """The `platform` of a model's metadata and configuration, over REST and gRPC alike."""
    return f"cudagraph-serve_{engine}"


def model_metadata(spec: ModelSpec, platform: str, versions: list[str] | None = None) -> dict[str, Any]:
    """`versions`: every version of the model served now (default: the spec's own)."""
    return {
        "name": spec.name,
        "versions": versions or [spec.version],
        "platform": platform,
        "inputs": [{"name": INPUT, "datatype": spec.config.input_datatype, "shape": [-1, *spec.input_shape]}],
        "outputs": [
            {"name": output.name, "datatype": output.datatype, "shape": [-1, *output.shape]}
            for output in spec.layout.outputs
        ],
    }


def model_config(spec: ModelSpec, options: EngineOptions, max_instances: int) -> dict[str, Any]:
    """Triton's model configuration extension, the fields load tools read (perf_analyzer); max_batch_size is what one
    request may carry (app/protocols/v2/batch_limits.py), and the preferred sizes are the buckets up to it (Triton
    refuses a configuration that prefers a batch larger than its max_batch_size)."""
    buckets, most = options.buckets, max_batch_size(options.buckets, max_instances)
    return {
        "name": spec.name,
        "platform": platform(options.engine),
        "backend": "cudagraph-serve",
        "max_batch_size": most,
        "input": [{"name": INPUT, "data_type": f"TYPE_{spec.config.input_datatype}", "dims": list(spec.input_shape)}],
        "output": [
            {"name": output.name, "data_type": f"TYPE_{output.datatype}", "dims": list(output.shape)}
            for output in spec.layout.outputs
        ],
        "dynamic_batching": {
            "preferred_batch_size": [bucket for bucket in buckets if bucket <= most],
            "max_queue_delay_microseconds": round(options.max_delay_ms * 1000),
        },
    }
