"""Request bodies → float32 image batches, and probabilities → the JSON answer.

Every decoder returns a float32 array (k, C, H, W) of intensities in [0, 1], k ≥ 1, or raises
InputError naming what was wrong and what was expected. The hot path is orjson + numpy:
no per-element Python or pydantic validation.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import orjson
from PIL import Image, UnidentifiedImageError

from app.errors import InputError
from app.model_spec import FASHION_CNN, ModelSpec

JSON_EXPECTED = (
    'a JSON object {"instances": [...]} whose instances are each a 28×28 nested list or a flat list '
    "of 784 numbers, pixel intensities scaled to [0, 1]"
)
RAW_EXPECTED = (
    "application/octet-stream: N×28×28 uint8 pixels 0–255 (N×784 bytes), "
    "or with ?dtype=float32 N×28×28 little-endian float32 intensities in [0, 1] (N×3136 bytes)"
)
IMAGE_EXPECTED = "a multipart/form-data upload of one PNG or JPEG image in the field `file`"
RAW_DTYPES: dict[str, np.dtype[Any]] = {"uint8": np.dtype(np.uint8), "float32": np.dtype("<f4")}


def decode_json(body: bytes, *, max_instances: int, spec: ModelSpec = FASHION_CNN) -> np.ndarray:
    """{"instances": [...]} → (k, C, H, W) float32."""
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as error:
        # orjson refuses NaN/Infinity literals, numbers beyond float64 and nesting deeper than 1024.
        raise InputError(
            f"the body is not valid JSON: {error}", expected=JSON_EXPECTED, status=400, code="invalid_json"
        ) from None
    if not isinstance(document, dict) or "instances" not in document:
        raise InputError('the JSON object has no field "instances"', expected=JSON_EXPECTED)
    instances = document["instances"]
    if not isinstance(instances, list):
        raise InputError(f'"instances" is a {type(instances).__name__}, not a list', expected=JSON_EXPECTED)
    _check_count(len(instances), max_instances, JSON_EXPECTED)
    try:
        array = np.array(instances)  # dtype inferred, so strings, booleans and nulls show up below
    except (ValueError, OverflowError, RecursionError):
        raise InputError(
            "the instances do not form a regular array (ragged lists, mixed lists and numbers, "
            "too deeply nested, or numbers out of range)",
            expected=JSON_EXPECTED,
        ) from None
    if array.dtype.kind not in "iuf":
        raise InputError(
            f"the instances hold non-numeric elements (decoded as {_kind_name(array.dtype)})",
            expected=JSON_EXPECTED,
        )
    c, h, w = spec.input_shape
    if array.shape[1:] not in ((spec.pixels,), (h, w), (c, h, w)):
        raise InputError(
            f"each instance has shape {list(array.shape[1:])}; expected [{h}, {w}] or [{spec.pixels}]",
            expected=JSON_EXPECTED,
        )
    return _checked_intensities(array.astype(np.float32).reshape(-1, c, h, w), JSON_EXPECTED)


def decode_raw(body: bytes, *, dtype: str = "uint8", max_instances: int, spec: ModelSpec = FASHION_CNN) -> np.ndarray:
    """N×C×H×W packed pixels → (N, C, H, W) float32."""
    if dtype not in RAW_DTYPES:
        raise InputError(f"dtype={dtype!r} is not supported", expected="dtype=uint8 (default) or dtype=float32")
    image_bytes = spec.pixels * RAW_DTYPES[dtype].itemsize
    if len(body) % image_bytes:
        raise InputError(
            f"the body has {len(body)} bytes, not a multiple of one {dtype} image ({image_bytes} bytes)",
            expected=RAW_EXPECTED,
        )
    _check_count(len(body) // image_bytes, max_instances, RAW_EXPECTED)
    pixels = np.frombuffer(body, dtype=RAW_DTYPES[dtype]).reshape(-1, *spec.input_shape)
    if dtype == "uint8":
        scaled: np.ndarray = pixels.astype(np.float32) * np.float32(1 / 255)
        return scaled
    return _checked_intensities(pixels, RAW_EXPECTED)


def decode_image(data: bytes, *, max_pixels: int, spec: ModelSpec = FASHION_CNN) -> np.ndarray:
    """A PNG or JPEG → (1, C, H, W) float32, as Fashion-MNIST: grayscale, resized to H×W."""
    if not data:
        raise InputError("the uploaded file is empty", expected=IMAGE_EXPECTED)
    c, h, w = spec.input_shape
    too_large = f"an image of at most {max_pixels} pixels; Fashion-MNIST images are 28×28"
    try:
        # open() reads the header only: the size check runs before any pixel is decoded.
        with Image.open(io.BytesIO(data), formats=("PNG", "JPEG")) as image:
            width, height = image.size
            if width * height > max_pixels:
                raise InputError(
                    f"the image is {width}×{height} = {width * height} pixels, over the limit of {max_pixels}",
                    expected=too_large,
                    status=413,
                    code="image_too_large",
                )
            image.draft("L", (w, h))  # JPEG decodes at a reduced scale; a no-op for PNG
            gray = image.convert("L")
            if gray.size != (w, h):
                gray = gray.resize((w, h), Image.Resampling.LANCZOS)
    except Image.DecompressionBombError as error:  # Pillow's own guard, hit by absurd headers
        raise InputError(str(error), expected=too_large, status=413, code="image_too_large") from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as error:
        raise InputError(
            f"the upload could not be decoded as PNG or JPEG ({type(error).__name__}: {error})",
            expected=IMAGE_EXPECTED,
        ) from None
    pixels = np.asarray(gray, dtype=np.uint8).reshape(1, c, h, w)
    return pixels.astype(np.float32) * np.float32(1 / 255)


def encode_predictions(probabilities: np.ndarray, *, model: str, engine: str, spec: ModelSpec = FASHION_CNN) -> bytes:
    """(k, num_classes) float32 probabilities → the /predict answer as JSON bytes."""
    labels = probabilities.argmax(axis=1).tolist()
    predictions: list[dict[str, Any]] = [
        {"label": label, "class_name": spec.class_names[label], "scores": probabilities[i]}
        for i, label in enumerate(labels)
    ]
    return orjson.dumps(
        {"model": model, "engine": engine, "predictions": predictions}, option=orjson.OPT_SERIALIZE_NUMPY
    )


def _check_count(count: int, max_instances: int, expected: str) -> None:
    if count == 0:
        raise InputError("the request holds no images", expected=expected)
    if count > max_instances:
        raise InputError(
            f"the request holds {count} images; at most {max_instances} are allowed in one request",
            expected=f"{expected}; at most {max_instances} images a request (CGSERVE_MAX_INSTANCES)",
            status=413,
            code="too_many_instances",
        )


def _checked_intensities(batch: np.ndarray, expected: str) -> np.ndarray:
    if not np.isfinite(batch).all():
        raise InputError("the pixels hold NaN or infinite values", expected=expected)
    low, high = float(batch.min()), float(batch.max())
    if low < 0.0 or high > 1.0:
        hint = " (to send 0–255 values, divide them by 255)" if high > 1.0 else ""
        raise InputError(f"pixel intensities range over [{low:g}, {high:g}], outside [0, 1]{hint}", expected=expected)
    return batch


def _kind_name(dtype: np.dtype[Any]) -> str:
    return {"b": "booleans", "U": "strings", "S": "strings", "O": "nulls, objects or mixed types"}.get(
        dtype.kind, str(dtype)
    )
