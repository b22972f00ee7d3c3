"""bench/whole_machine.py's plumbing on the CPU: one worker, raw bodies, a one-step ladder of
half-second steps, the eager engine standing in for the GPU's (the H200 runs the real thing)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def whole_machine(out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "bench/whole_machine.py", "--out", str(out), "--device", "cpu", "--engine", "eager", *args]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(argv, capture_output=True, text=True, timeout=240, cwd=ROOT, env=env)


def test_one_worker_no_op_and_ours_with_ratio_p99_and_hey(tmp_path: Path, hey: str | None) -> None:
    done = whole_machine(
        tmp_path, "--workers", "1", "--forms", "raw", "--per-worker", "2", "--step-duration", "0.5",
        "--warmup", "0.2", "--processes", "1", "--hey", hey or "", "--p99-repeats", "2",
    )  # fmt: skip
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    report = json.loads((tmp_path / "whole-machine.json").read_text())
    assert report["schema"] == "cgserve-bench-whole-machine/1" and set(report["servers"]) == {"noop-1", "ours-1"}
    noop, ours = report["servers"]["noop-1"]["forms"]["raw"], report["servers"]["ours-1"]["forms"]["raw"]
    for form in (noop, ours):
        (step,) = form["closed_loop"]
        assert step["concurrency"] == 2 and step["client"] == "lean" and step["counts"]["errors"] == 0
        assert form["saturation"]["throughput_rps"] == step["throughput_rps"] > 0
        half = form["half_saturation"]  # one worker: open loop at half of its own saturation
        assert half["mode"] == "open" and half["target_rate_rps"] == pytest.approx(step["throughput_rps"] / 2, abs=0.1)
    assert ours["closed_loop"][0]["labels_checked"] and ours["closed_loop"][0]["server"]["engine"] == "eager"
    assert "--compile none" in report["servers"]["ours-1"]["command"]
    assert "loadtest.servers.raw_noop" in report["servers"]["noop-1"]["command"]  # the server's own ceiling
    checks = {c["what"]: c for c in report["checks"]}
    ratio = checks["1 worker(s), raw: ours ÷ no-op"]["value"]
    assert checks["1 worker(s), raw: ours ÷ no-op"]["target"] == "≥ 0.7"  # issue 26's, against a raw ASGI no-op
    assert ratio == round(ours["saturation"]["throughput_rps"] / noop["saturation"]["throughput_rps"], 3)
    assert checks["ours-1 raw: p99 at half saturation (ms)"]["value"] == ours["half_saturation"]["latency_ms"]["p99"]
    assert sorted(ours["half_saturation_p99s_ms"]) == ours["half_saturation_p99s_ms"]
    assert ours["half_saturation"]["latency_ms"]["p99"] == ours["half_saturation_p99s_ms"][1]  # median of two: upper
    # ours' own histograms during its step: every request it answered went through the handler
    inside = ours["half_saturation"]["server_side"]
    assert inside["handler_ms"]["count"] >= ours["half_saturation"]["counts"]["ok"] > 0
    assert 0 < inside["handler_ms"]["p50"] <= inside["handler_ms"]["p99"]
    assert inside["batch_rows"]["mean"] >= 1
    assert "server_side" not in noop["half_saturation"]  # the no-op has no /metrics
    # each closed-loop step too: ours' histograms (every answer through the handler) and each process's cores
    closed = ours["closed_loop"][0]
    assert closed["server_side"]["handler_ms"]["count"] >= closed["counts"]["ok"] > 0
    assert "server_side" not in noop["closed_loop"][0]
    for step in (closed, noop["closed_loop"][0]):
        assert step["server_cpu"]["cores_busy_peak_2s"]["supervisor"][0] > 0  # one worker: the root serves
    assert "The same median step seen by the server's own histograms" in (tmp_path / "whole-machine.md").read_text()
    if hey is not None:  # the largest worker count's no-op, at its saturation concurrency
        assert noop["hey"]["concurrency"] == 2 and noop["hey"]["requests_per_s"] > 0
        assert checks["noop-1 raw: this generator ÷ hey"]["value"] == noop["hey"]["loadtest_over_hey"]
    assert "| 1 | raw |" in (tmp_path / "whole-machine.md").read_text()


def test_steps_past_the_budget_are_skipped_and_said_so(tmp_path: Path) -> None:
    done = whole_machine(tmp_path, "--workers", "1", "--budget-s", "0", "--hey", "")
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "whole-machine.json").read_text())
    assert report["servers"] == {}
    assert "skipped noop-1: past the 0 s budget" in report["notes"]
    assert all(c["met"] is None for c in report["checks"])


def test_the_designs_side_by_side(tmp_path: Path) -> None:
    """--designs adds the engine-process and the all-ASGI servers beside the per-process one, each
    with its own ratio."""
    done = whole_machine(
        tmp_path, "--workers", "2", "--forms", "raw", "--per-worker", "2", "--step-duration", "0.5",
        "--warmup", "0.2", "--processes", "1", "--hey", "", "--designs", "per-process,engine-process,asgi",
        "--p99-repeats", "0",
    )  # fmt: skip
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    report = json.loads((tmp_path / "whole-machine.json").read_text())
    assert set(report["servers"]) == {"noop-2", "ours-2", "ours-ep-2", "ours-asgi-2"}
    assert "--engine-process" in report["servers"]["ours-ep-2"]["command"]
    assert "--no-inline-predict" in report["servers"]["ours-asgi-2"]["command"]
    assert not {"--engine-process", "--no-inline-predict"} & set(report["servers"]["ours-2"]["command"].split())
    ep = report["servers"]["ours-ep-2"]["forms"]["raw"]
    assert ep["closed_loop"][0]["counts"]["errors"] == 0 and ep["closed_loop"][0]["labels_checked"]
    noop = report["servers"]["noop-2"]["forms"]["raw"]["saturation"]["throughput_rps"]
    checks = {c["what"]: c["value"] for c in report["checks"]}
    expected = round(ep["saturation"]["throughput_rps"] / noop, 3)
    assert checks["2 worker(s), raw: ours ÷ no-op (engine-process)"] == expected
    assert "| 2 (engine-process) | raw |" in (tmp_path / "whole-machine.md").read_text()
    assert "2 worker(s), raw: ours ÷ no-op (asgi)" in checks


def test_eight_in_flight_a_worker_is_judged_at_that_step_not_at_saturation() -> None:
    """Issue 26, item 4: ours at 64 connections over 8 workers against the no-op at 64 connections,
    whatever either reaches with more in flight."""
    from bench.harness.whole_machine_report import checks

    def server(rps_by_c: dict[int, float], errors_at: int | None = None) -> dict[str, object]:
        steps = [
            {"concurrency": c, "throughput_rps": r, "counts": {"errors": int(c == errors_at)}}
            for c, r in rps_by_c.items()
        ]
        saturation = {"throughput_rps": max(rps_by_c.values()), "loadgen_cpu_busy": 0.3}
        return {"forms": {"raw": {"closed_loop": steps, "saturation": saturation}}}

    settings = {
        "workers": [8], "forms": ["raw"], "concurrency_per_worker": [8, 32],
        "designs": ["per-process", "engine-process"],
        "ceiling": "loadtest/servers/raw_noop.py: a raw ASGI app, no route",
    }  # fmt: skip
    servers = {
        "noop-8": server({64: 100_000.0, 256: 150_000.0}),
        "ours-8": server({64: 81_000.0, 256: 90_000.0}),
        "ours-ep-8": server({64: 99_000.0, 256: 140_000.0}, errors_at=64),
    }
    got = {c["what"]: c for c in checks({"settings": settings, "servers": servers})}
    moderate = got["8 worker(s), raw, 64 connections: ours ÷ no-op"]
    assert (moderate["value"], moderate["met"], moderate["target"]) == (0.81, True, "≥ 0.8")
    assert got["8 worker(s), raw: ours ÷ no-op"]["value"] == 0.6  # at saturation: 90,000 ÷ 150,000
    assert got["8 worker(s), raw: ours ÷ no-op"]["met"] is False  # under 0.7
    erred = got["8 worker(s), raw, 64 connections: ours ÷ no-op (engine-process)"]
    assert erred["value"] is None and erred["met"] is None  # a step with errors is no figure
