"""The service's state across its life: starting → ready (or failed), then stopped.

The engine is built on a worker thread after the server is listening, so /healthz answers
and /readyz says 503 while graphs are captured and validated. A start-up failure is fatal:
it is logged with what to fix and `on_fatal` asks the server to exit non-zero.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from app import metrics
from app.batcher import Batcher
from app.config import Settings
from app.engines import Engine, build_engine
from app.errors import NotReadyError
from app.model_spec import SPECS, ModelSpec

log = logging.getLogger(__name__)


class Service:
    def __init__(self, settings: Settings, *, on_fatal: Callable[[], None] = lambda: None) -> None:
        self.settings = settings
        self.spec: ModelSpec = SPECS[settings.model]
        self.engine: Engine | None = None
        self.batcher: Batcher | None = None
        self.failure: str | None = None
        self._on_fatal = on_fatal
        self._startup: asyncio.Task[None] | None = None

    def start(self) -> None:
        metrics.READY.set(0)
        self._startup = asyncio.create_task(self._start(), name="engine-startup")

    async def wait_started(self) -> None:
        """For tests and tools: returns once the engine is ready or start-up failed."""
        if self._startup is not None:
            await asyncio.shield(self._startup)

    async def _start(self) -> None:
        try:
            engine = await asyncio.to_thread(build_engine, self.settings, self.spec)
        except Exception as error:
            self.failure = f"{type(error).__name__}: {error}"
            log.critical("start-up failed, the server will exit: %s", self.failure, exc_info=True)
            self._on_fatal()
            return
        batcher = Batcher(
            engine,
            max_delay_s=self.settings.max_delay_ms / 1000,
            queue_limit=self.settings.queue_limit,
            request_timeout_s=self.settings.request_timeout_s,
            in_flight=self.settings.in_flight,
        )
        batcher.start()
        self.engine, self.batcher = engine, batcher
        metrics.ENGINE_INFO.labels(
            engine=engine.name,
            device=engine.device,
            dtype=str(engine.describe().get("dtype", "fp32")),
            model=self.spec.name,
        ).set(1)
        metrics.READY.set(1)
        log.info("ready: engine=%s device=%s buckets=%s", engine.name, engine.device, list(engine.buckets))

    async def stop(self) -> None:
        metrics.READY.set(0)
        if self._startup is not None and not self._startup.done():
            self._startup.cancel()
        if self.batcher is not None:
            await self.batcher.stop()
        if self.engine is not None:
            self.engine.close()

    def readiness(self) -> tuple[bool, str]:
        if self.failure is not None:
            return False, f"start-up failed: {self.failure}"
        if self.engine is None or self.batcher is None:
            return False, "starting: loading the model and preparing the engine"
        if not self.engine.healthy():
            metrics.READY.set(0)
            return False, f"the {self.engine.device} device reported an error; restart the service"
        return True, "ready"

    def ready_batcher(self) -> Batcher:
        """The batcher, or NotReadyError (503) while starting, after a failure, or on a broken device."""
        ready, detail = self.readiness()
        if not ready or self.batcher is None:
            raise NotReadyError(detail)
        return self.batcher
