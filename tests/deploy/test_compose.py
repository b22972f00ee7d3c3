"""docker-compose.yml and its CPU override: valid Compose, and consistent with the other files.

No Docker engine runs in CI, so this is offline: the compose-spec JSON schema (check-jsonschema's
vendored copy), Compose's merge rules applied here to the CPU override, and cross-file checks.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.deploy_tools import REPO, run

BASE = "docker-compose.yml"
CPU = "docker-compose.cpu.yml"


class Reset:
    """Compose's `!reset VALUE` (Compose >= 2.24.4): drop the key from what the files before set."""

    def __init__(self, value: Any) -> None:
        self.value = value


class Override:
    """Compose's `!override VALUE`: replace what the files before set instead of merging."""

    def __init__(self, value: Any) -> None:
        self.value = value


class ComposeLoader(yaml.SafeLoader):
    pass


def _tagged(kind: type) -> Any:
    def construct(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
        if isinstance(node, yaml.MappingNode):
            return kind(loader.construct_mapping(node, deep=True))
        if isinstance(node, yaml.SequenceNode):
            return kind(loader.construct_sequence(node, deep=True))
        return kind(loader.construct_scalar(node) or None)  # type: ignore[arg-type]

    return construct


ComposeLoader.add_constructor("!reset", _tagged(Reset))
ComposeLoader.add_constructor("!override", _tagged(Override))


def load(name: str) -> Any:
    return yaml.load((REPO / name).read_text(), Loader=ComposeLoader)  # a SafeLoader with two tags added


def untagged(node: Any) -> Any:
    """The file as it reads without Compose's merge tags (what the schema sees)."""
    if isinstance(node, Reset | Override):
        return untagged(node.value)
    if isinstance(node, dict):
        return {k: untagged(v) for k, v in node.items()}
    if isinstance(node, list):
        return [untagged(v) for v in node]
    return node


# Sequences that a later file replaces instead of extending (compose-spec, "Merge and override").
REPLACED = {("command",), ("entrypoint",), ("healthcheck", "test")}


def merge(base: Any, override: Any, path: tuple[str, ...] = ()) -> Any:
    """Compose's merge of `override` onto `base`, for the shapes these files use."""
    if isinstance(override, Override):
        return untagged(override.value)
    if isinstance(base, dict) and isinstance(override, dict):
        merged = dict(base)
        for key, value in override.items():
            if isinstance(value, Reset):
                merged.pop(key, None)
            elif key in merged:
                merged[key] = merge(merged[key], value, (*path, key))
            else:
                merged[key] = untagged(value)
        return merged
    if isinstance(base, list) and isinstance(override, list) and path[-2:] not in REPLACED:
        return base + untagged(override)
    return untagged(override)


def validate(check_jsonschema: list[str], model: Any, tmp_path: Path, name: str) -> None:
    target = tmp_path / name
    target.write_text(json.dumps(model))
    run([*check_jsonschema, "--builtin-schema", "vendor.compose-spec", str(target)])


def gpu_devices(service: dict[str, Any]) -> list[dict[str, Any]]:
    devices = service.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])
    return [d for d in devices if d.get("driver") == "nvidia" or "gpu" in d.get("capabilities", [])]


def test_compose_file_is_valid(check_jsonschema: list[str]) -> None:
    run([*check_jsonschema, "--builtin-schema", "vendor.compose-spec", BASE])


def test_cpu_override_and_merged_model_are_valid(check_jsonschema: list[str], tmp_path: Path) -> None:
    # check-jsonschema's YAML loader does not know `!reset`, so the file is given to it resolved:
    # on its own (tags dropped) and merged onto docker-compose.yml, as `docker compose` merges.
    validate(check_jsonschema, untagged(load(CPU)), tmp_path, "cpu-alone.json")
    validate(check_jsonschema, merge(load(BASE), load(CPU)), tmp_path, "cpu-merged.json")


def test_schema_check_rejects_a_misspelt_key(check_jsonschema: list[str], tmp_path: Path) -> None:
    # The control: the schema is strict enough to notice a wrong key (so a pass above means something).
    broken = load(BASE)
    broken["services"]["api"]["healtcheck"] = broken["services"]["api"].pop("healthcheck")
    with pytest.raises(pytest.fail.Exception):
        validate(check_jsonschema, broken, tmp_path, "broken.json")


def test_api_reserves_one_gpu_and_is_health_checked_on_readyz() -> None:
    api = load(BASE)["services"]["api"]
    assert gpu_devices(api) == [{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]
    assert "profiles" not in api, "`docker compose up` must start the api"
    assert any("/readyz" in part for part in api["healthcheck"]["test"])
    env = api["environment"]
    assert env["CGSERVE_PORT"] == "8000" and any(p.endswith(":8000") for p in api["ports"])
    assert all(key.startswith("CGSERVE_") for key in env), "configuration is CGSERVE_* variables"


def test_cpu_override_drops_the_gpu_and_selects_the_cpu() -> None:
    base, merged = load(BASE), merge(load(BASE), load(CPU))
    assert gpu_devices(merged["services"]["api"]) == []
    assert merged["services"]["api"]["environment"]["CGSERVE_DEVICE"] == "cpu"
    # everything else is the GPU stack's
    assert merged["services"].keys() == base["services"].keys()
    for name in base["services"].keys() - {"api"}:
        assert merged["services"][name] == base["services"][name]


def test_bind_mounts_exist_and_configs_point_at_each_other() -> None:
    services = load(BASE)["services"]
    mounts: dict[str, str] = {}
    for service in services.values():
        for volume in service.get("volumes", []):
            source, target = volume.split(":")[:2]
            if source.startswith("./"):
                assert (REPO / source).exists(), f"bind mount {source} does not exist"
                mounts[source] = target
    # Prometheus scrapes the api service on its container port.
    prometheus = yaml.safe_load((REPO / "deploy/prometheus/prometheus.yml").read_text())
    (job,) = [j for j in prometheus["scrape_configs"] if j["job_name"] == "cgserve"]
    assert job["static_configs"][0]["targets"] == ["api:8000"]
    assert "./deploy/prometheus/rules" in mounts and "rules/*.yml" in prometheus["rule_files"]
    assert mounts["./deploy/prometheus/rules"] == "/etc/prometheus/rules"
    # Grafana's datasource is the prometheus service; the dashboard provider reads the mounted folder.
    datasources = yaml.safe_load((REPO / "deploy/grafana/provisioning/datasources/prometheus.yml").read_text())
    assert datasources["datasources"][0]["url"] == "http://prometheus:9090"
    assert "9090:9090" in services["prometheus"]["ports"]
    providers = yaml.safe_load((REPO / "deploy/grafana/provisioning/dashboards/cudagraph-serve.yml").read_text())
    assert providers["providers"][0]["options"]["path"] == mounts["./deploy/grafana/dashboards"]
    assert mounts["./deploy/grafana/provisioning"] == "/etc/grafana/provisioning"
    home = services["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    inside = Path(home).relative_to(mounts["./deploy/grafana/dashboards"])
    assert (REPO / "deploy/grafana/dashboards" / inside).is_file(), home
