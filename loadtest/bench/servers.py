"""The servers the benchmark compares, each a command template ({python}, {host}, {port})."""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass

from loadtest.server_process import HOST


@dataclass(frozen=True)
class ServerDef:
    role: str  # "ceiling", "baseline" or "ours"
    template: str  # {python}, {host}, {port} are filled in
    check_labels: bool = True  # False for the no-op server: its labels are not the model's
    needs_cuda: bool = False


# gRPC off: the HTTP path is what these servers are compared on.
_SERVE = "{python} -m app.cli serve --host {host} --port {port} --grpc-port 0 --log-level warning"
SERVERS = {
    "noop": ServerDef("ceiling", "{python} -m loadtest.servers.noop --host {host} --port {port}", check_labels=False),
    "noop-lean": ServerDef(
        "ceiling, plain route",
        "{python} -m loadtest.servers.noop --host {host} --port {port} --lean",
        check_labels=False,
    ),
    "naive": ServerDef("baseline", "{python} -m loadtest.servers.naive --host {host} --port {port} --device auto"),
    "eager": ServerDef("ours", f"{_SERVE} --engine eager --device auto"),
    "cuda-graph": ServerDef("ours", f"{_SERVE} --engine cuda-graph --device cuda", needs_cuda=True),
    # The process model: several uvicorn workers on one port, each with its own graphs; compared
    # with the no-op server given the same number of workers.
    "noop-4w": ServerDef(
        "ceiling, 4 workers",
        "{python} -m loadtest.servers.noop --host {host} --port {port} --workers 4",
        check_labels=False,
    ),
    "cuda-graph-4w": ServerDef(
        "ours, 4 workers", f"{_SERVE} --engine cuda-graph --device cuda --workers 4", needs_cuda=True
    ),
}


def templates(overrides: list[str]) -> dict[str, str]:
    """Every server's template, with `NAME=TEMPLATE` overrides (--server-cmd) put in."""
    out = {name: sdef.template for name, sdef in SERVERS.items()}
    for item in overrides:
        name, sep, template = item.partition("=")
        if not sep or name not in SERVERS:
            raise ValueError(f"--server-cmd takes NAME=TEMPLATE with NAME in {', '.join(SERVERS)}; got {item!r}")
        out[name] = template
    return out


def server_argv(template: str, port: int) -> list[str]:
    """The command of one server on HOST:`port`, run by this interpreter."""
    return shlex.split(template.format(python=sys.executable, host=HOST, port=port))
