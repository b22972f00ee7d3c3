"""V2Codec.decode_cheaply: which large v2 requests the inline path decodes at once (a binary tensor under
a small JSON header, a view of the body) and which it leaves to the async decode (JSON, encoded images)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import orjson
import pytest

from app.errors import InputError
from app.http.answer import HttpBody
from app.protocols.v2.rest import V2Codec
from app.repository import read_repository

SPEC = read_repository(Path(__file__).resolve().parents[2] / "models/repository")[0]  # the seed CNN, 1×28×28
CODEC = V2Codec(SimpleNamespace(settings=SimpleNamespace(max_instances=1024)))  # type: ignore[arg-type]
PIXELS = np.random.default_rng(0).integers(0, 256, (100, 1, 28, 28), dtype=np.uint8)  # 78 KB: past 64 KiB


def binary(datatype: str = "UINT8", raw: bytes = PIXELS.tobytes(), shape: tuple[int, ...] = PIXELS.shape,
           pad: int = 0) -> HttpBody:  # fmt: skip
    tensor = {"name": "input", "datatype": datatype, "shape": list(shape), "parameters": {"binary_data_size": len(raw)}}
    header = orjson.dumps({"inputs": [tensor], "id": "x" * pad})
    return HttpBody(header + raw, "", "", str(len(header)))


def test_a_binary_tensor_under_a_small_header_is_decoded_at_once_as_a_view_of_the_body() -> None:
    request = binary()
    images, _ = CODEC.decode_cheaply(request, SPEC) or (None, None)
    assert images is not None and images.shape == PIXELS.shape
    np.testing.assert_array_equal(images, PIXELS)
    assert np.shares_memory(images, np.frombuffer(request.body, np.uint8))  # no copy of 78 KB


def test_json_tensors_and_encoded_images_are_left_to_the_async_decode() -> None:
    assert CODEC.decode_cheaply(HttpBody(orjson.dumps({"inputs": []}), "", "", None), SPEC) is None  # JSON
    png = b"\x89PNG\r\n\x1a\n" + bytes(100)
    encoded = binary("BYTES", len(png).to_bytes(4, "little") + png, (1,))
    assert CODEC.decode_cheaply(encoded, SPEC) is None  # encoded images: the uploads' decoder, not Pillow here


def test_fp32_values_after_a_header_of_any_length_come_out_aligned() -> None:
    values = np.random.default_rng(1).random((30, 1, 28, 28), dtype=np.float32)
    for pad in range(4):  # the header's length moves the values' start by one byte at a time
        images, _ = CODEC.decode_cheaply(binary("FP32", values.tobytes(), values.shape, pad=pad), SPEC) or (None, None)
        assert images is not None and images.flags.aligned
        np.testing.assert_array_equal(images.reshape(values.shape), values)


@pytest.mark.parametrize("length", ["", "²", "1e3", "9" * 13, "999999"])
def test_a_bad_binary_request_is_refused_as_the_async_decode_refuses_it(length: str | None) -> None:
    request = binary(raw=PIXELS.tobytes()[:-1])  # a byte short of its shape
    if length:
        request = HttpBody(request.body, "", "", length)  # a header length that is none, or past the body
    with pytest.raises(InputError) as cheaply:
        CODEC.decode_cheaply(request, SPEC)
    with pytest.raises(InputError) as later:
        asyncio.run(CODEC.decode(request, SPEC))
    assert (str(cheaply.value), cheaply.value.status) == (str(later.value), later.value.status)
