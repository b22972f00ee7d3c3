"""Kubernetes manifests offline: built by kubectl's own kustomize, validated against the API's schemas.

No cluster runs in CI. `kubectl kustomize` builds each kustomization as `kubectl apply -k` would;
each built object is then checked against the schema the API server would check it against:
Kubernetes' own kinds against the OpenAPI schemas that kubernetes-validate ships (strict: unknown
fields fail, as `kubectl apply`'s server-side field validation makes them), and the custom
resources (KServe, the Prometheus Operator, KEDA) against excerpts of their CRDs kept in
tests/deploy/schemas, which name their sources.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import yaml
from referencing import Registry, Resource

from tests.deploy.deploy_tools import REPO, run

K8S = REPO / "deploy/k8s"
# What `kubectl apply -k` is pointed at (README, Running on Kubernetes).
BUILDS = {"gpu": K8S / "overlays/gpu", "cpu": K8S / "overlays/cpu", "kserve": K8S / "kserve"}
SCHEMAS = Path(__file__).parent / "schemas"
# The oldest Kubernetes deploy/k8s claims (README) and the newest kubernetes-validate knows.
KUBERNETES_VERSIONS = ("1.29", "1.37")


def build(kubectl: str, kustomization: Path) -> list[dict[str, Any]]:
    """The objects `kubectl kustomize DIR` prints, in order."""
    done = run([kubectl, "kustomize", str(kustomization)], cwd=kustomization)
    return [obj for obj in yaml.safe_load_all(done.stdout) if obj]


def kind_of(obj: dict[str, Any]) -> tuple[str, str]:
    return obj["apiVersion"], obj["kind"]


def name_of(obj: dict[str, Any]) -> str:
    return f"{obj['kind']}/{obj['metadata']['name']}"


@cache
def _definitions(version: str) -> dict[str, Any]:
    """Kubernetes' type definitions (strict: additionalProperties false) for `version`, as shipped."""
    folder = resources.files("kubernetes_validate") / "kubernetes-json-schema" / f"v{version}.0-local-strict"
    definitions: dict[str, Any] = json.loads((folder / "_definitions.json").read_text())
    return definitions


@cache
def crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) → the JSON Schema in tests/deploy/schemas that describes it."""
    schemas = {}
    for path in sorted(SCHEMAS.glob("*.yaml")):
        schema = yaml.safe_load(path.read_text())
        key = (schema["properties"]["apiVersion"]["const"], schema["properties"]["kind"]["const"])
        assert key not in schemas, f"{path.name}: a second schema for {key}"
        schemas[key] = schema
    return schemas


def _crd_errors(obj: dict[str, Any], version: str) -> Iterator[str]:
    definitions = _definitions(version)
    registry: Registry[Any] = Registry().with_resource(definitions["$id"], Resource.from_contents(definitions))
    validator = jsonschema.Draft202012Validator(crd_schemas()[kind_of(obj)], registry=registry)
    for error in validator.iter_errors(obj):
        yield f"{'.'.join(map(str, error.absolute_path)) or '(top)'}: {error.message}"


def errors(obj: dict[str, Any], version: str) -> list[str]:
    """What the API server of Kubernetes `version` (with the CRDs installed) would refuse in `obj`."""
    import kubernetes_validate

    if kind_of(obj) in crd_schemas():
        return list(_crd_errors(obj, version))
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as error:
        return [f"{'.'.join(map(str, error.path)) or '(top)'}: {error.message}"]
    except kubernetes_validate.SchemaNotFoundError as error:
        return [f"no schema: {error.message} (a custom resource needs one in {SCHEMAS.relative_to(REPO)})"]
    return []
