"""How many connections a process may hold on each of its ports, so that HTTP, gRPC and the front door together never
run out of file descriptors: a connection over its port's budget is refused (503, or closed) rather than failing an
accept."""

from __future__ import annotations

import resource
from typing import NamedTuple

from app.config import Settings


class ConnectionBudgets(NamedTuple):
    http: int
    grpc: int
    door: int  # the front door's HTTP and gRPC ports together


def connection_budgets(settings: Settings) -> ConnectionBudgets:
    """CGSERVE_MAX_CONNECTIONS for each port, or (0) the process's open-file budget split between those it holds:
    a quarter to gRPC where it listens, a quarter to the front door where it listens, the rest to HTTP. The door runs
    where the engines are: in this process, beside HTTP and gRPC, or (engine_process) in the engine process, away
    from the workers' ports, so the workers' HTTP keeps its share."""
    if settings.max_connections:
        return ConnectionBudgets(settings.max_connections, settings.max_connections, settings.max_connections)
    budget = open_file_budget()
    grpc = max(16, budget // 4) if settings.grpc_port else 0
    door = max(16, budget // 4) if settings.front_door_port else 0
    beside_http = 0 if settings.engine_process else door
    return ConnectionBudgets(http=budget - grpc - beside_http, grpc=grpc, door=door)


def open_file_budget() -> int:
    """What the process may hold in connections: its open-file limit, less some for everything else."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(64, (soft if soft != resource.RLIM_INFINITY else 65536) - 128)
