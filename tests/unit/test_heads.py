"""One reading of a request's head for every front end (app/http/heads.py)."""

from __future__ import annotations

import pytest

from app.http.heads import read_head


def test_the_first_content_type_and_header_length_count() -> None:
    v2_length = b"inference-header-content-length"
    head = read_head([(b"content-type", b"Application/JSON; charset=utf-8"), (b"content-type", b"text/plain"),
                      (v2_length, b"12"), (v2_length, b"99")])  # fmt: skip
    assert (head.media, head.header_length, head.streamed) == (b"application/json", b"12", False)


@pytest.mark.parametrize(
    ("headers", "length"),
    [([(b"content-length", b"784")], 784), ([(b"content-length", b"7"), (b"content-length", b"7")], -1),
     ([(b"content-length", b"1e3")], -1), ([], None)],
)  # fmt: skip
def test_content_length_once_and_a_number_or_minus_one(headers: list[tuple[bytes, bytes]], length: int | None) -> None:
    assert read_head(headers).length == length


@pytest.mark.parametrize(("value", "ms"), [(b"250", 250), (b"0", -1), (b"9" * 13, -1), (b"9" * 312, -1), (b"-5", -1)])
def test_the_timeout_is_a_positive_number_of_at_most_12_digits(value: bytes, ms: int) -> None:
    assert read_head([(b"x-request-timeout-ms", value)]).timeout_ms == ms


def test_a_streamed_body_is_said() -> None:
    assert read_head([(b"transfer-encoding", b"chunked")]).streamed
    assert read_head([(b"expect", b"100-continue")]).streamed


@pytest.mark.parametrize(("values", "ms"), [([b"1", b"100000"], 1), ([b"100000", b"7"], 7), ([b"abc", b"100"], -1),
                                            ([b"100", b"0"], -1)])  # fmt: skip
def test_several_timeouts_the_shortest_and_one_bad_refuses(values: list[bytes], ms: int) -> None:
    assert read_head([(b"x-request-timeout-ms", value) for value in values]).timeout_ms == ms
