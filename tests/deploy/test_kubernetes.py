"""deploy/k8s as kubectl builds it: every object valid for the API server, and what the objects must
say to each other and to the service for it to start, serve, drain and scale (how: kube.py)."""

from __future__ import annotations

import math
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.config import Settings
from tests.deploy.deploy_tools import REPO, run
from tests.deploy.kube import BUILDS, K8S, KUBERNETES_VERSIONS, build, errors, name_of

Objects = list[dict[str, Any]]
WORKLOADS = ("gpu", "cpu")  # the overlays: a Deployment of our own
# Settings the service is getting (README, Running on Kubernetes): set in the ConfigMap already,
# checked as the others are once app/config.py has them.
COMING_SETTINGS: set[str] = set()  # settings the manifests name before app/config.py has them
START_COMMAND = ["cudagraph-serve", "serve", "--host", "0.0.0.0"]


@pytest.fixture(scope="module")
def built(kubectl: str) -> dict[str, Objects]:
    return {name: build(kubectl, path) for name, path in BUILDS.items()}


def one(objects: Objects, kind: str) -> dict[str, Any]:
    (found,) = [obj for obj in objects if obj["kind"] == kind]
    return found


def pod_spec(objects: Objects) -> dict[str, Any]:
    spec: dict[str, Any] = one(objects, "Deployment")["spec"]["template"]["spec"]
    return spec


def server(objects: Objects) -> dict[str, Any]:
    (container,) = [c for c in pod_spec(objects)["containers"] if c["name"] == "server"]
    return container


def settings_env(objects: Objects) -> dict[str, str]:
    """The variables the server container gets: its ConfigMap (envFrom) and its own env."""
    container = server(objects)
    env: dict[str, str] = {}
    configmaps = {obj["metadata"]["name"]: obj for obj in objects if obj["kind"] == "ConfigMap"}
    for source in container.get("envFrom", []):
        env |= configmaps[source["configMapRef"]["name"]]["data"]
    return env | {var["name"]: var["value"] for var in container.get("env", [])}


def percent_of(value: int | str, total: int) -> int:
    """A PodDisruptionBudget's or rolling update's int-or-percent, as pods (percentages round up)."""
    if isinstance(value, str) and value.endswith("%"):
        return math.ceil(total * int(value[:-1]) / 100)
    return int(value)


# --- the builds, and every object against its schema ----------------------------------------


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("target", BUILDS)
def test_every_object_validates(
    built: dict[str, Objects], kubernetes_validate: None, target: str, version: str
) -> None:
    problems = [f"{name_of(obj)}: {problem}" for obj in built[target] for problem in errors(obj, version)]
    assert not problems, "\n".join(problems)


def test_each_build_holds_its_objects_in_one_namespace(built: dict[str, Objects]) -> None:
    kinds = {target: sorted(obj["kind"] for obj in objects) for target, objects in built.items()}
    workload = sorted(["Namespace", "ConfigMap", "Service", "Deployment", "PodDisruptionBudget"])
    workload = sorted([*workload, "ServiceMonitor", "ScaledObject"])
    assert kinds == {"gpu": workload, "cpu": workload, "kserve": ["InferenceService", "Namespace", "ServingRuntime"]}
    for target, objects in built.items():
        namespace = one(objects, "Namespace")["metadata"]["name"]
        elsewhere = [
            name_of(o) for o in objects if o["kind"] != "Namespace" and o["metadata"]["namespace"] != namespace
        ]
        assert not elsewhere, f"{target}: outside namespace {namespace}: {elsewhere}"


# Controls: a copy of deploy/k8s with one mistake, built by kubectl and validated as above.
BREAKAGES = {
    "core-field-misspelt": (
        "base/deployment.yaml",
        "readOnlyRootFilesystem: true",
        "readOnlyRootFileSystem: true",
        "readOnlyRootFileSystem",
    ),
    "core-required-field-misspelt": (
        "base/deployment.yaml",
        "containerPort: 8000",
        "containerport: 8000",
        "'containerPort' is a required property",
    ),
    "core-field-wrong-type": (
        "base/deployment.yaml",
        "terminationGracePeriodSeconds: 45",
        "terminationGracePeriodSeconds: soon",
        "soon",
    ),
    "servicemonitor-field-misspelt": ("base/servicemonitor.yaml", "path: /metrics", "paths: /metrics", "paths"),
    "servicemonitor-bad-interval": ("base/servicemonitor.yaml", "interval: 5s", "interval: 5 seconds", "5 seconds"),
    "scaledobject-number-in-metadata": ("base/scaledobject.yaml", 'threshold: "64"', "threshold: 64", "64"),
    "scaledobject-without-target": (
        "base/scaledobject.yaml",
        "scaleTargetRef:\n    name: cgserve\n",
        "",
        "scaleTargetRef",
    ),
    "servingruntime-priority-zero": ("kserve/servingruntime.yaml", "priority: 1}", "priority: 0}", "minimum"),
    "servingruntime-container-field-misspelt": (
        "kserve/servingruntime.yaml",
        "readinessProbe:",
        "readynessProbe:",
        "readynessProbe",
    ),
    "inferenceservice-unknown-scale-metric": (
        "kserve/inferenceservice.yaml",
        "scaleMetric: cpu",
        "scaleMetric: gpu",
        "'gpu'",
    ),
    # KServe's webhook validates any mode but Standard as Knative's, whose metrics are concurrency and rps.
    "inferenceservice-raw-deployment-on-cpu": (
        "kserve/inferenceservice.yaml",
        "deploymentMode: Standard",
        "deploymentMode: RawDeployment",
        "'cpu' is not one of ['concurrency', 'rps']",
    ),
    "inferenceservice-hpa-on-requests": (
        "kserve/inferenceservice.yaml",
        "scaleMetric: cpu",
        "scaleMetric: rps",
        "'rps' is not one of ['cpu', 'memory']",
    ),
    "inferenceservice-without-model-format": (
        "kserve/inferenceservice.yaml",
        "      modelFormat:\n        name: pytorch\n",
        "",
        "modelFormat",
    ),
}


@pytest.mark.parametrize("breakage", BREAKAGES)
def test_a_broken_manifest_fails_validation(
    kubectl: str, kubernetes_validate: None, tmp_path: Path, breakage: str
) -> None:
    file, old, new, expected = BREAKAGES[breakage]
    copy = tmp_path / "k8s"
    shutil.copytree(K8S, copy)
    text = (copy / file).read_text()
    assert old in text, f"{file} no longer has {old!r}: update this control"
    (copy / file).write_text(text.replace(old, new, 1))
    objects = build(kubectl, copy / ("kserve" if file.startswith("kserve/") else "overlays/gpu"))
    problems = [f"{name_of(obj)}: {p}" for obj in objects for p in errors(obj, KUBERNETES_VERSIONS[-1])]
    assert any(expected in p for p in problems), f"no problem naming {expected!r} in {problems}"


def test_a_kustomization_naming_a_missing_file_does_not_build(kubectl: str, tmp_path: Path) -> None:
    copy = tmp_path / "k8s"
    shutil.copytree(K8S, copy)
    kustomization = copy / "base/kustomization.yaml"
    kustomization.write_text(kustomization.read_text().replace("  - pdb.yaml\n", "  - pdb.yml\n"))
    with pytest.raises(pytest.fail.Exception, match=r"pdb\.yml"):
        build(kubectl, copy / "overlays/cpu")


# --- the workload: device, settings, security, probes, shutdown -----------------------------


def test_gpu_pods_take_one_gpu_and_insist_on_cuda(built: dict[str, Objects]) -> None:
    container = server(built["gpu"])
    for bound in ("requests", "limits"):
        assert container["resources"][bound]["nvidia.com/gpu"] == "1", bound
    assert settings_env(built["gpu"])["CGSERVE_DEVICE"] == "cuda"
    assert container["image"].endswith(":gpu")
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod_spec(built["gpu"])[
        "tolerations"
    ]


def test_cpu_pods_take_no_gpu(built: dict[str, Objects]) -> None:
    for container in pod_spec(built["cpu"])["containers"] + pod_spec(built["cpu"])["initContainers"]:
        assert not any("gpu" in name for bound in container["resources"].values() for name in bound), container["name"]
        assert container["image"].endswith(":cpu")
    assert settings_env(built["cpu"])["CGSERVE_DEVICE"] == "cpu"


@pytest.mark.parametrize("target", WORKLOADS)
def test_the_configmap_is_a_valid_configuration_of_the_service(
    built: dict[str, Objects], target: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Settings ignores unknown CGSERVE_ variables, so a misspelt one would be dropped silently.
    env = settings_env(built[target])
    fields = {name.removeprefix("CGSERVE_").lower(): value for name, value in env.items()}
    assert all(name.startswith("CGSERVE_") for name in env), sorted(env)
    unknown = sorted(set(fields) - set(Settings.model_fields) - COMING_SETTINGS)
    assert not unknown, f"not settings of app/config.py: {unknown}"
    # The real Settings reads them (the repository is a volume here: a folder stands in for it).
    for name in list(os.environ):
        if name.startswith("CGSERVE_"):
            monkeypatch.delenv(name)
    known = {k: v for k, v in fields.items() if k in Settings.model_fields}
    settings = Settings(_env_file=None, **(known | {"model_repository": tmp_path}))  # type: ignore[call-arg]
    assert (settings.port, settings.grpc_port) == (8000, 8001)


@pytest.mark.parametrize("target", WORKLOADS)
def test_the_grace_period_outlasts_drain_and_shutdown(built: dict[str, Objects], target: str) -> None:
    env = settings_env(built[target])
    drain_and_shutdown = float(env["CGSERVE_DRAIN_SECONDS"]) + float(env["CGSERVE_SHUTDOWN_TIMEOUT_S"])
    assert pod_spec(built[target])["terminationGracePeriodSeconds"] > drain_and_shutdown


def security_problems(pod: dict[str, Any], container: dict[str, Any]) -> list[str]:
    """How `container` is not locked down: read-only root, no privileges, the image's non-root user."""
    problems = []
    security = container.get("securityContext", {})
    if not security.get("readOnlyRootFilesystem"):
        problems.append("root file system not read-only")
    if security.get("allowPrivilegeEscalation", True) or security.get("capabilities", {}).get("drop") != ["ALL"]:
        problems.append("may escalate privileges or keeps capabilities")
    user = {**pod.get("securityContext", {}), **security}
    if not user.get("runAsNonRoot") or user.get("runAsUser") != 10001:
        problems.append(f"not the image's non-root user 10001: {user}")
    return problems


def storage_problems(pod: dict[str, Any], container: dict[str, Any], env: dict[str, str]) -> list[str]:
    """Where the service, configured by `env`, writes or reads that is not a volume of `container`."""
    problems = []
    volumes = {v["name"] for v in pod.get("volumes", [])}
    mounts = {m["mountPath"]: m for m in container.get("volumeMounts", [])}
    problems += [f"mount of undeclared volume {m['name']}" for m in mounts.values() if m["name"] not in volumes]

    def mount_of(path: str) -> dict[str, Any] | None:
        found = [m for p, m in mounts.items() if Path(path).is_relative_to(p)]
        return max(found, key=lambda m: len(m["mountPath"])) if found else None

    writable = ["/tmp", "/home/cgserve"]  # tempfiles (Prometheus' multiprocess files too), $HOME
    writable += [env[name] for name in ("CGSERVE_COMPILE_CACHE_DIR",) if name in env]
    for path in writable:
        mount = mount_of(path)
        if mount is None or mount.get("readOnly"):
            problems.append(f"{path} is not on a writable volume")
    if "CGSERVE_MODEL_REPOSITORY" in env and mount_of(env["CGSERVE_MODEL_REPOSITORY"]) is None:
        problems.append(f"the model repository {env['CGSERVE_MODEL_REPOSITORY']} is not a volume")
    return problems


@pytest.mark.parametrize("target", WORKLOADS)
def test_pods_run_unprivileged_on_a_read_only_root(built: dict[str, Objects], target: str) -> None:
    pod, env = pod_spec(built[target]), settings_env(built[target])
    assert pod["enableServiceLinks"] is False, "a Service named cgserve would set CGSERVE_PORT=tcp://…"
    assert pod["securityContext"]["fsGroup"] == 10001, "emptyDirs and claims writable by the service's user"
    problems = {c["name"]: security_problems(pod, c) for c in pod["containers"] + pod.get("initContainers", [])}
    assert problems == {"server": [], "seed-models": []}
    assert storage_problems(pod, server(built[target]), env) == []


@pytest.mark.parametrize("target", WORKLOADS)
def test_probes_cover_start_up_then_gate_traffic_and_restart_a_dead_server(
    built: dict[str, Objects], target: str
) -> None:
    container, env = server(built[target]), settings_env(built[target])
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": int(env["CGSERVE_PORT"]), "grpc": int(env["CGSERVE_GRPC_PORT"])}
    paths = {}
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        probe = container[kind]
        assert probe["httpGet"]["port"] == "http", kind
        paths[kind] = probe["httpGet"]["path"]
    assert paths == {"startupProbe": "/readyz", "readinessProbe": "/readyz", "livenessProbe": "/healthz"}
    # Liveness waits for the first ready: capture and validation get the startup probe's budget,
    # at least ten times the 60 s of ResNet-50's cold inductor compile on the H200.
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600


def test_a_rollout_never_lowers_capacity(built: dict[str, Objects]) -> None:
    for target in WORKLOADS:
        deployment = one(built[target], "Deployment")
        assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
        assert "replicas" not in deployment["spec"], "the ScaledObject owns the replica count"


# --- how the objects find each other ----------------------------------------------------------


def subset(labels: dict[str, str], of: dict[str, str]) -> bool:
    return labels.items() <= of.items()


@pytest.mark.parametrize("target", WORKLOADS)
def test_the_service_reaches_both_protocols_and_is_the_prometheus_job(built: dict[str, Objects], target: str) -> None:
    objects = built[target]
    service, pod_labels = one(objects, "Service"), one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert subset(service["spec"]["selector"], pod_labels)
    assert {p["name"]: (p["port"], p["targetPort"]) for p in service["spec"]["ports"]} == {
        "http": (8000, "http"),
        "grpc": (8001, "grpc"),
    }
    # The Operator labels scraped series job=<Service name>; the rules and alerts of
    # deploy/prometheus (up{job="cgserve"}) are written for the compose job of that name.
    prometheus = yaml.safe_load((REPO / "deploy/prometheus/prometheus.yml").read_text())
    assert service["metadata"]["name"] in {job["job_name"] for job in prometheus["scrape_configs"]}


@pytest.mark.parametrize("target", WORKLOADS)
def test_the_servicemonitor_scrapes_the_service_metrics(built: dict[str, Objects], target: str) -> None:
    objects = built[target]
    service, monitor = one(objects, "Service"), one(objects, "ServiceMonitor")
    assert subset(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
    assert monitor["metadata"]["namespace"] == service["metadata"]["namespace"]  # no namespaceSelector: its own
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"


@pytest.mark.parametrize("target", WORKLOADS)
def test_a_drain_at_minimum_scale_leaves_a_pod_serving(built: dict[str, Objects], target: str) -> None:
    objects = built[target]
    pdb, scaled = one(objects, "PodDisruptionBudget"), one(objects, "ScaledObject")
    assert subset(pdb["spec"]["selector"]["matchLabels"], pod_spec_labels(objects))
    fewest = scaled["spec"]["minReplicaCount"]
    assert percent_of(pdb["spec"]["maxUnavailable"], fewest) < fewest


def pod_spec_labels(objects: Objects) -> dict[str, str]:
    labels: dict[str, str] = one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    return labels


def queue_depth_trigger(objects: Objects) -> dict[str, Any]:
    (trigger,) = [t for t in one(objects, "ScaledObject")["spec"]["triggers"] if t["type"] == "prometheus"]
    return trigger


@pytest.mark.parametrize("target", WORKLOADS)
def test_the_scaledobject_scales_this_deployment_on_its_own_pods(built: dict[str, Objects], target: str) -> None:
    objects = built[target]
    scaled = one(objects, "ScaledObject")
    assert scaled["spec"]["scaleTargetRef"]["name"] == one(objects, "Deployment")["metadata"]["name"]
    assert 2 <= scaled["spec"]["minReplicaCount"] <= scaled["spec"]["maxReplicaCount"]
    trigger = queue_depth_trigger(objects)
    assert trigger.get("metricType", "AverageValue") == "AverageValue", "the total divided by the replicas"
    assert float(trigger["metadata"]["threshold"]) > 0
    # The query selects the series the Operator's scrape of this Service makes: its namespace, and
    # job = the Service's name.
    matchers = dict(re.findall(r'(\w+)="([^"]*)"', trigger["metadata"]["query"]))
    service = one(objects, "Service")["metadata"]
    assert {k: matchers.get(k) for k in ("namespace", "job")} == {
        "namespace": service["namespace"],
        "job": service["name"],
    }


def test_the_autoscaling_query_sums_this_deployments_pods_alone(
    built: dict[str, Objects], promtool: str, tmp_path: Path
) -> None:
    # Prometheus' own engine (promtool test rules) evaluates the query on series as the Operator's
    # scrape would label them: two pods of ours, one of another job, one in another namespace.
    query = queue_depth_trigger(built["gpu"])["metadata"]["query"]
    series = {
        '{namespace="cgserve", job="cgserve", pod="cgserve-a", model="fashion-cnn"}': "100+0x20",
        '{namespace="cgserve", job="cgserve", pod="cgserve-b", model="fashion-cnn"}': "20+0x20",
        '{namespace="cgserve", job="other", pod="other-a", model="fashion-cnn"}': "500+0x20",
        '{namespace="elsewhere", job="cgserve", pod="cgserve-c", model="fashion-cnn"}': "1000+0x20",
    }
    tests = {
        "rule_files": [],
        "evaluation_interval": "15s",
        "tests": [
            {
                "interval": "15s",
                "input_series": [{"series": f"cgserve_queue_depth_rows{k}", "values": v} for k, v in series.items()],
                "promql_expr_test": [
                    {"expr": query, "eval_time": "3m", "exp_samples": [{"labels": "{}", "value": 120}]}
                ],
            }
        ],
    }
    path = tmp_path / "query.test.yml"
    path.write_text(yaml.safe_dump(tests))
    run([promtool, "test", "rules", str(path)])
    # KEDA divides by the replicas: 120 rows over 2 pods against a threshold of 64 asks for ceil(120/64) = 2.


# --- KServe ------------------------------------------------------------------------------------


def test_the_serving_runtime_runs_our_image_over_the_v2_protocol(built: dict[str, Objects]) -> None:
    runtime = one(built["kserve"], "ServingRuntime")["spec"]
    (container,) = runtime["containers"]
    # The Dockerfile's own start command, for KServe, which replaces the image's CMD with args.
    cmd = re.findall(r"^CMD (\[.*\])$", (REPO / "Dockerfile").read_text(), flags=re.M)
    assert [yaml.safe_load(c) for c in cmd] == [START_COMMAND, START_COMMAND]
    assert container["args"] == START_COMMAND
    assert container["image"].endswith(":gpu")
    env = {var["name"]: var["value"] for var in container["env"]}
    # KServe's Service sends port 80 to the first port: HTTP (the v2 REST form); gRPC is the second.
    assert [p["containerPort"] for p in container["ports"]] == [int(env["CGSERVE_PORT"]), int(env["CGSERVE_GRPC_PORT"])]
    assert set(runtime["protocolVersions"]) == {"v2", "grpc-v2"}
    assert {f["name"]: f.get("autoSelect") for f in runtime["supportedModelFormats"]} == {"pytorch": True, "onnx": True}
    pod = {"securityContext": {}, "volumes": runtime["volumes"]}
    assert security_problems(pod, container) == []
    assert storage_problems(pod, container, env | {"CGSERVE_COMPILE_CACHE_DIR": "/var/cache/cgserve/inductor"}) == []


def test_the_inference_service_serves_the_shipped_model_through_the_runtime(built: dict[str, Objects]) -> None:
    service, runtime = one(built["kserve"], "InferenceService"), one(built["kserve"], "ServingRuntime")
    predictor = service["spec"]["predictor"]
    model = predictor["model"]
    assert model["runtime"] == runtime["metadata"]["name"]
    assert model["modelFormat"]["name"] in {f["name"] for f in runtime["spec"]["supportedModelFormats"]}
    assert model["protocolVersion"] in runtime["spec"]["protocolVersions"]
    # KServe routes /v2/models/<InferenceService name>; the image's repository has that model.
    name = service["metadata"]["name"]
    assert "storageUri" not in model
    assert (REPO / "models/repository" / name / "model.toml").is_file(), f"the image ships no model {name}"
    assert model["resources"]["limits"]["nvidia.com/gpu"] == "1"
    env = {var["name"]: float(var["value"]) for var in runtime["spec"]["containers"][0]["env"] if "_S" in var["name"]}
    assert predictor["terminationGracePeriodSeconds"] > env["CGSERVE_DRAIN_SECONDS"] + env["CGSERVE_SHUTDOWN_TIMEOUT_S"]
    assert predictor["enableServiceLinks"] is False
    # Deployment, Service and HPA (no Knative, no scale to zero), scaled on CPU by Kubernetes' HPA.
    annotations = service["metadata"]["annotations"]
    assert annotations["serving.kserve.io/deploymentMode"] == "Standard"
    assert (annotations["serving.kserve.io/autoscalerClass"], predictor["scaleMetric"]) == ("hpa", "cpu")
    # A storageUri takes the place of the seed: the service serves /mnt/models when it exists and
    # no repository is set, so the runtime must not set one.
    container = runtime["spec"]["containers"][0]
    assert "CGSERVE_MODEL_REPOSITORY" not in {var["name"] for var in container["env"]}


def gpu_with_component(kubectl: str, tmp_path: Path, component: str) -> Objects:
    """The gpu overlay with deploy/k8s/components/`component`, as its comment says to add it, built and valid."""
    copy = tmp_path / "k8s"
    shutil.copytree(K8S, copy)
    overlay = copy / f"overlays/gpu-{component}"
    overlay.mkdir()
    kustomization = {"resources": ["../gpu"], "components": [f"../../components/{component}"]}
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    objects = build(kubectl, overlay)
    problems = [f"{name_of(obj)}: {p}" for obj in objects for p in errors(obj, KUBERNETES_VERSIONS[-1])]
    assert not problems, "\n".join(problems)
    return objects


# --- the model repository on a claim ----------------------------------------------------------


def test_the_models_pvc_component_serves_the_repository_from_a_claim(
    kubectl: str, kubernetes_validate: None, tmp_path: Path
) -> None:
    objects = gpu_with_component(kubectl, tmp_path, "models-pvc")
    claim, pod = one(objects, "PersistentVolumeClaim"), pod_spec(objects)
    assert claim["metadata"]["namespace"] == one(objects, "Deployment")["metadata"]["namespace"]
    (models,) = [v for v in pod["volumes"] if v["name"] == "models"]
    assert models == {
        "name": "models",
        "persistentVolumeClaim": {"claimName": claim["metadata"]["name"], "readOnly": True},
    }
    assert not pod.get("initContainers"), "nothing seeds a claim the pods only read"
    assert storage_problems(pod, server(objects), settings_env(objects)) == []


# --- the front door -----------------------------------------------------------------------------


def test_the_front_door_component_opens_the_doors_port_on_the_pod_and_the_service(
    kubectl: str, kubernetes_validate: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    objects = gpu_with_component(kubectl, tmp_path, "front-door")
    # The settings are the service's and it accepts them together (the door needs the engines in its process).
    for name in list(os.environ):
        if name.startswith("CGSERVE_"):
            monkeypatch.delenv(name)
    fields = {name.removeprefix("CGSERVE_").lower(): value for name, value in settings_env(objects).items()}
    settings = Settings(_env_file=None, **(fields | {"model_repository": tmp_path}))  # type: ignore[call-arg]
    assert settings.front_door_port == 8002 and settings.workers == 1
    ports = {port["name"]: port["containerPort"] for port in server(objects)["ports"]}
    door_ports = {"door": settings.front_door_port, "door-grpc": settings.front_door_grpc_port}
    assert ports == {"http": settings.port, "grpc": settings.grpc_port, **door_ports} and 0 not in ports.values()
    service = {port["name"]: port for port in one(objects, "Service")["spec"]["ports"]}
    assert set(service) == {"http", "grpc", "door", "door-grpc"}
    for name, port in door_ports.items():
        assert service[name]["targetPort"] == name and service[name]["port"] == port
