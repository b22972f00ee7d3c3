"""The compared servers' commands, and --server-cmd replacing one."""

from __future__ import annotations

import sys

import pytest

from loadtest.bench.servers import SERVERS, server_argv, templates


def test_each_command_runs_with_this_interpreter_on_loopback() -> None:
    for name, template in templates([]).items():
        argv = server_argv(template, 8123)
        assert argv[0] == sys.executable, name
        assert argv[argv.index("--host") + 1] == "127.0.0.1" and argv[argv.index("--port") + 1] == "8123"


def test_server_cmd_replaces_one_server_only() -> None:
    custom = templates(["eager={python} -m app.cli serve --host {host} --port {port} --buckets 1,2"])
    assert custom["eager"].endswith("--buckets 1,2") and custom["naive"] == SERVERS["naive"].template
    for bad in ("eager", "nosuch=python x"):
        with pytest.raises(ValueError, match="NAME=TEMPLATE"):
            templates([bad])
