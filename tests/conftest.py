"""Markers by folder (as LitServe does): tests/gpu is `gpu`, tests/integration is `integration`.

GPU tests skip where torch sees no CUDA device; everything else runs on the CPU in CI.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# In-process apps (TestClient) start no gRPC server: it would take port 8001 in every test, and
# load this service's protocol messages into the process's protobuf pool, where tritonclient's
# (imported by the protocol tests) already defines the same names. Real server processes get a
# free gRPC port from the harness.
os.environ.setdefault("CGSERVE_GRPC_PORT", "0")

ROOT = Path(__file__).resolve().parents[1]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    cuda = _cuda_available()
    for item in items:
        parts = Path(str(item.fspath)).relative_to(ROOT / "tests").parts
        if parts[0] == "gpu":
            item.add_marker(pytest.mark.gpu)
            if not cuda:
                item.add_marker(pytest.mark.skip(reason="needs a CUDA device"))
        elif parts[0] in ("integration", "reliability"):
            item.add_marker(pytest.mark.integration)


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
