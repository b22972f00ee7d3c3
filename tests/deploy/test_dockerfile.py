"""The Dockerfile, checked by hadolint (no Docker daemon runs in CI to build the image).

hadolint runs with warnings as failures, the same command on the real file and on two broken
copies: the controls show that a pass means something (the image does not run as root and its
base is pinned: hadolint's DL3002 and DL3007).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.deploy.deploy_tools import REPO, run

DOCKERFILE = REPO / "Dockerfile"


def hadolint_check(hadolint: str, dockerfile: Path) -> None:
    run([hadolint, "--failure-threshold", "warning", str(dockerfile)])


def test_hadolint_is_clean(hadolint: str) -> None:
    hadolint_check(hadolint, DOCKERFILE)


@pytest.mark.parametrize(
    ("rule", "broken"),
    [
        ("DL3002", lambda text: text + "USER root\n"),  # serving as root
        ("DL3007", lambda text: re.sub(r"^FROM (\S+):\S+", r"FROM \1:latest", text, count=1, flags=re.M)),
    ],
    ids=["runs-as-root", "unpinned-base"],
)
def test_hadolint_fails_a_broken_copy(hadolint: str, tmp_path: Path, rule: str, broken: Callable[[str], str]) -> None:
    copy = tmp_path / "Dockerfile"
    copy.write_text(broken(DOCKERFILE.read_text()))
    assert copy.read_text() != DOCKERFILE.read_text()
    with pytest.raises(pytest.fail.Exception, match=rule):
        hadolint_check(hadolint, copy)
