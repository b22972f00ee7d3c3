"""One server process for a test or a benchmark: a free loopback port, started in a session of
its own, probed until it answers 200, stopped as a whole process group, its output kept in a log.

The one harness behind tests/integration, tests/loadtest and the benchmark driver
(bench/). A session of its own, because what is started is often a parent of
the real server (`make serve`, uvicorn's worker manager): signalling the group stops them all.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path

import httpx

HOST = "127.0.0.1"  # loopback only: nothing started here is reachable from outside
POLL_S = 0.2
LOG_TAIL_CHARS = 6000  # enough for a traceback and what a `make` wrapper says after it


def service_env(port: int, **settings: object) -> dict[str, str]:
    """The environment of a service (app.cli serve) on HOST:`port`, gRPC off, logging warnings only, a stop's
    drain of 0.1 s (the default 5 s is for load balancers, and none is in front of these), and `settings` as
    CGSERVE_<NAME> (device="cuda" → CGSERVE_DEVICE=cuda), for benchmarks, tools and tests."""
    env = {"CGSERVE_HOST": HOST, "CGSERVE_PORT": str(port), "CGSERVE_GRPC_PORT": "0", "CGSERVE_LOG_LEVEL": "warning",
           "CGSERVE_DRAIN_SECONDS": "0.1"}  # fmt: skip
    return env | {f"CGSERVE_{name.upper()}": str(value) for name, value in settings.items()}


def free_port() -> int:
    """A TCP port no one listens on now (the kernel's pick); the server binds it moments later."""
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """`count` distinct such ports: held together while picked, so that the kernel cannot pick one twice
    (a server's HTTP and gRPC ports once came out equal, and both listened on it: SO_REUSEPORT)."""
    probes = [socket.socket() for _ in range(count)]
    try:
        for probe in probes:
            probe.bind((HOST, 0))
        return [int(probe.getsockname()[1]) for probe in probes]
    finally:
        for probe in probes:
            probe.close()


class ServerProcess:
    """`argv`, listening on HOST:`port`, its stdout and stderr in `log_path`.

    `env` is added to this process's environment (so PYTHONPATH and the like are inherited).
    """

    def __init__(
        self,
        argv: Sequence[str],
        log_path: Path,
        *,
        port: int,
        name: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: Path | str | None = None,
    ) -> None:
        self.argv, self.log_path, self.port = list(argv), log_path, port
        self.name = name or Path(self.argv[0]).name
        self.url = f"http://{HOST}:{port}"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = log_path.open("wb")
        try:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **env} if env else None,
                cwd=cwd,
                start_new_session=True,
            )
        except BaseException:  # e.g. no such program: nothing to stop, but the log is open
            self._log.close()
            raise

    def wait_ready(self, timeout_s: float, path: str = "/readyz") -> float:
        """Seconds until GET `path` answered 200. RuntimeError if the process exits first,
        TimeoutError after `timeout_s`; both carry the log's tail."""
        t0 = time.monotonic()
        # trust_env=False: a proxy from the environment must not sit between us and loopback.
        with httpx.Client(base_url=self.url, timeout=2.0, trust_env=False) as client:
            while time.monotonic() - t0 < timeout_s:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}")
                try:
                    if client.get(path).status_code == 200:
                        return time.monotonic() - t0
                except httpx.TransportError:
                    pass  # not listening yet
                time.sleep(POLL_S)  # a process offers nothing to await: poll
        raise TimeoutError(f"{self.name}: {self.url}{path} not 200 within {timeout_s:g} s:\n{self.log_tail()}")

    def log_tail(self, chars: int = LOG_TAIL_CHARS) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-chars:]

    def stop(self, grace_s: float = 15.0) -> int | None:
        """SIGTERM to the group (uvicorn drains and stops), SIGKILL to whatever of it is left
        after `grace_s` — the leader, or children that outlived it. The leader's exit code."""
        _signal_group(self.proc.pid, signal.SIGTERM)
        with suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=grace_s)
        _signal_group(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=5)
        self._log.close()
        return self.proc.returncode


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with suppress(ProcessLookupError):  # every process of the group has exited
        os.killpg(pgid, sig)  # start_new_session: the group is this server's alone


@contextmanager
def running(
    argv: Sequence[str],
    log_path: Path,
    *,
    port: int,
    ready_timeout_s: float = 120.0,
    ready_path: str = "/readyz",
    name: str | None = None,
    env: Mapping[str, str] | None = None,
    cwd: Path | str | None = None,
) -> Iterator[ServerProcess]:
    """The server, ready; always stopped. Whatever fails while it serves is reported with the
    log's tail on stderr, where pytest shows it beside the failure."""
    server = ServerProcess(argv, log_path, port=port, name=name, env=env, cwd=cwd)
    try:
        server.wait_ready(ready_timeout_s, ready_path)
        yield server
    except BaseException:
        sys.stderr.write(f"--- {server.name} log ({log_path}), its tail ---\n{server.log_tail()}\n")
        raise
    finally:
        server.stop()
