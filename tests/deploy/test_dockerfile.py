"""The image: hadolint-clean, cache-friendly layer order, non-root, health-checked on /readyz."""

from __future__ import annotations

import fnmatch
import json
import re
import tomllib

from tests.deploy.deploy_tools import REPO, run


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n", " ", (REPO / "Dockerfile").read_text())
    out = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, args = line.partition(" ")
            out.append((word.upper(), args.strip()))
    return out


def test_hadolint_is_clean(hadolint: str) -> None:
    run([hadolint, "--failure-threshold", "warning", "Dockerfile"])


def test_base_is_a_pinned_cuda_runtime_image() -> None:
    (image,) = [args for word, args in instructions() if word == "FROM"]
    assert ":" in image and not image.endswith(":latest"), image
    assert "cuda" in image and "runtime" in image, f"{image}: expected a CUDA runtime image"


def test_dependencies_are_installed_before_the_code_is_copied() -> None:
    steps = instructions()
    index = {
        "pyproject": next(i for i, (w, a) in enumerate(steps) if w == "COPY" and "pyproject.toml" in a),
        "deps": next(i for i, (w, a) in enumerate(steps) if w == "RUN" and "pip install" in a),
        "code": next(i for i, (w, a) in enumerate(steps) if w == "COPY" and "app/" in a),
    }
    assert index["pyproject"] < index["deps"] < index["code"], index


def test_runs_as_a_non_root_user_after_the_last_install() -> None:
    steps = instructions()
    users = [i for i, (w, _) in enumerate(steps) if w == "USER"]
    assert users, "no USER: the service would run as root"
    user = steps[users[-1]][1].split(":")[0]
    assert user not in ("root", "0"), user
    last_run = max(i for i, (w, _) in enumerate(steps) if w == "RUN")
    assert users[-1] > last_run, "USER must follow the last RUN (installs need root, serving does not)"


def test_healthcheck_probes_readyz() -> None:
    (check,) = [args for word, args in instructions() if word == "HEALTHCHECK"]
    assert "/readyz" in check and "CMD" in check, check


def test_cmd_is_the_documented_start_command() -> None:
    (cmd,) = [args for word, args in instructions() if word == "CMD"]
    assert json.loads(cmd) == ["cudagraph-serve", "serve", "--host", "0.0.0.0"]
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert "cudagraph-serve" in scripts, "the CMD's console script must be declared in pyproject.toml"
    (expose,) = [args for word, args in instructions() if word == "EXPOSE"]
    assert expose == "8000", "CGSERVE_PORT's default is 8000; compose and Prometheus expect it"


def ignored(path: str, patterns: list[str]) -> bool:
    """Whether .dockerignore leaves `path` (or a folder above it) out of the build context."""
    parts = path.strip("/").split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    result = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").strip("/")
        bare = pattern.removeprefix("**/")
        if any(fnmatch.fnmatchcase(p, pattern) or fnmatch.fnmatchcase(p.split("/")[-1], bare) for p in prefixes):
            result = not negate
    return result


def test_everything_copied_exists_and_is_in_the_build_context() -> None:
    patterns = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for word, args in instructions():
        if word != "COPY":
            continue
        *sources, _dest = args.split()
        for source in sources:
            assert (REPO / source).exists(), f"COPY {source}: no such file in the repository"
            assert not ignored(source, patterns), f"COPY {source}: excluded by .dockerignore"
    # pyproject.toml names README.md as the readme: `pip install .` needs it in the context.
    assert not ignored("README.md", patterns)
