"""The tuner's env file: written where the service reads its settings (.env), other lines kept."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from app.config import Settings
from app.tuning.choose import Choice
from app.tuning.flags import add_tune_flags
from app.tuning.settings_file import write_env_file

CHOICE = Choice(
    buckets=(2, 6, 24), max_delay_ms=3.5, capacity_rps=900.0, p99_at_capacity_ms=9.0, worst_p99_ms=9.5,
    bucket_at_capacity=6,
)  # fmt: skip


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """`tmp_path` as the working directory, with no CGSERVE_ variable of the test's own shell."""
    for name in ("CGSERVE_BUCKETS", "CGSERVE_MAX_DELAY_MS", "CGSERVE_WORKERS", "CGSERVE_LOG_LEVEL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def default_out() -> Path:
    parser = argparse.ArgumentParser()
    add_tune_flags(parser)
    out: Path = parser.parse_args(["--slo-p99-ms", "20"]).out
    return out


def test_by_default_the_tuned_settings_are_the_ones_the_service_starts_with(clean_env: Path) -> None:
    write_env_file(default_out(), CHOICE, model="fashion-cnn", slo_ms=20)
    settings = Settings()  # as `cudagraph-serve serve` reads them, in the same directory
    assert (settings.buckets, settings.max_delay_ms) == ((2, 6, 24), 3.5)


def test_the_tuned_lines_replace_earlier_ones_and_keep_every_other_line(clean_env: Path) -> None:
    env = clean_env / ".env"
    env.write_text("# mine\nCGSERVE_WORKERS=4\nCGSERVE_BUCKETS=1,2\nCGSERVE_LOG_LEVEL=debug\n")
    write_env_file(env, CHOICE, model="fashion-cnn", slo_ms=20)
    write_env_file(env, CHOICE, model="fashion-cnn", slo_ms=20)  # a second run replaces the first's lines
    lines = env.read_text().splitlines()
    assert lines[:3] == ["# mine", "CGSERVE_WORKERS=4", "CGSERVE_LOG_LEVEL=debug"]
    assert [line for line in lines if line.startswith("CGSERVE_BUCKETS")] == ["CGSERVE_BUCKETS=2,6,24"]
    assert sum(line.startswith("# cudagraph-serve tune") for line in lines) == 1
    settings = Settings()
    assert (settings.workers, settings.buckets, settings.max_delay_ms) == (4, (2, 6, 24), 3.5)
