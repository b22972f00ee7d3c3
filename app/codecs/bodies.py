"""Request bodies → image batches in the model's (C, H, W), and probabilities → the JSON answer.

Every decoder returns an array (k, C, H, W), k ≥ 1, or raises InputError naming what was wrong
and what was expected. Pixels stay small: raw uint8 bodies and decoded uploads come back as
uint8 (the engine casts on the device); JSON and raw float32 come back as float32 intensities
in [0, 1]. The hot path is orjson + numpy: no per-element Python or pydantic validation.
"""

from __future__ import annotations

import functools
import io
import re
from typing import Any

import numpy as np
import orjson
from PIL import Image, UnidentifiedImageError

from app.errors import InputError
from app.repository.model_spec import ModelSpec

IMAGE_EXPECTED = (
    "one PNG or JPEG image: the whole body (Content-Type image/jpeg or image/png), a multipart/form-data "
    "upload in the field `file`, or an element of a v2 BYTES input"
)
RAW_DTYPES: dict[str, np.dtype[Any]] = {"uint8": np.dtype(np.uint8), "float32": np.dtype("<f4")}
RAW_LAYOUTS = ("nchw", "nhwc")
# Large downscales first shrink by a whole factor (a box filter, cheap), then resample: a 1024×1024
# upload made 28×28 costs 2 ms of resizing instead of 9 (Pillow's reducing_gap).
REDUCING_GAP = 3.0
# A progressive JPEG is decoded once a scan, and its scans are a few bytes each: 20,000 of them in 244 KB took 7.2 s
# of a decode thread for a 1024×1024 image (bench/results/2026-12-06-cpu-hostile-images.json). libjpeg's own
# progressions have up to 10, tuned encoders ~20. The same limit in app/front_door/door.c (MAX_JPEG_SCANS), which
# sends a JPEG over it here to refuse.
MAX_JPEG_SCANS = 100
# A 16-bit grey PNG opens in these (Pillow reads 16-bit colour as 8-bit itself); convert() clips them at 255 rather
# than scale them: the seed CNN's 92 % on 1000 Fashion-MNIST test images was 67 % on their 16-bit PNGs (same record).
SIXTEEN_BIT_MODES = frozenset(("I;16", "I;16B", "I;16L", "I;16N", "I"))
JPEG_SCAN = b"\xff\xda"  # SOS; byte stuffing keeps 0xFF 0xDA out of the entropy-coded data
JPEG_FRAMES = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}  # SOFn (C4: DHT, C8: JPG, CC: DAC are not frames)


def json_expected(spec: ModelSpec) -> str:
    return _json_expected(spec.input_shape)


def raw_expected(spec: ModelSpec) -> str:
    return _raw_expected(spec.input_shape)


# What every request's decode passes along for its errors: built once per input shape, not per request.
@functools.lru_cache(maxsize=256)
def _json_expected(shape: tuple[int, int, int]) -> str:
    c, h, w = shape
    shapes = f"a {h}×{w} nested list, " if c == 1 else ""
    return (
        f'a JSON object {{"instances": [...]}} whose instances are each {shapes}a {c}×{h}×{w} nested list or a '
        f"flat list of {c * h * w} numbers, pixel intensities scaled to [0, 1]"
    )


@functools.lru_cache(maxsize=256)
def _raw_expected(shape: tuple[int, int, int]) -> str:
    c, h, w = shape
    return (
        f"application/octet-stream: N×{c}×{h}×{w} uint8 pixels 0–255 (N×{c * h * w} bytes; ?layout=nhwc for "
        f"N×{h}×{w}×{c}), or with ?dtype=float32 little-endian float32 intensities in [0, 1] "
        f"(N×{c * h * w * 4} bytes)"
    )


def json_kind(document: object) -> str:
    """What a JSON document is, as its own words say it: an array, a string, a number …"""
    kinds = {list: "an array", dict: "an object", str: "a string", bool: "true or false", int: "a number",
             float: "a number"}  # fmt: skip
    return "null" if document is None else kinds.get(type(document), type(document).__name__)


def decode_json(body: bytes | bytearray, *, max_instances: int, spec: ModelSpec) -> np.ndarray:
    """{"instances": [...]} → (k, C, H, W) float32."""
    expected = json_expected(spec)
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as error:
        # orjson refuses NaN/Infinity literals, numbers beyond float64 and nesting deeper than 1024.
        raise InputError(
            f"the body is not valid JSON: {error}", expected=expected, status=400, code="invalid_json"
        ) from None
    if not isinstance(document, dict):
        raise InputError(f'the JSON body is {json_kind(document)}, not an object with "instances"', expected=expected)
    if "instances" not in document:
        raise InputError('the JSON object has no field "instances"', expected=expected)
    instances = document["instances"]
    if not isinstance(instances, list):
        raise InputError(f'"instances" is a {type(instances).__name__}, not a list', expected=expected)
    check_count(len(instances), max_instances, expected)
    try:
        array = np.array(instances)  # dtype inferred, so strings, booleans and nulls show up below
    except (ValueError, OverflowError, RecursionError):
        raise InputError(
            "the instances do not form a regular array (ragged lists, instances of different forms, mixed lists "
            "and numbers, too deeply nested, or numbers out of range): every instance of a request has one form",
            expected=expected,
        ) from None
    if array.dtype.kind not in "iuf":
        raise InputError(
            f"the instances hold non-numeric elements (decoded as {_kind_name(array.dtype)})",
            expected=expected,
        )
    if writes_a_boolean(body) and holds_booleans(instances):
        raise InputError("the instances hold true or false among their numbers", expected=expected)
    c, h, w = spec.input_shape
    shapes = [(spec.pixels,), (c, h, w), *([(h, w)] if c == 1 else [])]
    if array.shape[1:] not in shapes:
        named = " or ".join(str(list(shape)) for shape in shapes)
        raise InputError(f"each instance has shape {list(array.shape[1:])}; expected {named}", expected=expected)
    return checked_intensities(array.astype(np.float32).reshape(-1, c, h, w), expected)


def decode_raw(
    body: bytes | bytearray, *, dtype: str = "uint8", layout: str = "nchw", max_instances: int, spec: ModelSpec
) -> np.ndarray:
    """N packed images → (N, C, H, W): uint8 pixels as they came (no copy for NCHW), or float32."""
    expected = raw_expected(spec)
    if dtype not in RAW_DTYPES:
        raise InputError(f"dtype={dtype!r} is not supported", expected="dtype=uint8 (default) or dtype=float32")
    if layout not in RAW_LAYOUTS:
        raise InputError(f"layout={layout!r} is not supported", expected="layout=nchw (default) or layout=nhwc")
    image_bytes = spec.pixels * RAW_DTYPES[dtype].itemsize
    if len(body) % image_bytes:
        raise InputError(
            f"the body has {len(body)} bytes, not a multiple of one {dtype} image ({image_bytes} bytes)",
            expected=expected,
        )
    check_count(len(body) // image_bytes, max_instances, expected)
    c, h, w = spec.input_shape
    flat = np.frombuffer(body, dtype=RAW_DTYPES[dtype])
    # NHWC (how decoders hand out images) becomes an NCHW view; the batcher's copy into its
    # staging slot does the transpose.
    images = flat.reshape(-1, c, h, w) if layout == "nchw" else flat.reshape(-1, h, w, c).transpose(0, 3, 1, 2)
    return images if dtype == "uint8" else checked_intensities(images, expected)


def decode_image(data: bytes | bytearray, *, max_pixels: int, spec: ModelSpec) -> np.ndarray:
    """A PNG or JPEG → (1, C, H, W) uint8: the model's colour, resized and cropped per its [preprocess]."""
    if not data:
        raise InputError("the uploaded file is empty", expected=IMAGE_EXPECTED)
    c, h, w = spec.input_shape
    color, resize, crop = spec.config.color, spec.preprocess.resize, spec.preprocess.crop
    try:
        # open() reads the header only: the size check runs before any pixel is decoded.
        with Image.open(io.BytesIO(data), formats=("PNG", "JPEG")) as image:
            check_image_size(image.size, max_pixels=max_pixels, spec=spec)
            if image.info.get("progressive"):  # a baseline JPEG's scans are one a component at most
                check_jpeg_scans(data)
            # JPEG decodes at a reduced scale, no smaller than what follows needs; a no-op for PNG.
            image.draft(color, (resize, resize) if resize else (w, h))
            picture = (eight_bit(image) if image.mode in SIXTEEN_BIT_MODES else image).convert(color)
            if resize:  # shorter side → resize, as torchvision's Resize(int)
                scale = resize / min(picture.size)
                size = (max(1, round(picture.width * scale)), max(1, round(picture.height * scale)))
                picture = picture.resize(size, Image.Resampling.BILINEAR, reducing_gap=REDUCING_GAP)
            if crop:  # centre crop, as torchvision's CenterCrop
                left, top = (picture.width - crop) // 2, (picture.height - crop) // 2
                picture = picture.crop((left, top, left + crop, top + crop))
            if picture.size != (w, h):
                picture = picture.resize((w, h), Image.Resampling.LANCZOS, reducing_gap=REDUCING_GAP)
    except Image.DecompressionBombError as error:  # Pillow's own guard, hit by absurd headers
        # Its text names its own limit (178956970), not the server's: only its count of the header's pixels is kept.
        declared = re.search(r"\((\d+) pixels\)", str(error))
        count = f"{declared[1]} pixels" if declared else "more pixels than any image this server takes"
        raise InputError(
            f"the image's header declares {count}, over the limit of {max_pixels}",
            expected=_too_large(max_pixels, spec),
            status=413,
            code="image_too_large",
        ) from None
    except UnidentifiedImageError:  # its text names a BytesIO's address: nothing the client can use
        raise InputError(
            "the upload could not be decoded as PNG or JPEG: its first bytes are neither's whole header (another "
            "format, or a file cut short)",
            expected=IMAGE_EXPECTED,
        ) from None
    except (OSError, SyntaxError, ValueError) as error:
        raise InputError(
            f"the upload could not be decoded as PNG or JPEG ({type(error).__name__}: {error})",
            expected=IMAGE_EXPECTED,
        ) from None
    pixels = np.asarray(picture, dtype=np.uint8).reshape(h, w, c)  # (H, W, C) as Pillow holds it
    return np.ascontiguousarray(pixels.transpose(2, 0, 1))[None]  # (1, C, H, W)


def check_image_size(size: tuple[int, int], *, max_pixels: int, spec: ModelSpec) -> None:
    """413 for an image whose header says (width, height) is over the pixel limit."""
    width, height = size
    if width * height > max_pixels:
        raise InputError(
            f"the image is {width}×{height} = {width * height} pixels, over the limit of {max_pixels}",
            expected=_too_large(max_pixels, spec),
            status=413,
            code="image_too_large",
        )


def eight_bit(image: Image.Image) -> Image.Image:
    """A 16-bit grey image (0–65535) as 8-bit grey (0–255), each value's high byte, as the PNG's own 8-bit would be."""
    values = np.asarray(image).astype(np.int64).clip(0, 65535)  # (H, W); "I" is int32
    return Image.fromarray((values >> 8).astype(np.uint8), mode="L")


def jpeg_scans(data: bytes | bytearray) -> int:
    """The SOS markers of a JPEG from its frame header on: its scans. The segments before the frame (APPn: EXIF and
    its thumbnail, ICC profiles, XMP) are stepped over by their lengths, since their bytes may hold the pair."""
    at = 2  # after SOI
    # Stepped as libjpeg steps them; anything it would not step over ends the walk early, which counts more, not less.
    while at + 4 <= len(data) and data[at] == 0xFF:
        marker = data[at + 1]
        if marker == 0xFF:  # a fill byte
            at += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD7:  # TEM, RSTn: no length (read as one, they jumped the frame)
            at += 2
            continue
        length = int.from_bytes(data[at + 2 : at + 4], "big")
        if marker in JPEG_FRAMES or marker in (0xD9, 0xDA) or length < 2:  # the frame, or no frame before the scans
            break
        at += 2 + length
    return data.count(JPEG_SCAN, at)


def check_jpeg_scans(data: bytes | bytearray) -> None:
    """422 for a JPEG of more than MAX_JPEG_SCANS scans, before it is decoded (a decode a scan)."""
    scans = jpeg_scans(data)
    if scans > MAX_JPEG_SCANS:
        raise InputError(
            f"the JPEG has {scans} scans, over the limit of {MAX_JPEG_SCANS}",
            expected=f"a JPEG of at most {MAX_JPEG_SCANS} scans (a progressive JPEG has about 10); {IMAGE_EXPECTED}",
        )


def _too_large(max_pixels: int, spec: ModelSpec) -> str:
    _, h, w = spec.input_shape
    return f"an image of at most {max_pixels} pixels; this model takes {w}×{h}"


def encode_predictions(probabilities: np.ndarray, *, model: str, engine: str, spec: ModelSpec) -> bytes:
    """(k, num_classes) float32 scores → the /predict answer as JSON bytes; `postprocess` says what the
    scores are (softmax probabilities, sigmoid per class, or the model's own outputs). A model of named
    outputs ([[outputs]]): (k, width) packed rows → each output by its name, the class scores' as
    label, class_name and scores."""
    layout = spec.layout
    if not layout.default:
        return _encode_outputs(probabilities, model=model, engine=engine, spec=spec)
    labels = probabilities.argmax(axis=1).tolist()
    predictions: list[dict[str, Any]] = [
        {"label": label, "class_name": spec.class_names[label], "scores": probabilities[i]}
        for i, label in enumerate(labels)
    ]
    answer = {"model": model, "engine": engine, "postprocess": spec.config.postprocess, "predictions": predictions}
    return orjson.dumps(answer, option=orjson.OPT_SERIALIZE_NUMPY)


def _encode_outputs(rows: np.ndarray, *, model: str, engine: str, spec: ModelSpec) -> bytes:
    layout = spec.layout
    values = layout.cut(rows)  # name → (k, *shape) in its datatype
    predictions: list[dict[str, Any]] = [{} for _ in range(len(rows))]
    for output in layout.outputs:
        tensor = values[output.name]
        if output.classes:
            for prediction, label, scores in zip(predictions, tensor.argmax(axis=1).tolist(), tensor, strict=True):
                prediction.update(label=label, class_name=spec.class_names[label], scores=scores)
        else:
            for prediction, value in zip(predictions, tensor, strict=True):
                prediction[output.name] = value
    answer: dict[str, Any] = {"model": model, "engine": engine}
    if layout.classes is not None:
        answer["postprocess"] = spec.config.postprocess
    answer["predictions"] = predictions
    return orjson.dumps(answer, option=orjson.OPT_SERIALIZE_NUMPY)


def check_count(count: int, max_instances: int, expected: str) -> None:
    if count == 0:
        raise InputError("the request holds no images", expected=expected)
    if count > max_instances:
        raise too_many_images(f"{count} images", max_instances, expected)


def too_many_images(held: str, max_instances: int, expected: str) -> InputError:
    """The 413 of a request holding `held` (e.g. "300 images") where at most max_instances are allowed."""
    return InputError(
        f"the request holds {held}; at most {max_instances} are allowed in one request",
        expected=f"{expected}; at most {max_instances} images a request (CGSERVE_MAX_INSTANCES)",
        status=413,
        code="too_many_instances",
    )


def checked_intensities(batch: np.ndarray, expected: str) -> np.ndarray:
    if not np.isfinite(batch).all():
        # perf_analyzer's default data is random bytes, which read as FP32 hold NaN and Inf: say what it takes.
        hint = " (random bytes read as floats do: perf_analyzer wants --input-data zero, or send UINT8 pixels)"
        raise InputError(f"the pixels hold NaN or infinite values{hint}", expected=expected)
    low, high = float(batch.min()), float(batch.max())
    if low < 0.0 or high > 1.0:
        # The server normalises: a tensor normalised by the client (ImageNet's mean and std: about -2.1 to 2.6)
        # would be normalised twice, and answered wrong, if it were taken.
        hint = (" (to send 0–255 values, divide them by 255)" if high > 1.0 and low >= 0.0
                else " (the server normalises with the model's mean and std: send the image's intensities, not a "
                "normalised tensor)")  # fmt: skip
        raise InputError(f"pixel intensities range over [{low:g}, {high:g}], outside [0, 1]{hint}", expected=expected)
    return batch


def writes_a_boolean(text: bytes | bytearray) -> bool:
    """Whether a JSON text holds the letters `true` or `false` anywhere: a memchr for each `t` and `f`
    (~0.5 µs for 784 floats, 15 KB; a search for b"true" took 20 µs). Most bodies do not, and their
    numbers need no holds_booleans."""
    for first, literal in ((b"t", b"true"), (b"f", b"false")):
        at = text.find(first)
        while at >= 0:
            if text.startswith(literal, at):
                return True
            at = text.find(first, at + 1)
    return False


def holds_booleans(numbers: object) -> bool:
    """Whether JSON lists numpy read as numbers hold true or false: numpy takes them for 1 and 0 beside
    numbers (np.asarray([0.5, True]) is float64). Written back by orjson (20–40 µs for 784 numbers, hence
    writes_a_boolean first), a list of numbers holds no `t` and no `f`."""
    written = orjson.dumps(numbers)
    return b"t" in written or b"f" in written


def _kind_name(dtype: np.dtype[Any]) -> str:
    return {"b": "booleans", "U": "strings", "S": "strings", "O": "nulls, objects or mixed types"}.get(
        dtype.kind, str(dtype)
    )
