"""The door's launcher (launch.c) bound to the default model's engine, its figures into the metrics, and bound again
when the default model changes.

POST /predict's rows then go from the door's threads into pinned memory of three slots of the engine's own, and
launch.c's thread launches their graphs and writes their answers: no Python between a request's last byte and its
answer. Why: for a small CNN the event loop's hand-offs, not the device, bound how fast the door answers; the door
with an engine in C and nothing else is the ceiling (bench/front_door/door_echo.c). On by default
(CGSERVE_FRONT_DOOR_LAUNCHER); docs/tuning.md says what it gains, with its records.
Rows past those slots, v2 and gRPC requests, uploads and other models go through the feeder and the batcher as
before, onto the same stream of the same engine.

Bound where the launcher can answer as the service's port would: the default model runs CUDA graphs on one GPU
(its engine has launcher slots, app/service.py's _launcher_wanted), its outputs are class scores, and its images
are the door's. Python reads the launcher's figures every tend: the answers' latencies into
cgserve_request_duration_seconds (protocol "door", format "raw"), its batches into the model's batch metrics. A
failed or hung batch stops the launcher; the model's batcher is then told its device is dead, as its own failed
batch would tell it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from app.batching.batcher import Batcher
from app.errors import NotReadyError
from app.front_door.answers import Answers, head_lines, status_line
from app.front_door.door import Door
from app.front_door.feeder import FORM, PROTOCOL  # POST /predict's labels through the door
from app.http.answer import error_answer
from app.ops import metrics
from app.protocols.v2.rest import V2Codec
from app.service import ServedModel, Service

log = logging.getLogger(__name__)

CLOSE_MARGIN_S = 5.0  # a close waits for the last batch's own timeout (launch.c's), and this much more
FAILED = ("the device is dead (a batch of the front door's launcher failed or did not complete within the batch "
          "timeout); the service is restarting")  # fmt: skip


class Launcher:
    """The launcher of one door, bound to at most one model version at a time."""

    def __init__(self, service: Service, door: Door, shape: tuple[int, int, int]) -> None:
        self.service, self.door, self.shape = service, door, shape
        self.bound: ServedModel | None = None  # the version whose engine it drives (its launcher_bound: retire waits)
        self.refused: ServedModel | None = None  # the version it could not start on (said once, not tried again)
        self.closing: asyncio.Future[bool] | None = None  # the close under way, which a second unbind awaits too
        self.stopped = False  # the door is stopping: never bound again
        # A close outlived its timeout: that launcher's thread may still answer through the door and launch its
        # version's graphs, so nothing is bound again and the door is never freed (unbind says False from then on).
        self.stuck = False
        self._tending: asyncio.Task[None] | None = None  # the tend an install began (kept: a task is weakly held)
        service.on_install.append(self._installed)

    def eligible(self) -> ServedModel | None:
        """The default model's version the launcher can drive now, or None."""
        if self.stopped or self.stuck or not self.service.settings.front_door_launcher:
            return None
        try:
            served = self.service.model(None)
        except Exception:  # no default model now (unloaded): nothing to bind
            return None
        batcher = served.batcher
        if served.retired or not isinstance(batcher, Batcher) or len(batcher.engines) != 1:
            return None
        if batcher.dead is not None:  # its rows would wait for the batch timeout; the batcher refuses them at once
            return None
        if served.spec.input_shape != self.shape or not served.spec.layout.default:
            return None  # not the door's images; named outputs (answers.py answers them row by row)
        if not getattr(batcher.engines[0], "launcher_slots", 0):
            return None  # another engine, or none for it (traced, several devices)
        return served

    def _installed(self, name: str) -> None:
        """A model loaded or unloaded (Service.install, on the event loop): where the bound version is no longer the
        default one, POST /predict goes to the feeder from this step on, as the service's port's requests go to the
        new version, and the launcher is closed and bound again on a task of its own (not a second later)."""
        if self.bound is not None and self.eligible() is not self.bound:
            self.door.stop_launcher()  # what it holds it still answers (in flight, as the port's are)
            with contextlib.suppress(RuntimeError):  # no loop running (a test's install): the next tend binds
                self._tending = asyncio.get_running_loop().create_task(self.tend())

    async def tend(self) -> None:
        """The figures since the last tend counted; bound again where the default model changed. Never raises: the
        door's other tending goes on."""
        try:
            self.count()
            if self.eligible() is self.bound:
                return
            await self.unbind(self.service.settings.batch_timeout_s + CLOSE_MARGIN_S)
            wanted = self.eligible()  # again: the await above let a load or an unload run
            if wanted is None or wanted is self.bound or wanted is self.refused:
                return
            try:
                self.bind(wanted)
            except Exception as error:  # the door serves on through the batcher, whatever went wrong here
                self.refused = wanted
                log.warning("front door: POST /predict of %s goes through the batcher: %s: %s", wanted.spec.name,
                            type(error).__name__, error)  # fmt: skip
        except Exception:
            log.exception("front door: tending the launcher failed")

    def bind(self, served: ServedModel) -> None:
        """The launcher started on `served`'s engine; an exception where it cannot be (the door then goes on without
        it)."""
        batcher = served.batcher
        assert isinstance(batcher, Batcher)
        engine = batcher.engines[0]
        handles = engine.launcher_handles()  # type: ignore[attr-defined]
        if handles is None:
            raise ValueError("its engine has no launcher slots, or no CUDA context")
        answers = Answers(served, engine.name, V2Codec(self.service))
        failure = error_answer(NotReadyError(FAILED))
        self.door.open_launcher(
            handles, answers.prefix, answers.names,
            (status_line(failure.status), head_lines(failure.headers), failure.body),
            self.service.settings.batch_timeout_s,
        )  # fmt: skip
        served.launcher_bound = True  # its engines stay until unbound (Service.retire waits)
        self.bound = served
        log.info("front door: POST /predict of %s (version %s) launched and answered in C (launch.c)",
                 served.spec.name, served.spec.version)  # fmt: skip

    async def unbind(self, timeout_s: float, *, for_good: bool = False) -> bool:
        """The launcher's rows answered and its thread ended (off the event loop), its last figures counted. False
        where a batch outlived `timeout_s`: its thread may still answer through the door, which must then never be
        freed (FrontDoor.stop), and the version's engines are never freed under it. `for_good`: never bound again.
        A close under way (the tend's, when the door stops) is awaited, not started twice."""
        self.stopped = self.stopped or for_good
        if self.closing is None:
            if self.bound is None:
                return not self.stuck
            self.closing = asyncio.ensure_future(self._close(self.bound, timeout_s))
        return await asyncio.shield(self.closing)

    async def _close(self, served: ServedModel, timeout_s: float) -> bool:
        try:
            self.count()
            ended = await asyncio.to_thread(self.door.close_launcher, timeout_s)
            self.count(served)  # its last figures
            if ended:
                self.door.free_launcher()
            else:  # a batch the device never finished: its engines never freed under the launcher
                served.launcher_stuck = self.stuck = True
                log.warning("front door: the launcher's last batch outlived %.0f s; %s's engine and the door are "
                            "left to the process's end", timeout_s, served.spec.name)  # fmt: skip
            return ended
        finally:
            served.launcher_bound = False
            self.bound = None
            self.closing = None

    def count(self, served: ServedModel | None = None) -> None:
        """The launcher's answers and batches since the last count into the metrics; a dead launcher's device
        declared dead."""
        served = served or self.bound
        figures = self.door.launcher_figures()
        if served is None or figures is None:
            return
        name = served.spec.name
        if len(figures.latencies) or figures.lost:
            metrics.observe_requests(name, PROTOCOL, FORM, "200", figures.latencies)
            if figures.lost:  # answered, their latencies not kept
                metrics.REQUESTS.labels(model=name, protocol=PROTOCOL, format=FORM, code="200").inc(figures.lost)
        if figures.failed:  # answered 503 as the port answers a dead device's requests (their latencies not kept)
            metrics.REQUESTS.labels(model=name, protocol=PROTOCOL, format=FORM, code="503").inc(figures.failed)
            metrics.reject(name, NotReadyError.reason, figures.failed)
        batcher = served.batcher
        if isinstance(batcher, Batcher):
            if len(figures.rows):
                batcher.count_batches(figures.rows, figures.buckets, figures.seconds)
            if figures.dead is not None and batcher.dead is None:
                batcher.declare_dead(figures.dead, batcher.engines[0].device)
        if figures.batches_lost:
            log.warning("front door: %d of the launcher's batches were not counted (read too seldom)",
                        figures.batches_lost)  # fmt: skip
