"""The benchmark's ratios and markdown table, from a report of its JSON shape."""

from __future__ import annotations

from typing import Any

from loadtest.bench.report import markdown, ratios


def closed(c: int, rps: float) -> dict[str, Any]:
    return {"concurrency": c, "throughput_rps": rps, "counts": {"errors": 0}, "command": "python -m loadtest"}


def server(role: str, rps: float) -> dict[str, Any]:
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
        "closed_loop": [closed(16, rps), closed(32, rps * 0.9)],
        "saturation": {"throughput_rps": rps, "concurrency": 16},
        "open_loop": open_loop,
    }


def test_ratios_and_markdown() -> None:
    servers = {
        "noop": server("ceiling", 6300.0),
        "naive": server("baseline", 1800.0),
        "eager": {"role": "ours", "error": "TimeoutError: not ready"},
        "cuda-graph": server("ours", 5400.0),
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
