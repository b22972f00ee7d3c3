"""Prometheus configuration, recording rules and alerts: promtool's checks and rule unit tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tests.deploy.deploy_tools import REPO, run

PROMETHEUS = REPO / "deploy/prometheus"
RULE_FILES = sorted(str(p.relative_to(REPO)) for p in (PROMETHEUS / "rules").glob("*.yml"))
TEST_FILES = sorted(str(p.relative_to(REPO)) for p in (PROMETHEUS / "tests").glob("*.yml"))


def rules() -> list[dict[str, Any]]:
    return [
        rule
        for name in RULE_FILES
        for group in yaml.safe_load((REPO / name).read_text())["groups"]
        for rule in group["rules"]
    ]


def unit_tests() -> list[dict[str, Any]]:
    return [test for name in TEST_FILES for test in yaml.safe_load((REPO / name).read_text())["tests"]]


def test_config_is_valid(promtool: str) -> None:
    # also loads every rule file that rule_files names
    run([promtool, "check", "config", "deploy/prometheus/prometheus.yml"])


def test_rule_files_are_valid(promtool: str) -> None:
    assert RULE_FILES, "no rule files under deploy/prometheus/rules/"
    run([promtool, "check", "rules", *RULE_FILES])


def test_rule_unit_tests_pass(promtool: str) -> None:
    assert TEST_FILES, "no rule unit tests under deploy/prometheus/tests/"
    run([promtool, "test", "rules", *TEST_FILES])


def test_every_alert_is_tested_firing_and_not_firing() -> None:
    cases = [case for test in unit_tests() for case in test.get("alert_rule_test", [])]
    for alert in (r["alert"] for r in rules() if "alert" in r):
        mine = [case for case in cases if case["alertname"] == alert]
        assert any(case.get("exp_alerts") for case in mine), f"{alert}: no unit test where it fires"
        assert any(not case.get("exp_alerts") for case in mine), f"{alert}: no unit test where it stays quiet"


def test_every_recording_rule_is_tested() -> None:
    exprs = " ".join(case["expr"] for test in unit_tests() for case in test.get("promql_expr_test", []))
    untested = [r["record"] for r in rules() if "record" in r and r["record"] not in exprs]
    assert not untested, f"recording rules without a promql_expr_test: {untested}"


def test_recording_rules_cover_latency_and_queue_wait_quantiles() -> None:
    recorded = {r["record"]: r["expr"] for r in rules() if "record" in r}
    for metric in ("cgserve_request_duration_seconds", "cgserve_queue_wait_seconds"):
        for quantile, name in (("0.50", "p50"), ("0.99", "p99")):
            expr = recorded[f"job:{metric}:{name}_rate1m"]
            assert expr.startswith(f"histogram_quantile({quantile},") and f"rate({metric}_bucket[" in expr


def test_alerts_carry_severity_and_text(tmp_path: Path) -> None:
    for rule in (r for r in rules() if "alert" in r):
        assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule["alert"]
