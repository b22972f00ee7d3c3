"""A compressed request body inflated within the body limit (app/http/content_encoding.py)."""

from __future__ import annotations

import gzip
import zlib

import pytest

from app.errors import BodyTooLargeError, InputError
from app.http.content_encoding import SLICE_BYTES, Inflater, inflated

BODY = bytes(range(256)) * 40  # 10,240 bytes


def raw_deflate(data: bytes) -> bytes:
    packer = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return packer.compress(data) + packer.flush()


@pytest.mark.parametrize(
    ("encoding", "packed"),
    [("gzip", gzip.compress(BODY)), ("x-gzip", gzip.compress(BODY)), ("deflate", zlib.compress(BODY)),
     ("deflate", raw_deflate(BODY)), ("GZip ", gzip.compress(BODY)),
     ("gzip", gzip.compress(BODY[:5000]) + gzip.compress(BODY[5000:]))],  # gzip's members, one after the other
)  # fmt: skip
def test_each_encoding_inflates_to_the_body(encoding: str, packed: bytes) -> None:
    assert inflated(packed, encoding, len(BODY)) == BODY


def test_a_body_that_inflates_past_the_limit_is_413_without_inflating_it_all() -> None:
    bomb = gzip.compress(bytes(64 << 20))  # 64 MiB of zeros in ~64 KB
    inflater = Inflater("gzip", 1 << 20)
    with pytest.raises(BodyTooLargeError):
        inflater.feed(bomb, last=True)
        while inflater.pending:
            inflater.more()
    assert inflater.inflated <= (1 << 20) + SLICE_BYTES  # stopped one slice past the limit


@pytest.mark.parametrize(
    ("packed", "says"),
    [(gzip.compress(BODY)[:-20], "ends early"), (gzip.compress(BODY) + b"xx", "2 bytes follow"),
     (b"not compressed at all", "not gzip data")],
)  # fmt: skip
def test_what_is_not_one_whole_stream_is_400_saying_why(packed: bytes, says: str) -> None:
    with pytest.raises(InputError, match=says) as refused:
        inflated(packed, "gzip", len(BODY))
    assert refused.value.status == 400


@pytest.mark.parametrize("encoding", ["br", "zstd", "gzip, gzip", "compress", "identity"])
def test_another_encoding_is_415_naming_what_is_taken(encoding: str) -> None:
    with pytest.raises(InputError, match="is not accepted") as refused:
        inflated(BODY, encoding, len(BODY))
    assert refused.value.status == 415 and "gzip or deflate" in refused.value.expected
