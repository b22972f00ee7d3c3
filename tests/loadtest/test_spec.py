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


def test_the_grpc_clients_take_grpc_urls_and_the_http_ones_http() -> None:
    LoadSpec(url="grpc://127.0.0.1:8001", concurrency=2, client="grpc-stream").validate()
    assert LoadSpec(url="grpc://127.0.0.1:8001/", concurrency=2, client="grpc").base_url == "grpc://127.0.0.1:8001"
    for url, client in (
        ("http://127.0.0.1:8000", "grpc"),
        ("grpc://127.0.0.1:8001", "lean"),
        ("grpc://10.0.0.1:1", "grpc"),
    ):
        with pytest.raises(ValueError, match="url"):
            LoadSpec(url=url, concurrency=2, client=client).validate()
