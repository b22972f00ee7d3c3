"""docs/operations.md's table of metrics names every metric app/ops/metrics.py defines, with its labels."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client.metrics import MetricWrapperBase

from app.ops import metrics

PAGE = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def documented() -> dict[str, tuple[str, ...]]:
    """Each row of the table: metric name (a counter's with its _total, as it is scraped) → its labels."""
    rows = re.findall(r"^\| `(cgserve_[a-z_]+)(?:\{([a-z_,]*)\})?` \|", PAGE.read_text(), re.MULTILINE)
    return {name: tuple(labels.split(",")) if labels else () for name, labels in rows}


def defined() -> dict[str, tuple[str, ...]]:
    found = {}
    for value in vars(metrics).values():
        if isinstance(value, MetricWrapperBase) and value._name.startswith("cgserve_"):
            scraped = value._name + ("_total" if value._type == "counter" else "")
            found[scraped] = tuple(value._labelnames)
    return found


def test_every_metric_is_in_the_table_with_its_labels() -> None:
    doc, code = documented(), defined()
    assert code, "no metrics found in app/ops/metrics.py"
    assert sorted(set(code) - set(doc)) == [], "metrics the table of docs/operations.md lacks"
    assert sorted(set(doc) - set(code)) == [], "rows of the table no metric has"
    wrong = {name: (doc[name], labels) for name, labels in code.items() if sorted(doc[name]) != sorted(labels)}
    assert wrong == {}, "labels the table gives (first) against the metric's (second)"
