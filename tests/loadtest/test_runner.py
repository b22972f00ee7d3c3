"""How a run is shared among processes (their start and merge run in test_loadtest.py)."""

from __future__ import annotations

from loadtest.payloads import build_payloads
from loadtest.runner import worker_specs
from loadtest.spec import LoadSpec


def test_worker_specs_share_the_load() -> None:
    payloads = build_payloads("raw", check_labels=False, limit=8)
    open_specs = worker_specs(LoadSpec(url="http://127.0.0.1:1", rate=900.0, processes=3), payloads)
    assert [s.rate for s in open_specs] == [300.0] * 3 and all(s.connections == 64 for s in open_specs)
    closed = worker_specs(LoadSpec(url="http://localhost:1", concurrency=5, processes=8), payloads)
    assert [s.concurrency for s in closed] == [1] * 5  # never more processes than clients
    assert [s.connections for s in closed] == [1] * 5
    assert [s.index for s in closed] == list(range(5))
    pooled = worker_specs(LoadSpec(url="http://localhost:1", concurrency=6, processes=2, connections=4), payloads)
    assert [s.concurrency for s in pooled] == [3, 3] and [s.connections for s in pooled] == [3, 3]  # ≥ its clients
