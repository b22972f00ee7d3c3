"""The Dockerfile, checked by hadolint (no Docker daemon runs in CI to build the image).

hadolint runs with warnings as failures, the same command on the real file and on broken copies:
the controls show that a pass means something, in each of the two images the file builds (the
cpu stage first, the gpu stage last): neither runs as root and both bases are pinned (hadolint's
DL3002 and DL3007, which it checks stage by stage).
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.deploy.deploy_tools import REPO, run

DOCKERFILE = REPO / "Dockerfile"


def hadolint_check(hadolint: str, dockerfile: Path) -> None:
    run([hadolint, "--failure-threshold", "warning", str(dockerfile)])


def test_hadolint_is_clean(hadolint: str) -> None:
    hadolint_check(hadolint, DOCKERFILE)


def stage_end(text: str, stage: str) -> int:
    """Where the named stage's instructions end: the next FROM, or the end of the file."""
    starts = [m.start() for m in re.finditer(r"^FROM ", text, flags=re.M)] + [len(text)]
    (index,) = [i for i, s in enumerate(starts[:-1]) if re.match(rf"FROM \S+ AS {stage}\n", text[s:])]
    return starts[index + 1]


def as_root(stage: str) -> Callable[[str], str]:
    return lambda text: text[: stage_end(text, stage)] + "USER root\n" + text[stage_end(text, stage) :]


def unpinned(stage: str) -> Callable[[str], str]:
    return lambda text: re.sub(rf"^FROM (\S+):\S+ AS {stage}$", rf"FROM \1:latest AS {stage}", text, flags=re.M)


@pytest.mark.parametrize(
    ("rule", "broken"),
    [("DL3002", as_root("cpu")), ("DL3002", as_root("gpu")), ("DL3007", unpinned("cpu")), ("DL3007", unpinned("gpu"))],
    ids=["cpu-runs-as-root", "gpu-runs-as-root", "cpu-unpinned-base", "gpu-unpinned-base"],
)
def test_hadolint_fails_a_broken_copy(hadolint: str, tmp_path: Path, rule: str, broken: Callable[[str], str]) -> None:
    copy = tmp_path / "Dockerfile"
    copy.write_text(broken(DOCKERFILE.read_text()))
    assert copy.read_text() != DOCKERFILE.read_text()
    with pytest.raises(pytest.fail.Exception, match=rule):
        hadolint_check(hadolint, copy)


def toolchain_check() -> str:
    """The GPU stage's build-time check that gcc compiles against Python.h, as one shell command."""
    text = DOCKERFILE.read_text()[: stage_end(DOCKERFILE.read_text(), "gpu")]
    (run_line,) = [
        m.group(1) for m in re.finditer(r"^RUN (.*?)(?<!\\)\n", text, flags=re.M | re.S) if "Python.h" in m.group(1)
    ]
    return run_line.replace("\\\n", " ")


def test_the_gpu_images_toolchain_check_passes_where_gcc_and_python_h_are_present() -> None:
    done = subprocess.run(["sh", "-c", toolchain_check()], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_toolchain_check_fails_the_build_without_python_h(tmp_path: Path) -> None:
    """The control: a python3 whose include folder holds no Python.h (the runtime image without python3-dev)."""
    shim = tmp_path / "python3"
    shim.write_text(f"#!/bin/sh\necho {tmp_path / 'include'}\n")
    shim.chmod(0o755)
    (tmp_path / "include").mkdir()
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    done = subprocess.run(["sh", "-c", toolchain_check()], capture_output=True, text=True, env=env)
    assert done.returncode != 0 and "Python.h" in done.stderr
