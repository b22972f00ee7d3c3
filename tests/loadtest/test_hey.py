"""hey's CSV read into the benchmark's figures: on a captured run, and on a real short run
against the no-op server where hey is found (conftest's `hey`)."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from loadtest.hey import hey_command, parse_hey_csv, run_hey

# `hey -n 8 -c 2 -m POST -T application/json -D body.json -o csv http://127.0.0.1:18777/predict`
# against loadtest.servers.noop, as hey 0.1.4 wrote it.
CAPTURED = """\
response-time,DNS+dialup,DNS,Request-write,Response-delay,Response-read,status-code,offset
0.0026,0.0005,0.0000,0.0003,0.0016,0.0001,200,0.0005
0.0022,0.0002,0.0000,0.0000,0.0018,0.0001,200,0.0014
0.0009,0.0000,0.0000,0.0000,0.0009,0.0000,200,0.0030
0.0009,0.0000,0.0000,0.0000,0.0008,0.0000,200,0.0036
0.0010,0.0000,0.0000,0.0000,0.0010,0.0000,200,0.0040
0.0011,0.0000,0.0000,0.0000,0.0011,0.0000,200,0.0045
0.0011,0.0000,0.0000,0.0000,0.0011,0.0000,200,0.0050
0.0011,0.0000,0.0000,0.0000,0.0011,0.0000,200,0.0056
"""


def test_parse_a_captured_run() -> None:
    hey = parse_hey_csv(CAPTURED)
    assert hey["requests"] == 8 and hey["status_codes"] == {"200": 8}
    # Nearest rank over the sorted 0.9 0.9 1.0 1.1 1.1 1.1 2.2 2.6 ms, as loadtest.stats takes it.
    assert (hey["latency_ms"]["p50"], hey["latency_ms"]["p90"], hey["latency_ms"]["max"]) == (1.1, 2.6, 2.6)
    assert hey["requests_per_s"] == 1194.0  # 8 answers over 6.7 ms, the last one's offset + response time


def test_what_is_not_hey_csv_is_refused() -> None:
    summary = "Summary:\n  Total:\t1.0 secs\n  Requests/sec:\t6123.4\n"
    with pytest.raises(ValueError, match="not hey's CSV"):
        parse_hey_csv(summary)
    with pytest.raises(ValueError, match="no rows"):
        parse_hey_csv(CAPTURED.splitlines()[0] + "\n")
    failed = run_hey(["false"], timeout_s=10)
    assert failed["requests_per_s"] is None and failed["error"] == "hey exited with 1"


@pytest.mark.parametrize(("instances", "status"), [([[0.5] * 784], "200"), ([[0.5] * 10], "422")])
def test_a_real_run_against_the_noop_server(
    noop_url: str, hey: str | None, tmp_path: Path, instances: list[list[float]], status: str
) -> None:
    if hey is None:
        pytest.skip("hey not found; the captured run above still tests the parser")
    body = tmp_path / "body.json"
    body.write_bytes(orjson.dumps({"instances": instances}))
    argv = hey_command(hey, f"{noop_url}/predict", body, content_type="application/json", concurrency=2, duration_s=1.0)
    result = run_hey(argv, timeout_s=60)
    assert "error" not in result, result
    n = result["requests"]
    assert n > 10 and result["status_codes"] == {status: n}
    assert 0.5 < n / result["requests_per_s"] < 1.5  # hey ran for about its -z 1s
    lat = result["latency_ms"]
    assert 0 < lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["max"] < 1000
