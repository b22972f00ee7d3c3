"""What the generator sends is what the service decodes: every body form through app.codecs.bodies'
own decoders (called as the reference servers call them), bit for bit, with the eager model's
labels of exactly those pixels."""

from __future__ import annotations

import io
import zlib
from collections.abc import AsyncIterator

import numpy as np
import orjson
import pytest
from PIL import Image
from starlette.datastructures import Headers, UploadFile
from starlette.formparsers import MultiPartParser

from app.codecs.bodies import decode_image, decode_json, decode_raw
from loadtest.payloads import (
    MULTIPART_CONTENT_TYPE,
    PayloadOptions,
    build_payloads,
    encode_json,
    encode_png,
    encode_raw,
    load_images,
    reference_logits,
    to_unit_float,
    top2_margin,
)
from loadtest.servers.common import MAX_IMAGE_PIXELS, MAX_INSTANCES, SEED


@pytest.fixture(scope="module")
def images() -> np.ndarray:
    return load_images(16)  # uint8 (16, 28, 28)


def test_json_body_decodes_to_the_reference_pixels(images: np.ndarray) -> None:
    decoded = decode_json(encode_json(images[:4]), max_instances=MAX_INSTANCES, spec=SEED)  # (4, 1, 28, 28)
    assert np.array_equal(decoded[:, 0], to_unit_float(images[:4]))  # bit for bit


@pytest.mark.parametrize("dtype", ["uint8", "float32"])
def test_raw_body_decodes_to_the_reference_pixels(images: np.ndarray, dtype: str) -> None:
    decoded = decode_raw(encode_raw(images[:3], dtype), dtype=dtype, max_instances=MAX_INSTANCES, spec=SEED)
    if dtype == "uint8":  # pixels stay uint8 until the engine
        assert np.array_equal(decoded[:, 0], images[:3])
    else:
        assert np.array_equal(decoded[:, 0], to_unit_float(images[:3]))


def test_png_body_decodes_to_the_reference_pixels(images: np.ndarray) -> None:
    decoded = decode_image(encode_png(images[5]), max_pixels=MAX_IMAGE_PIXELS, spec=SEED)  # (1, 1, 28, 28) uint8
    assert np.array_equal(decoded[0, 0], images[5])


def test_encode_png_writes_8bit_grayscale() -> None:
    # Signature, IHDR for 28×28 8-bit grayscale, and its CRC.
    png = encode_png(np.zeros((28, 28), dtype=np.uint8))
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png[12:16] == b"IHDR"
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert (width, height, png[24], png[25]) == (28, 28, 8, 0)
    assert int.from_bytes(png[29:33], "big") == zlib.crc32(png[12:29])


async def parse_multipart(body: bytes, content_type: str) -> bytes:
    """The file in field `file`, as Starlette's parser (the service's) reads it."""

    async def stream() -> AsyncIterator[bytes]:
        yield body

    form = await MultiPartParser(Headers({"content-type": content_type}), stream()).parse()
    upload = form["file"]
    assert isinstance(upload, UploadFile)
    return await upload.read()


@pytest.mark.anyio
async def test_multipart_bodies_parse_back_to_their_png_with_one_shared_header(images: np.ndarray) -> None:
    payloads = build_payloads("png", check_labels=False, limit=3)
    assert payloads.content_type == MULTIPART_CONTENT_TYPE and len(payloads.bodies) == 3
    for i, body in enumerate(payloads.bodies):
        png = await parse_multipart(body, payloads.content_type)
        assert np.array_equal(np.asarray(Image.open(io.BytesIO(png))), images[i])


@pytest.mark.anyio
async def test_photo_forms_carry_the_same_jpegs_as_an_upload_and_as_the_body() -> None:
    photo, jpeg = build_payloads("photo", check_labels=False), build_payloads("jpeg", check_labels=False)
    assert (photo.content_type, jpeg.content_type) == (MULTIPART_CONTENT_TYPE, "image/jpeg")
    assert len(photo.bodies) == len(jpeg.bodies) == 16 and len(set(jpeg.bodies)) == 16
    for upload, body in zip(photo.bodies, jpeg.bodies, strict=True):
        assert await parse_multipart(upload, photo.content_type) == body
        assert Image.open(io.BytesIO(body)).size == (500, 375)


def test_payloads_carry_the_eager_labels_of_unambiguous_images() -> None:
    payloads = build_payloads("json", images_per_request=4, limit=200)
    assert payloads.expected is not None and len(payloads.expected) == len(payloads.bodies)
    assert all(len(e) == 4 for e in payloads.expected)
    info = payloads.info
    assert info["images_used"] + info["images_left_out_ambiguous"] >= 196
    # The labels are the model's, computed on exactly the decoded pixels of each body.
    first = decode_json(payloads.bodies[0], max_instances=MAX_INSTANCES, spec=SEED)[:, 0]  # (4, 28, 28) float32
    logits = reference_logits(np.rint(first * 255).astype(np.uint8))
    assert tuple(logits.argmax(1).tolist()) == payloads.expected[0]
    assert (top2_margin(logits) >= info["min_margin_logits"]).all()


def test_payload_options_reject_bad_combinations() -> None:
    with pytest.raises(ValueError, match="one image"):
        build_payloads("png", images_per_request=2, check_labels=False, limit=4)
    with pytest.raises(ValueError, match="form"):
        build_payloads("xml", check_labels=False)
    raw = PayloadOptions(form="raw", raw_dtype="float32", check_labels=False, images=4).build()
    assert raw.path == "/predict?dtype=float32" and len(raw.bodies[0]) == 28 * 28 * 4


def test_the_v2_form_is_a_binary_tensor_request_of_the_pixels(images: np.ndarray) -> None:
    payloads = build_payloads("v2", images_per_request=2, check_labels=False, limit=6)
    ((name, length),) = payloads.headers
    assert name == "Inference-Header-Content-Length" and payloads.path == "/v2/models/fashion-cnn/infer"
    body = payloads.bodies[1]
    header = orjson.loads(body[: int(length)])
    assert header["inputs"] == [
        {"name": "input", "datatype": "UINT8", "shape": [2, 1, 28, 28], "parameters": {"binary_data_size": 2 * 784}}
    ]
    assert body[int(length) :] == payloads.pixels[1] == images[2:4].tobytes()
    assert payloads.model == "fashion-cnn" and payloads.image_shape == (1, 28, 28)
    assert build_payloads("v2", check_labels=False, limit=2, path="/v2/models/m/versions/3/infer").model == "m"
    with pytest.raises(ValueError, match="UINT8"):
        build_payloads("v2", raw_dtype="float32", check_labels=False, limit=2)
    with pytest.raises(ValueError, match="/v2/models/<model>/infer"):
        build_payloads("v2", check_labels=False, limit=2, path="/v1/models/m/predict")
