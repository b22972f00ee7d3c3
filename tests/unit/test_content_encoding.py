"""A compressed request body inflated a slice at a time (app/http/content_encoding.py); the limits that count the
slices are the request guard's (tests/unit/test_request_guard.py)."""

from __future__ import annotations

import gzip
import zlib

import pytest

from app.errors import InputError
from app.http.content_encoding import SLICE_BYTES, Inflater

BODY = bytes(range(256)) * 40  # 10,240 bytes


def inflated(body: bytes, encoding: str) -> bytes:
    """A whole body inflated at once, slice after slice."""
    inflater = Inflater(encoding)
    slices = [inflater.feed(body, last=True)]
    while inflater.pending:
        slices.append(inflater.more())
    return b"".join(slices)


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
    assert inflated(packed, encoding) == BODY


def test_a_bomb_comes_out_a_slice_at_a_time_so_that_a_limit_stops_it_one_slice_past() -> None:
    bomb = gzip.compress(bytes(64 << 20))  # 64 MiB of zeros in ~64 KB
    inflater, limit, inflated_so_far = Inflater("gzip"), 1 << 20, 0
    piece = inflater.feed(bomb, last=True)
    while inflated_so_far <= limit:  # as the guard charges each slice, and stops past its limit
        assert len(piece) <= SLICE_BYTES and inflater.pending
        inflated_so_far += len(piece)
        piece = inflater.more()
    assert inflated_so_far <= limit + SLICE_BYTES  # stopped one slice past the limit


@pytest.mark.parametrize(
    ("packed", "says"),
    [(gzip.compress(BODY)[:-20], "ends early"), (gzip.compress(BODY) + b"xx", "2 bytes follow"),
     (b"not compressed at all", "not gzip data")],
)  # fmt: skip
def test_what_is_not_one_whole_stream_is_400_saying_why(packed: bytes, says: str) -> None:
    with pytest.raises(InputError, match=says) as refused:
        inflated(packed, "gzip")
    assert refused.value.status == 400


@pytest.mark.parametrize("encoding", ["br", "zstd", "gzip, gzip", "compress", "identity"])
def test_another_encoding_is_415_naming_what_is_taken(encoding: str) -> None:
    with pytest.raises(InputError, match="is not accepted") as refused:
        inflated(BODY, encoding)
    assert refused.value.status == 415 and "gzip or deflate" in refused.value.expected
