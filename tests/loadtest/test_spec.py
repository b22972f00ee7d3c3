"""A load run's spec: only this machine, bounded in time and rate."""

from __future__ import annotations

import pytest

from loadtest.spec import LoadSpec, validate_url


def test_validate_url_accepts_only_this_machine() -> None:
    assert validate_url("http://127.0.0.1:8000") == "http://127.0.0.1:8000"
    assert validate_url("http://localhost:8000/") == "http://localhost:8000"
    assert validate_url("http://[::1]:8000") == "http://[::1]:8000"
    for bad in ("http://10.0.0.1:8000", "https://127.0.0.1:8000", "http://example.com", "http://127.0.0.1/predict"):
        with pytest.raises(ValueError):
            validate_url(bad)


def test_spec_validation_bounds_the_run() -> None:
    LoadSpec(url="http://127.0.0.1:9", rate=10).validate()
    with pytest.raises(ValueError, match="exactly one"):
        LoadSpec(url="http://127.0.0.1:9").validate()
    with pytest.raises(ValueError, match="exactly one"):
        LoadSpec(url="http://127.0.0.1:9", rate=10, concurrency=2).validate()
    with pytest.raises(ValueError, match="duration"):
        LoadSpec(url="http://127.0.0.1:9", rate=10, duration_s=1e6).validate()
    with pytest.raises(ValueError, match="url"):
        LoadSpec(url="http://8.8.8.8:80", rate=10).validate()
    with pytest.raises(ValueError, match="connections"):
        LoadSpec(url="http://127.0.0.1:9", concurrency=8, processes=4, connections=2).validate()
