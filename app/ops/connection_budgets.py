"""How many connections a process may hold, so that HTTP, gRPC and the front door together never run out of
file descriptors: a connection over its budget is refused (503, or closed) rather than failing an accept."""

from __future__ import annotations

import resource

from app.config import Settings


def connection_budgets(settings: Settings) -> tuple[int, int]:
    """(HTTP, gRPC) connections a process may hold: CGSERVE_MAX_CONNECTIONS each, or (0) the open-file
    budget split three to one where gRPC listens, so that together they never run out of descriptors."""
    if settings.max_connections:
        return settings.max_connections, settings.max_connections
    budget = open_file_budget()
    grpc = max(16, budget // 4) if settings.grpc_port else 0
    return budget - grpc, grpc


def open_file_budget() -> int:
    """What the process may hold in connections: its open-file limit, less some for everything else."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(64, (soft if soft != resource.RLIM_INFINITY else 65536) - 128)
