"""A CGSERVE_ variable that is no setting is named at start-up (pydantic-settings ignores it without a word), with
the setting it most resembles; the variables the server, docker-compose and Kubernetes set are not settings and
are not named."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from app.config import unknown_variables


def test_a_misspelt_setting_is_named_with_the_one_it_resembles(tmp_path: Path) -> None:
    env_file = tmp_path / ".env"
    env_file.write_text("CGSERVE_MAX_DELAY_MS=2\nCGSERVE_MAX_DELAY=3\nOTHER=1\n")
    lines = unknown_variables({"CGSERVE_BUCKET": "1,2", "CGSERVE_DEVICE": "cpu", "PATH": "/bin"}, env_file)
    assert lines == [
        "CGSERVE_BUCKET is not a setting and is ignored: did you mean CGSERVE_BUCKETS?",
        "CGSERVE_MAX_DELAY is not a setting and is ignored: did you mean CGSERVE_MAX_DELAY_MS?",
    ]
    assert unknown_variables({"CGSERVE_ZZZZZZZZZZZZZZZZZ": "1"}, tmp_path / "none") == [
        "CGSERVE_ZZZZZZZZZZZZZZZZZ is not a setting and is ignored"
    ]


def test_the_variables_the_server_compose_and_kubernetes_set_are_not_named(tmp_path: Path) -> None:
    theirs = ["CGSERVE_DRAIN_MANAGED", "CGSERVE_ENGINE_SOCKET", "CGSERVE_ENGINE_SEGMENTS",
              "CGSERVE_START_UP_FAILED_MARKER", "CGSERVE_PUBLISHED_PORT", "CGSERVE_FRONT_DOOR_GRPC_PUBLISHED_PORT",
              "CGSERVE_SERVICE_HOST", "CGSERVE_SERVICE_PORT_HTTP", "CGSERVE_PORT_8000_TCP_ADDR"]  # fmt: skip
    assert unknown_variables(dict.fromkeys(theirs, "1"), tmp_path / "none") == []


def test_serve_warns_of_one_before_it_starts(tmp_path: Path) -> None:
    """The server's own start-up says so in its log (here it stops at once: its model repository is empty)."""
    (tmp_path / "models").mkdir()
    env = {"PATH": "/usr/bin:/bin", "CGSERVE_MODEL_REPOSITORY": str(tmp_path / "models"), "CGSERVE_DEVCE": "cpu"}
    done = subprocess.run([sys.executable, "-m", "app.cli", "serve"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert "CGSERVE_DEVCE is not a setting and is ignored: did you mean CGSERVE_DEVICE?" in done.stderr, done.stderr
