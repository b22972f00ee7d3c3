"""The start-up check of app/http/protocol.py: the installed uvicorn's protocol has what the guarded
protocol overrides, or the server refuses to start with one line (issue 23.7)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from app.http.protocol import SERVER_NEEDS, check_server


def test_the_installed_uvicorn_has_what_the_protocol_needs() -> None:
    check_server()


def test_a_protocol_without_start_asgi_task_is_refused_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(HttpToolsProtocol, "_start_asgi_task")
    with pytest.raises(SystemExit) as refused:
        check_server()
    message = str(refused.value.code)
    assert "\n" not in message and message.startswith("cannot start:")
    assert "_start_asgi_task" in message and "app/http/protocol.py" in message


@pytest.mark.parametrize("name", SERVER_NEEDS)
def test_each_needed_method_is_checked(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.delattr(HttpToolsProtocol, name)
    with pytest.raises(SystemExit, match=name):
        check_server()


def test_the_refusal_is_one_line_and_a_non_zero_exit() -> None:
    code = (
        "from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol\n"
        "del HttpToolsProtocol._start_asgi_task\n"
        "from app.config import Settings\nfrom app.http.server import uvicorn_options\n"
        "uvicorn_options(Settings())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr.strip().count("\n") == 0 and "_start_asgi_task" in done.stderr


def test_a_manager_without_what_the_drain_overrides_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from uvicorn.supervisors.multiprocess import Multiprocess

    from app.runtime.workers import MANAGER_METHODS, check_manager

    class Manager:  # what uvicorn's Multiprocess instance holds, all of it present
        processes = sockets = should_exit = None

    check_manager(Manager())  # type: ignore[arg-type]
    assert {"handle_term", "terminate_all"} <= set(MANAGER_METHODS)
    monkeypatch.delattr(Multiprocess, "keep_subprocess_alive")
    with pytest.raises(SystemExit) as refused:
        check_manager(Manager())  # type: ignore[arg-type]
    message = str(refused.value.code)
    assert "\n" not in message and message.startswith("cannot start:") and "keep_subprocess_alive" in message
