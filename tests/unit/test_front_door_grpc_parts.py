"""app/front_door's gRPC parts (front_door_grpc_checks.py), run in a process of their own: they load the service's
protocol messages, whose names tritonclient's (imported by the protocol tests) already holds in this process's
protobuf pool, as tests/conftest.py says of the in-process apps."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent


def test_the_grpc_parts_in_a_process_of_their_own() -> None:
    checks = HERE / "front_door_grpc_checks.py"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", str(checks)],
        capture_output=True, text=True, cwd=HERE.parents[1], timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-8000:] + done.stderr[-2000:]
    assert " passed" in done.stdout, done.stdout[-2000:]
