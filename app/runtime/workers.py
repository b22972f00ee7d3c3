"""Several server processes on one port (CGSERVE_WORKERS > 1), through uvicorn's process manager.

The flags reach the workers as CGSERVE_* variables (each worker re-reads Settings and builds its
own engines and graphs); Prometheus runs in multiprocess mode so that /metrics in any worker
reports all of them. The parent must not import prometheus_client before
PROMETHEUS_MULTIPROC_DIR is set, so app.main is imported only by the workers. A worker whose
start-up fails leaves a marker and stops the manager, so the whole server exits 1, as a single
process does. /readyz in any worker answers 200 only once every worker is ready: each writes a
marker when it is, and readiness counts the markers of live workers.

With CGSERVE_ENGINE_PROCESS the manager first starts one engine process (app/engine_process/),
which builds every engine; the workers build none and send it their requests. It counts as one
more process to be ready, and it is stopped after the last worker has drained.

SIGTERM (or SIGINT) to the manager drains every worker (app/runtime/drain.py): each answers readiness 503
and serves on for CGSERVE_DRAIN_SECONDS. Then the manager stops the kernel queueing connections on
the listening socket that every process shares (a connection queued but accepted by no one would
be reset when the last process closes it), and tells each worker to stop: it accepts what is
queued still, closes its copy of the socket, answers what it has with `Connection: close` and
exits. A second signal to the manager stops at once.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import tempfile
import threading
from pathlib import Path
from typing import Any

import uvicorn
from uvicorn.supervisors import Multiprocess

from app.config import Settings
from app.engine_process import SEGMENTS_ENV, SOCKET_ENV
from app.http.server import uvicorn_options
from app.ops.listening import stop_queueing
from app.ops.process_metrics import is_zombie, live_pids
from app.runtime.drain import MANAGED_ENV, STOP_SIGNAL

log = logging.getLogger("uvicorn.error")

_FAILED_MARKER_ENV = "CGSERVE_START_UP_FAILED_MARKER"
SHM_MIN_FREE_BYTES = 1 << 30  # below this, the engine process's segments go to the metrics folder


def serve_workers(settings: Settings, overrides: dict[str, Any]) -> int:
    for name, value in overrides.items():
        if value is not None:
            os.environ[f"CGSERVE_{name.upper()}"] = _env_value(value)
    with tempfile.TemporaryDirectory(prefix="cgserve-metrics-") as metrics_dir:
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
        os.environ[_FAILED_MARKER_ENV] = os.path.join(metrics_dir, "start-up-failed")
        os.environ[MANAGED_ENV] = "1"  # the workers stop when told (app/runtime/drain.py)
        engines = start_engine_process(metrics_dir) if settings.engine_process else None
        try:
            config = uvicorn.Config(
                "app.runtime.workers:worker_app", factory=True, host=settings.host, port=settings.port,
                workers=settings.workers, **uvicorn_options(settings),
            )  # fmt: skip
            DrainingManager(config, [config.bind_socket()], drain_seconds=settings.drain_seconds).run()
        finally:
            if engines is not None:
                stop_engine_process(engines, timeout_s=settings.drain_seconds + 30)
        return 1 if os.path.exists(os.environ[_FAILED_MARKER_ENV]) else 0


class DrainingManager(Multiprocess):
    """uvicorn's worker manager (its restarts, health checks, SIGHUP), with the drain of N workers.

    uvicorn's own answers SIGTERM by passing it on to each worker and keeps its copy of the
    listening socket until the last worker has exited: the kernel goes on queueing connections
    for seconds that no one accepts, and resets them at the end."""

    def __init__(self, config: uvicorn.Config, sockets: list[socket.socket], *, drain_seconds: float) -> None:
        super().__init__(config, sockets)
        check_manager(self)
        self.drain_seconds = drain_seconds
        self.stopping: threading.Timer | None = None

    def handle_term(self) -> None:
        self._drain("SIGTERM")

    def handle_int(self) -> None:
        self._drain("SIGINT")

    def _drain(self, name: str) -> None:
        if self.stopping is not None:  # a second signal: stop accepting now
            self.stopping.cancel()
            self.stop_accepting()
            return
        log.info("%s: the workers drain for %g s, then stop accepting", name, self.drain_seconds)
        for process in self.processes:
            _signal(process.pid, signal.SIGTERM)
        self.stopping = threading.Timer(self.drain_seconds, self.stop_accepting)
        self.stopping.daemon = True
        self.stopping.start()

    def stop_accepting(self) -> None:
        """No connection is queued from now on; the run loop then tells the workers (terminate_all)."""
        for sock in self.sockets:
            stop_queueing(sock)
            sock.close()
        self.should_exit.set()

    def keep_subprocess_alive(self) -> None:
        """Twice a second in the manager's loop, after the signals' handling: a dead worker replaced."""
        if self.stopping is None:  # not while draining: no worker is restarted then
            super().keep_subprocess_alive()
        self.forget_the_gone()

    def forget_the_gone(self) -> None:
        """Every process gone whose live gauges are in the metrics folder leaves them: a worker that died and was
        replaced, one restarted by SIGHUP or let go by SIGTTOU, and a replacement uvicorn gave up on before it was
        ever one of `processes` (its gauges made as it imported the metrics). prometheus_client merges every file of
        the folder until told a process is dead: a worker killed while draining or starting held cgserve_ready at 0
        under a ready server, and one killed under load 768 queued rows and 2 batches in flight on an idle one, for
        ever (the operator review; bench/results/2026-12-06-cpu-review-probes/). Twice a second: a listing of a
        folder of a few files a process."""
        from prometheus_client import multiprocess  # the folder is set by now (the module's docstring)

        for pid in live_pids(os.environ["PROMETHEUS_MULTIPROC_DIR"]):
            if not _alive(pid):  # a zombie (ended, not yet reaped) counts as gone
                with contextlib.suppress(OSError):  # a file removed meanwhile
                    multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]

    def terminate_all(self) -> None:
        if self.stopping is None:  # a worker failed to start: uvicorn's own way
            super().terminate_all()
            return
        for process in self.processes:
            _signal(process.pid, STOP_SIGNAL)


# What DrainingManager overrides or uses of uvicorn's Multiprocess, which is not public API: pinned
# with uvicorn in pyproject.toml, and checked at start-up (an override of a method that is gone would
# never be called, and the drain would silently be uvicorn's own again).
MANAGER_METHODS = ("handle_term", "handle_int", "keep_subprocess_alive", "terminate_all")
MANAGER_STATE = ("processes", "sockets", "should_exit")


def check_manager(manager: Multiprocess) -> None:
    """SystemExit (one line, status 1) where the installed uvicorn's Multiprocess lacks what the manager needs."""
    missing = [name for name in MANAGER_METHODS if not callable(getattr(Multiprocess, name, None))]
    missing += [name for name in MANAGER_STATE if not hasattr(manager, name)]
    if missing:
        raise SystemExit(
            f"cannot start: uvicorn {uvicorn.__version__}'s Multiprocess has no {', '.join(missing)}, which "
            "app/runtime/workers.py's drain needs; install the uvicorn pyproject.toml names (pip install -e .)"
        )


def _signal(pid: int | None, sig: int) -> None:
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):  # it has exited already
            os.kill(pid, sig)


def start_engine_process(folder: str) -> multiprocessing.process.BaseProcess:
    """Spawn the engine process (a fresh interpreter: CUDA cannot cross a fork), listening in `folder`."""
    from app.engine_process.host import engine_process_main

    os.environ[SOCKET_ENV] = os.path.join(folder, "engine.sock")
    os.environ[SEGMENTS_ENV] = tempfile.mkdtemp(prefix="cgserve-segments-", dir=segment_root(folder))
    process = multiprocessing.get_context("spawn").Process(
        target=engine_process_main, args=(mark_ready, stop_every_worker), name="cgserve-engines"
    )
    process.start()
    return process


def segment_root(fallback: str) -> str:
    """/dev/shm where it has room; else `fallback` (a file in the page cache serves as well).

    A container's /dev/shm is 64 MB unless raised, and a mapped page that finds the tmpfs full
    kills the process with SIGBUS: a small one is not used."""
    try:
        stat = os.statvfs("/dev/shm")
    except OSError:
        return fallback
    return "/dev/shm" if stat.f_bavail * stat.f_frsize >= SHM_MIN_FREE_BYTES else fallback


def stop_engine_process(process: multiprocessing.process.BaseProcess, timeout_s: float) -> None:
    """After the workers: its STOP_SIGNAL (it stops its batchers and engines), then SIGKILL; segments removed."""
    from app.engine_process.host import STOP_SIGNAL

    if process.is_alive() and process.pid is not None:
        os.kill(process.pid, STOP_SIGNAL)
        process.join(timeout_s)
    if process.is_alive():
        process.kill()
        process.join()
    shutil.rmtree(os.environ.pop(SEGMENTS_ENV, ""), ignore_errors=True)


def worker_app() -> Any:
    """The app of one worker (uvicorn calls this factory in each process)."""
    from app.config import get_settings
    from app.main import create_app

    settings = get_settings()  # from the CGSERVE_* variables the manager exported
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    return create_app(
        on_fatal=stop_every_worker,
        on_ready=mark_ready,
        peers_ready=every_worker_ready,
        owns_process=True,
        engine_process=(os.environ[SOCKET_ENV], os.environ[SEGMENTS_ENV]) if SOCKET_ENV in os.environ else None,
    )


def stop_every_worker() -> None:
    """A fatal failure in any process (a worker, the engine process): the whole server exits 1."""
    with open(os.environ[_FAILED_MARKER_ENV], "w"):
        pass
    os.kill(os.getppid(), signal.SIGTERM)  # the manager stops all workers and returns


def mark_ready() -> None:
    """This worker's marker: its engines are built and its graphs validated."""
    Path(os.environ["PROMETHEUS_MULTIPROC_DIR"], f"ready-{os.getpid()}").touch()


def every_worker_ready() -> tuple[bool, str]:
    """Ready once as many live workers have marked themselves ready as were asked for."""
    expected = int(os.environ.get("CGSERVE_WORKERS", "1")) + (SOCKET_ENV in os.environ)  # + the engine process
    ready = sum(
        _alive(int(marker.name.removeprefix("ready-")))
        for marker in Path(os.environ["PROMETHEUS_MULTIPROC_DIR"]).glob("ready-*")
    )
    if ready < expected:
        return False, f"starting: {ready} of {expected} workers ready"
    return True, "ready"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # there is such a process, another user's (the pid reused)
        return True
    # A worker that died while the server drains is not reaped (keep_subprocess_alive leaves uvicorn's loop then):
    # a zombie, which os.kill finds, whose live gauges would stay until the server ends (a review).
    return not is_zombie(pid)


def _env_value(value: Any) -> str:
    if isinstance(value, tuple | list):
        return ",".join(str(v) for v in value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
