"""The benchmark driver's pure parts: core pinning, hey's summary, the report's ratios and table."""

from __future__ import annotations

from loadtest.bench_report import markdown, ratios
from loadtest.bench_server import parse_hey
from loadtest.pinning import core_list, parse_cores, plan_pinning

# --- bench driver ---------------------------------------------------------------------------


def test_core_lists_round_trip() -> None:
    assert parse_cores("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert core_list([0, 1, 2, 3, 8, 10, 11]) == "0-3,8,10-11"
    assert core_list(parse_cores("5")) == "5"


def test_plan_pinning_refuses_missing_cores() -> None:
    assert plan_pinning("auto", "auto", no_pin=True)["server_cores"] is None
    plan = plan_pinning("0", "100000", no_pin=False)
    assert plan["loadgen_cores"] is None and any("not available" in n for n in plan["notes"])


HEY_OUTPUT = """
Summary:
  Total:        10.0012 secs
  Slowest:      0.0311 secs
  Requests/sec: 6123.4567

Latency distribution:
  10% in 0.0011 secs
  50% in 0.0024 secs
  90% in 0.0040 secs
  99% in 0.0080 secs

Status code distribution:
  [200] 61234 responses
  [503] 2 responses
"""


def test_parse_hey() -> None:
    hey = parse_hey(HEY_OUTPUT)
    assert hey["requests_per_s"] == 6123.4567
    assert hey["latency_ms"] == {"p50": 2.4, "p90": 4.0, "p99": 8.0}
    assert hey["status_codes"] == {"200": 61234, "503": 2}
    assert parse_hey("garbage")["requests_per_s"] is None


def _closed(c: int, rps: float) -> dict:
    return {"concurrency": c, "throughput_rps": rps, "counts": {"errors": 0}, "command": "python -m loadtest"}


def _server(role: str, rps: float) -> dict:
    open_loop = [
        {
            "fraction_of_saturation": f,
            "target_rate_rps": f * rps,
            "latency_ms": {"p99": 1.0 + f},
            "counts": {"errors": 0},
        }
        for f in (0.5, 0.9)
    ]
    return {
        "role": role,
        "command": "x",
        "closed_loop": [_closed(16, rps), _closed(32, rps * 0.9)],
        "saturation": {"throughput_rps": rps, "concurrency": 16},
        "open_loop": open_loop,
    }


def test_ratios_and_markdown() -> None:
    servers = {
        "noop": _server("ceiling", 6300.0),
        "naive": _server("baseline", 1800.0),
        "eager": {"role": "ours", "error": "TimeoutError: not ready"},
        "cuda-graph": _server("ours", 5400.0),
    }
    rat = ratios(servers)
    assert rat == {"cuda-graph_over_naive": 3.0, "cuda-graph_over_ceiling": 0.86}
    report = {
        "started_at": "2026-11-30T00:00:00+00:00",
        "command": "python -m loadtest.bench_server --out-dir x",
        "machine": {"gpu": "NVIDIA H200", "cpu_model": "Xeon", "cpu_count": 16, "torch": "2.11"},
        "pinning": {"server_cores": [0, 1], "loadgen_cores": [2, 3]},
        "settings": {
            "concurrencies": [16, 32],
            "processes": 2,
            "form": "json",
            "body_bytes_mean": 5661.0,
            "duration_s": 8.0,
            "warmup_s": 2.0,
        },
        "servers": servers,
        "ratios": rat,
        "notes": ["hey cross-check skipped"],
    }
    md = markdown(report)
    assert "| cuda-graph (ours) | 5,400 | c16 | 3.00× | 0.86 |" in md
    assert "| eager | TimeoutError: not ready |" in md
    assert "hey cross-check skipped" in md
