"""The sweep's verdict on each step and its latency-against-throughput plot."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from loadtest import sweep as sweep_module
from loadtest.sweep import plot_path, plot_sweep, step_verdict, sweep_summary


def step(rate: float, p50: float, p99: float, errors: int = 0) -> dict[str, Any]:
    return {
        "target_rate_rps": rate,
        "throughput_rps": rate * 0.99,
        "latency_ms": {"p50": p50, "p99": p99},
        "counts": {"errors": errors},
    }


def test_step_verdict() -> None:
    assert step_verdict(step(100, 1, 4.9), 5)[0]
    assert not step_verdict(step(100, 1, 5.1), 5)[0]
    assert step_verdict(step(100, 1, 1.0, errors=1), 5) == (False, "1 errors")
    assert not step_verdict({"latency_ms": {"p99": None}, "counts": {"errors": 0}}, 5)[0]


def test_summary_and_plot(tmp_path: Path) -> None:
    steps = [step(100, 1, 2), step(200, 1.5, 4), step(400, 9, 80)]
    for s in steps:
        s["passed"], s["verdict"] = step_verdict(s, 5)
    sweep = {
        "steps": steps,
        "slo_p99_ms": 5.0,
        "capacity_rps": 200.0,
        "capacity_throughput_rps": 198.0,
        "capacity_p99_ms": 4.0,
        "form": "json",
        "url": "http://127.0.0.1:8000",
    }
    assert sweep_summary(sweep).endswith("capacity: 200 req/s at p99 ≤ 5 ms (p99 4.00 ms, 198.0 req/s answered)")
    path = tmp_path / "sweep.png"
    plot_sweep(sweep, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_plot_goes_beside_the_record_only_where_matplotlib_can_draw_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """--plot is where it says; without it, beside --out as .png where matplotlib is installed, and no plot where it
    is not (make serve's environment), so that a sweep without it still writes its steps."""
    assert plot_path(Path("a.png"), Path("b.json")) == Path("a.png")
    assert plot_path(None, None) is None
    found = importlib.util.find_spec
    monkeypatch.setattr(
        sweep_module.importlib.util, "find_spec", lambda name: found(name) if name != "matplotlib" else 1
    )
    assert plot_path(None, Path("b.json")) == Path("b.png")
    monkeypatch.setattr(sweep_module.importlib.util, "find_spec", lambda name: None)
    assert plot_path(None, Path("b.json")) is None
