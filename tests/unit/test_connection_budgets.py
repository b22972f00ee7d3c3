"""Each port's share of the process's file descriptors: together they never exceed the open-file budget."""

from __future__ import annotations

import pytest

from app.config import Settings
from app.ops.connection_budgets import connection_budgets, open_file_budget


@pytest.mark.parametrize("grpc_port", [0, 8001])
@pytest.mark.parametrize("door_port", [0, 8002])
def test_the_ports_of_one_process_share_the_budget_without_going_over(grpc_port: int, door_port: int) -> None:
    """The door took a quarter beside HTTP's three quarters and gRPC's quarter: 125 % of the descriptors."""
    budgets = connection_budgets(Settings(grpc_port=grpc_port, front_door_port=door_port))
    assert budgets.http + budgets.grpc + budgets.door <= open_file_budget()
    assert (budgets.grpc > 0) == bool(grpc_port) and (budgets.door > 0) == bool(door_port)


def test_with_the_engine_process_the_door_is_not_in_the_workers_process() -> None:
    """Its quarter is the engine process's; the workers' HTTP keeps its own share."""
    beside = connection_budgets(Settings(grpc_port=8001, front_door_port=8002))
    apart = connection_budgets(Settings(grpc_port=8001, front_door_port=8002, engine_process=True, workers=2))
    assert apart.http == beside.http + beside.door and apart.door == beside.door


def test_max_connections_is_each_ports_own() -> None:
    assert connection_budgets(Settings(max_connections=100, front_door_port=8002)) == (100, 100, 100)
