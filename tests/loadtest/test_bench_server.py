"""The benchmark's command line end to end, on the no-op server alone with tiny steps."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from loadtest.bench_server import main

pytestmark = pytest.mark.integration


def test_bench_writes_both_reports_with_hey_beside_the_generator(tmp_path: Path, hey: str | None) -> None:
    argv = [
        sys.executable, "-m", "loadtest.bench_server", "--out-dir", str(tmp_path), "--servers", "noop",
        "--concurrencies", "2", "--load-fractions", "0.5", "--step-duration", "1", "--warmup", "0.2",
        "--processes", "1", "--hey", hey or "",
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    (json_path,) = tmp_path.glob("*-server.json")
    report = json.loads(json_path.read_text())
    noop = report["servers"]["noop"]
    assert noop["saturation"]["throughput_rps"] > 0 and len(noop["open_loop"]) == 1
    assert noop["closed_loop"][0]["counts"]["errors"] == 0 and noop["exit_code_before_stop"] is None
    assert Path(noop["log"]).is_file() and report["machine"]["cpu_count"]
    assert "| noop (ceiling) |" in next(tmp_path.glob("*-server.md")).read_text()
    if hey is not None:
        assert noop["hey"]["requests_per_s"] > 0 and noop["hey"]["status_codes"] == {"200": noop["hey"]["requests"]}
        assert noop["hey"]["concurrency"] == 2 and " -o csv " in noop["hey"]["command"]


def test_a_server_that_fails_to_start_is_recorded_and_the_run_fails(tmp_path: Path) -> None:
    args = ["--out-dir", str(tmp_path), "--servers", "noop", "--server-cmd", "noop={python} -c 'raise SystemExit(3)'"]
    args += ["--concurrencies", "2", "--load-fractions", "", "--processes", "1", "--hey", "", "--no-pin"]
    assert main(args) == 1
    (json_path,) = tmp_path.glob("*-server.json")
    noop = json.loads(json_path.read_text())["servers"]["noop"]
    assert noop["error"].startswith("RuntimeError: noop exited with 3")


def test_unknown_servers_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--out-dir", str(tmp_path), "--server-cmd", "nosuch=python x"])
    assert "NAME=TEMPLATE" in capsys.readouterr().err
