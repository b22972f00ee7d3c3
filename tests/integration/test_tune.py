"""`cudagraph-serve tune` as a user runs it, on the CPU: the seed CNN's eager engine timed, the real
server's overhead measured, and an env file that the service reads as its settings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from app.config import Settings
from tests.integration.server_process import ROOT

QUICK = ("--max-bucket", "8", "--runs", "5", "--device", "cpu", "--overhead-warmup-s", "1")


def tune(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The tuner in `tmp_path` (no .env of the checkout's is read), its output kept."""
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "app.cli", "tune", *args],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_tune_writes_an_env_file_the_service_reads_as_its_settings(tmp_path: Path) -> None:
    env_file, report_file = tmp_path / "out" / "tuned.env", tmp_path / "out" / "tune.json"
    args = ("--slo-p99-ms", "500", *QUICK, "--overhead-requests", "20")
    result = tune(tmp_path, *args, "--out", str(env_file), "--json", str(report_file))
    assert result.returncode == 0, result.stdout + result.stderr
    print(result.stdout)  # the table and the choice, for whoever reads the test log

    settings = Settings(_env_file=env_file)  # type: ignore[call-arg]
    report = json.loads(report_file.read_text())
    chosen = report["chosen"]
    assert settings.buckets == tuple(chosen["buckets"])
    assert settings.max_delay_ms == chosen["max_delay_ms"]
    assert set(settings.buckets) <= {1, 2, 3, 4, 6, 8}
    assert sorted(report["replay"], key=int) == ["1", "2", "3", "4", "6", "8"]
    assert report["overhead"]["source"].startswith("measured")
    # The server's time beyond the replay, clamped at 0: on a loaded machine the median can be 0.
    assert 0 <= report["overhead"]["median_ms"] <= report["overhead"]["p99_ms"]
    assert chosen["worst_p99_ms"] <= 500
    assert f"chose buckets {chosen['buckets']}" in result.stdout


def test_an_slo_no_setting_can_meet_exits_naming_the_fastest_p99(tmp_path: Path) -> None:
    env_file = tmp_path / "tuned.env"
    result = tune(tmp_path, "--slo-p99-ms", "0.5", *QUICK, "--overhead-ms", "2", "--out", str(env_file))
    assert result.returncode == 3, result.stdout + result.stderr
    assert "fastest achievable p99 is" in result.stderr
    assert "Traceback" not in result.stderr
    assert not env_file.exists()


def test_tune_refuses_an_unknown_model_listing_the_repository(tmp_path: Path) -> None:
    result = tune(tmp_path, "--slo-p99-ms", "50", "--model", "nope", "--device", "cpu")
    assert result.returncode == 2
    assert "fashion-cnn" in result.stderr


def test_bad_tuner_flags_are_refused_one_line_each(tmp_path: Path) -> None:
    result = tune(tmp_path, "--slo-p99-ms", "-1", "--runs", "0", "--device", "cpu")
    assert result.returncode == 2
    assert "--slo-p99-ms must be positive; got -1" in result.stderr
    assert "--runs must be at least 1; got 0" in result.stderr
    assert "Traceback" not in result.stderr


def test_tokens_in_the_env_file_reach_the_overhead_servers_requests_and_its_metrics(tmp_path: Path) -> None:
    # The overhead server reads the same .env: its predict route wants an inference token, its /metrics an admin
    # one. Without them the tuner stopped on a 401, or (admin) fell back to its replay.
    (tmp_path / ".env").write_text(
        "CGSERVE_AUTH_TOKENS=infer-token-0123456789\nCGSERVE_ADMIN_TOKENS=admin-token-0123456789\n"
    )
    result = tune(
        tmp_path, "--slo-p99-ms", "500", *QUICK, "--overhead-requests", "20", "--out", str(tmp_path / "t.env")
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "the server's own mean batch" in result.stdout, result.stdout
