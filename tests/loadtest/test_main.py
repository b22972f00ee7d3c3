"""The load generator's command line: a record's `command` parses back to the same run."""

from __future__ import annotations

import pytest

from loadtest.__main__ import _options, _spec, build_parser, main
from loadtest.payloads import PayloadOptions
from loadtest.spec import LoadSpec


def test_recorded_command_parses_back_to_the_same_run() -> None:
    spec = LoadSpec(
        url="http://127.0.0.1:9", rate=250.0, processes=4, connections=128, warmup_s=1.5, seed=7, client="httpx"
    )
    options = PayloadOptions(form="raw", batch=4, raw_dtype="float32", min_margin=1.0, images=100)
    args = build_parser().parse_args([*spec.to_args(), *options.to_args()])
    assert _spec(args, rate=args.rate, concurrency=args.concurrency) == spec
    assert _options(args) == options
    closed = LoadSpec(url="http://127.0.0.1:9", concurrency=16, processes=2)
    args = build_parser().parse_args([*closed.to_args(), *PayloadOptions(check_labels=False).to_args()])
    assert _spec(args, rate=args.rate, concurrency=args.concurrency) == closed
    assert _options(args) == PayloadOptions(check_labels=False)


def test_a_remote_url_is_refused_before_anything_is_sent(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--url", "http://192.0.2.1:8000", "--rate", "10", "--duration", "1", "--quiet"])
    assert exit_info.value.code == 2 and "--url must be http:// on 127.0.0.1" in capsys.readouterr().err
