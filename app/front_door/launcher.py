"""The door's launcher (launch.c) bound to the default model's engine, its figures into the metrics, and bound again
when the default model changes.

POST /predict's rows then go from the door's threads into pinned memory of three slots of the engine's own, and
launch.c's thread launches their graphs and writes their answers: no Python between a request's last byte and its
answer (run 56a: the door with an ideal engine in C answered as fast as the raw no-op, where the event loop's path
reached 0.4×). Rows past those slots, v2 and gRPC requests, uploads and other models go through the feeder and
the batcher as before, onto the same stream of the same engine.

Bound where the launcher can answer as the service's port would: the default model runs CUDA graphs on one GPU
(its engine has launcher slots, app/service.py's _launcher_wanted), its outputs are class scores, and its images
are the door's. Python reads the launcher's figures every tend: the answers' latencies into
cgserve_request_duration_seconds (protocol "door", format "raw"), its batches into the model's batch metrics. A
failed or hung batch stops the launcher; the model's batcher is then told its device is dead, as its own failed
batch would tell it.
"""

from __future__ import annotations

import asyncio
import logging

from app.batching.batcher import Batcher
from app.errors import NotReadyError
from app.front_door.answers import Answers, head_lines, status_line
from app.front_door.door import Door
from app.http.answer import error_answer
from app.ops import metrics
from app.protocols.v2.rest import V2Codec
from app.service import ServedModel, Service

log = logging.getLogger(__name__)

PROTOCOL, FORM = "door", "raw"  # feeder.py's labels for POST /predict through the door
FAILED = ("the device is dead (a batch of the front door's launcher failed or did not complete within the batch "
          "timeout); the service is restarting")  # fmt: skip


class Launcher:
    """The launcher of one door, bound to at most one model version at a time."""

    def __init__(self, service: Service, door: Door, shape: tuple[int, int, int]) -> None:
        self.service, self.door, self.shape = service, door, shape
        self.bound: ServedModel | None = None  # the version whose engine it drives (held: admitted + 1)
        self.refused: ServedModel | None = None  # the version it could not start on (said once, not tried again)

    def eligible(self) -> ServedModel | None:
        """The default model's version the launcher can drive now, or None."""
        if not self.service.settings.front_door_launcher:
            return None
        try:
            served = self.service.model(None)
        except Exception:  # no default model now (unloaded): nothing to bind
            return None
        batcher = served.batcher
        if not isinstance(batcher, Batcher) or len(batcher.engines) != 1 or served.spec.input_shape != self.shape:
            return None
        if not served.spec.layout.default or not getattr(batcher.engines[0], "launcher_slots", 0):
            return None  # named outputs (answers.py answers them row by row), or no slots (another engine, traced)
        return served

    async def tend(self) -> None:
        """The figures since the last tend counted; bound again where the default model changed."""
        self.count()
        wanted = self.eligible()
        if wanted is self.bound:
            return
        await self.unbind(self.service.settings.batch_timeout_s)
        if wanted is not None and wanted is not self.refused:
            try:
                self.bind(wanted)
            except Exception as error:  # the door serves on through the batcher, whatever went wrong here
                self.refused = wanted
                log.warning("front door: POST /predict of %s goes through the batcher: %s: %s", wanted.spec.name,
                            type(error).__name__, error)  # fmt: skip

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
        served.admitted += 1  # its engines stay until unbound, as for a request in flight (app/dataplane.py's admit)
        self.bound = served
        log.info("front door: POST /predict of %s (version %s) launched and answered in C (launch.c)",
                 served.spec.name, served.spec.version)  # fmt: skip

    async def unbind(self, timeout_s: float) -> None:
        """The launcher's rows answered and its thread ended (off the event loop), its last figures counted."""
        served = self.bound
        if served is None:
            return
        self.count()
        ended = await asyncio.to_thread(self.door.close_launcher, timeout_s)
        self.count(served)
        self.bound = None
        if ended:
            served.admitted -= 1
        else:  # a batch the device never finished: its engine is never freed under it
            log.warning("front door: the launcher's last batch outlived %.0f s; %s's engine is kept", timeout_s,
                        served.spec.name)  # fmt: skip

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
        if figures.failed:
            metrics.REQUESTS.labels(model=name, protocol=PROTOCOL, format=FORM, code="503").inc(figures.failed)
        batcher = served.batcher
        if isinstance(batcher, Batcher):
            if len(figures.rows):
                batcher.count_batches(figures.rows, figures.buckets, figures.seconds)
            if figures.dead is not None and batcher.dead is None:
                batcher.declare_dead(figures.dead, batcher.engines[0].device)
