"""Every PromQL expression in the dashboard and the rules parses, and names only metrics that the
service exports (read from app.ops.metrics, the GPU collector's included) or that a recording rule records."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.metrics_core import Metric

from tests.deploy.deploy_tools import REPO, run

DASHBOARDS = sorted((REPO / "deploy/grafana/dashboards").glob("*.json"))
RULE_FILES = sorted((REPO / "deploy/prometheus/rules").glob("*.yml"))

# The series a client library's metric family becomes on /metrics, by type.
SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
    "info": ("_info",),
    "stateset": ("",),
    "enum": ("",),
    "unknown": ("",),
}
# Series Prometheus itself adds to every scrape.
SCRAPE_SERIES = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}
# Grafana's built-in interval variables, replaced by a plain duration so that promtool can parse.
GRAFANA_INTERVALS = re.compile(r"\$\{?__(?:rate_interval|interval|range)\b\}?")


def exported_families() -> list[Metric]:
    """Every family on /metrics: app.ops.metrics' metrics and the GPU collector's (app/ops/gpu_metrics.py)."""
    import app.ops.metrics
    from app.ops.gpu_metrics import GpuCollector

    return [
        family
        for metric in vars(app.ops.metrics).values()
        if isinstance(metric, MetricWrapperBase | GpuCollector)
        for family in metric.describe()
    ]


def exported_series() -> set[str]:
    return {family.name + suffix for family in exported_families() for suffix in SUFFIXES[family.type]}


def rules() -> list[dict[str, Any]]:
    return [r for path in RULE_FILES for g in yaml.safe_load(path.read_text())["groups"] for r in g["rules"]]


def dashboard_exprs() -> list[tuple[str, str]]:
    """(where, expression) of every query target in every dashboard, Grafana variables replaced."""

    def panels(node: dict[str, Any]) -> list[dict[str, Any]]:
        found = []
        for panel in node.get("panels", []):
            found.append(panel)
            found.extend(panels(panel))  # rows hold panels
        return found

    out = []
    for path in DASHBOARDS:
        for panel in panels(json.loads(path.read_text())):
            for target in panel.get("targets", []):
                expr = GRAFANA_INTERVALS.sub("1m", target["expr"])
                assert "$" not in expr, f"{path.name} {panel['title']!r}: unknown variable in {expr}"
                out.append((f"{path.name}: {panel['title']} [{target['refId']}]", expr))
    return out


def all_exprs() -> list[tuple[str, str]]:
    named = [(f"rule {r.get('record') or r.get('alert')}", r["expr"]) for r in rules()]
    return dashboard_exprs() + named


_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^}]*\}")
_RANGES = re.compile(r"\[[^\]]*\]")
_LABEL_LISTS = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_WORDS = re.compile(r"(?<![\w:.])([A-Za-z_:][\w:]*)(?![\w:])(\s*\()?")
_KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
             "offset", "bool", "inf", "nan"}  # fmt: skip


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: every bare identifier that is not a function or
    aggregation (those are followed by a parenthesis), a keyword, or inside a label list, label
    matcher, string or range. promtool checks the syntax; this only reads names."""
    text = _STRINGS.sub('""', expr)
    text = _MATCHERS.sub(" ", text)
    text = _RANGES.sub(" ", text)
    text = _LABEL_LISTS.sub(" ", text)
    return {m[1] for m in _WORDS.finditer(text) if not m[2] and m[1].lower() not in _KEYWORDS}


def test_metric_names_reads_names_not_functions_labels_or_numbers() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (job, le) (rate(a_bucket{reason!~"x|y",le="+Inf"}[5m] offset 1m)))'
        " / on (job) group_left (instance) b_total > bool 1e-3 or up{job='c'} == 0 unless c:rec:rate1m"
    )
    assert metric_names(expr) == {"a_bucket", "b_total", "up", "c:rec:rate1m"}


def test_dashboard_has_the_panels_the_service_needs() -> None:
    titles = " | ".join(where for where, _ in dashboard_exprs()).lower()
    for wanted in ("request rate", "latency", "queue wait", "batch fill", "padding", "compute per bucket",
                   "rejections"):  # fmt: skip
        assert wanted in titles, f"no dashboard panel about {wanted!r}"


def test_every_expression_parses(promtool: str, tmp_path: Path) -> None:
    # promtool parses a rule's expr with Prometheus' own parser: one recording rule per expression.
    exprs = all_exprs()
    checks = [{"record": f"check:expr_{i}", "expr": expr} for i, (_, expr) in enumerate(exprs)]
    rules_file = tmp_path / "exprs.yml"
    rules_file.write_text(yaml.safe_dump({"groups": [{"name": "parse", "rules": checks}]}))
    run([promtool, "check", "rules", str(rules_file)])


def test_promtool_rejects_a_malformed_expression(promtool: str, tmp_path: Path) -> None:
    # The control for the test above: a missing parenthesis does fail promtool.
    rules_file = tmp_path / "bad.yml"
    bad = {"record": "check:bad", "expr": "sum(rate(cgserve_requests_total[1m])"}
    rules_file.write_text(yaml.safe_dump({"groups": [{"name": "bad", "rules": [bad]}]}))
    with pytest.raises(pytest.fail.Exception):
        run([promtool, "check", "rules", str(rules_file)])


def test_expressions_name_only_exported_or_recorded_metrics() -> None:
    exported = exported_series()
    assert "cgserve_request_duration_seconds_bucket" in exported, "app.ops.metrics did not register its histograms"
    known = exported | SCRAPE_SERIES | {r["record"] for r in rules() if "record" in r}
    problems = []
    for where, expr in all_exprs():
        names = metric_names(expr)
        if not names:
            problems.append(f"{where}: no metric name found in {expr}")
        problems += [f"{where}: {name} is neither exported nor recorded" for name in sorted(names - known)]
    assert not problems, "\n".join(problems)


def test_every_exported_metric_is_on_the_dashboard() -> None:
    families = {f.name for f in exported_families()}
    assert "nv_gpu_utilization" in families, "the GPU collector's families are not read"
    shown = set().union(*(metric_names(expr) for _, expr in dashboard_exprs()))
    unshown = sorted(f for f in families if not any(s == f or s.startswith(f + "_") for s in shown))
    assert not unshown, f"metrics in app/ops/metrics.py with no dashboard panel: {unshown}"
