"""CGSERVE_PORT and CGSERVE_GRPC_PORT: two listeners, two ports, checked before the server listens."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.config import Settings, describe_errors


def test_grpc_on_the_http_port_is_refused_with_what_to_change() -> None:
    # With workers every listener sets SO_REUSEPORT: both would bind it and split its connections between them.
    with pytest.raises(ValidationError, match="grpc_port and port are both 9000: give gRPC a port of its own, or 0"):
        Settings(port=9000, grpc_port=9000)


def test_grpc_off_or_on_a_port_of_its_own_is_accepted() -> None:
    assert Settings(port=9000, grpc_port=0).grpc_port == 0
    assert Settings(port=9000, grpc_port=9001).grpc_port == 9001


def test_the_front_door_needs_a_port_of_its_own_and_the_engines_beside_it() -> None:
    with pytest.raises(ValidationError, match="front_door_port 9000 is also port or grpc_port"):
        Settings(port=9000, grpc_port=9001, front_door_port=9000)
    with pytest.raises(ValidationError, match="front_door_port with 2 workers needs engine_process true"):
        Settings(port=9000, front_door_port=9002, workers=2)
    assert Settings(port=9000, front_door_port=9002, workers=2, engine_process=True).front_door_port == 9002
    assert Settings(port=9000, front_door_port=9002).front_door_threads == 4
    with pytest.raises(ValidationError, match="front_door_grpc_port 9002 is also port, grpc_port or front_door_port"):
        Settings(port=9000, front_door_port=9002, front_door_grpc_port=9002)
    with pytest.raises(ValidationError, match="front_door_grpc_port is served by the front door's threads"):
        Settings(port=9000, front_door_grpc_port=9003)
    assert Settings(port=9000, front_door_port=9002, front_door_grpc_port=9003).front_door_grpc_port == 9003


def test_a_combination_of_settings_is_reported_naming_the_variables_to_change() -> None:
    """What the CLI prints for a problem between settings names their CGSERVE_ variables, in the order the
    message gives them, as a single setting's line does."""
    with pytest.raises(ValidationError) as raised:
        Settings(port=9000, front_door_port=9002, workers=2)
    (line,) = describe_errors(raised.value).splitlines()[1:]
    assert line.startswith("  CGSERVE_FRONT_DOOR_PORT, CGSERVE_WORKERS, CGSERVE_ENGINE_PROCESS: "), line
