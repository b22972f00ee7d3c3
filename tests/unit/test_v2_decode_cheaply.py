"""V2Codec.decode_cheaply: which large v2 requests the inline path decodes at once (a binary tensor under
a small JSON header, a view of the body) and which it leaves to the async decode (JSON, encoded images)."""

from __future__ import annotations

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


def test_json_tensors_a_large_header_and_encoded_images_are_left_to_the_async_decode() -> None:
    assert CODEC.decode_cheaply(HttpBody(orjson.dumps({"inputs": []}), "", "", None), SPEC) is None  # JSON
    assert CODEC.decode_cheaply(binary(pad=70_000), SPEC) is None  # a 70 KB header: parsed off the loop
    png = b"\x89PNG\r\n\x1a\n" + bytes(100)
    encoded = binary("BYTES", len(png).to_bytes(4, "little") + png, (1,))
    assert CODEC.decode_cheaply(encoded, SPEC) is None  # encoded images: the uploads' decoder, not Pillow here
    for length in ("²", "1e3", "", "9" * 13):  # what parse_infer refuses goes where it says so
        assert CODEC.decode_cheaply(HttpBody(binary().body, "", "", length), SPEC) is None


def test_a_bad_binary_request_is_refused_as_the_async_decode_refuses_it() -> None:
    request = binary(raw=PIXELS.tobytes()[:-1])  # a byte short of its shape
    with pytest.raises(InputError) as cheaply:
        CODEC.decode_cheaply(request, SPEC)
    with pytest.raises(InputError) as later:
        CODEC.decode_now(request, SPEC)
    assert str(cheaply.value) == str(later.value)
