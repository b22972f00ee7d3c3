"""Markers by folder (as LitServe does): tests/gpu is `gpu`, tests/integration is `integration`.

GPU tests skip where torch sees no CUDA device; everything else runs on the CPU in CI.
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    cuda = _cuda_available()
    for item in items:
        parts = Path(str(item.fspath)).relative_to(ROOT / "tests").parts
        if parts[0] == "gpu":
            item.add_marker(pytest.mark.gpu)
            if not cuda:
                item.add_marker(pytest.mark.skip(reason="needs a CUDA device"))
        elif parts[0] == "integration":
            item.add_marker(pytest.mark.integration)


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
