"""deploy/k8s/components/tls as an overlay uses it: the cpu overlay with the component and its Secret
(a kubernetes.io/tls one from a secretGenerator, as the component's comment shows), built by kubectl,
valid for the API server, and consistent: the Secret mounted read-only where the settings look, its
keys the files they name (the real Settings loads them as a pair), probes and scrapes over https."""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from app.config import Settings
from tests.deploy.kube import K8S, KUBERNETES_VERSIONS, build, errors, name_of

Objects = list[dict[str, Any]]
SECRET = "cgserve-tls"

OVERLAY = f"""\
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources: [../cpu]
components: [../../components/tls]
secretGenerator:
  - name: {SECRET}
    namespace: cgserve
    type: kubernetes.io/tls
    files: [tls.crt=server.crt, tls.key=server.key, ca.crt=server.crt]
    options: {{disableNameSuffixHash: true}}
"""


@pytest.fixture(scope="module")
def objects(kubectl: str, tmp_path_factory: pytest.TempPathFactory) -> Objects:
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command line")
    copy = tmp_path_factory.mktemp("tls") / "k8s"
    shutil.copytree(K8S, copy)
    overlay = copy / "overlays/tls"
    overlay.mkdir()
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", "server.key", "-out", "server.crt", "-days", "1", "-subj", "/CN=cgserve.cgserve.svc"],
        cwd=overlay, check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    (overlay / "kustomization.yaml").write_text(OVERLAY)
    return build(kubectl, overlay)


def one(objects: Objects, kind: str) -> dict[str, Any]:
    (found,) = [obj for obj in objects if obj["kind"] == kind]
    return found


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_object_validates(objects: Objects, kubernetes_validate: None, version: str) -> None:
    problems = [f"{name_of(obj)}: {problem}" for obj in objects for problem in errors(obj, version)]
    assert not problems, "\n".join(problems)


def test_the_secret_is_mounted_read_only_where_the_settings_read_it(
    objects: Objects, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    (server,) = [c for c in pod["containers"] if c["name"] == "server"]
    volume = {v["name"]: v for v in pod["volumes"]}["tls"]
    assert volume["secret"]["secretName"] == SECRET
    assert volume["secret"]["defaultMode"] & 0o077 == 0o040, "readable by the service's group (fsGroup), not others"
    (mount,) = [m for m in server["volumeMounts"] if m["name"] == "tls"]
    assert mount["readOnly"] is True
    # The Secret's keys, written out as the kubelet projects them, are the files the settings name.
    secret = one(objects, "Secret")
    assert secret["type"] == "kubernetes.io/tls"
    for key, value in secret.get("data", {}).items():
        (tmp_path / key).write_bytes(base64.b64decode(value))
    for key, value in secret.get("stringData", {}).items():
        (tmp_path / key).write_text(value)
    env = one(objects, "ConfigMap")["data"]
    files = {name: value for name, value in env.items() if name.startswith("CGSERVE_TLS_")}
    assert set(files) == {"CGSERVE_TLS_CERT_FILE", "CGSERVE_TLS_KEY_FILE"}
    for name in list(os.environ):
        if name.startswith("CGSERVE_"):
            monkeypatch.delenv(name)
    local = {
        name.removeprefix("CGSERVE_").lower(): str(tmp_path / Path(path).relative_to(mount["mountPath"]))
        for name, path in files.items()
    }
    settings = Settings(_env_file=None, model_repository=tmp_path, **local)  # type: ignore[call-arg]
    assert settings.tls_cert_file is not None and settings.tls_key_file is not None


def test_probes_and_the_scrape_ask_over_https(objects: Objects) -> None:
    (server,) = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert server[kind]["httpGet"]["scheme"] == "HTTPS", kind
    (endpoint,) = one(objects, "ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"]["ca"]["secret"] == {"name": SECRET, "key": "ca.crt"}
