"""The service's models across their life, one state machine:

    starting → ready → draining → stopped
        ↘ failed      ↘ dead (a device fault: the process exits non-zero for its supervisor)

Engines are built on a worker thread after the server is listening, so /healthz answers and
/readyz says 503 while graphs are captured and validated; each model becomes ready on its own
and the service is ready once all are. A start-up failure or a dead device is fatal: it is
logged with what to fix and `on_fatal` asks the server to exit non-zero. On SIGTERM the server
calls `begin_drain`: readiness turns 503 at once while requests are still served. The service,
not the engines, reads the settings and publishes what the engines measured as metrics.

Versions (app/repository/versions.py): each served (model, version) is its own ServedModel with
its engines and batcher; a call that names no version gets the model's newest ready one.

Several GPUs (device cuda:0,cuda:1 or all): each model gets one engine per GPU, built one after
the other from its own copy of the module, and one batcher that sends each batch to the
least-loaded GPU. Readiness names each GPU's state. A fault on any GPU is the service's: it
exits non-zero (fail fast) rather than serving on fewer GPUs than it was started with.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from app.batching.batcher import Batcher
from app.batching.queue import BatchQueue
from app.codecs.uploads import DeferringDecoder, JpegBatchDecoder, start_jpeg_decoder
from app.config import Settings
from app.engine_process.client import EngineLink, RemoteBatcher, RemoteJpegDecoder
from app.engines.base import Engine
from app.engines.device_streams import on_build_thread
from app.engines.factory import (
    EngineOptions,
    build_engine,
    engine_options,
    replica_of,
    resolve_devices,
    use_compile_cache,
)
from app.engines.memory import close_and_release
from app.errors import NotReadyError, UnknownModelError
from app.ops import metric_buffers, metrics, tracing
from app.ops.heap import freeze_startup_heap
from app.ops.switch_interval import set_switch_interval
from app.repository import LoadedModel, ModelConfigError, load_model, model_folders, read_each_model
from app.repository.model_spec import ModelSpec
from app.repository.versions import UNVERSIONED

log = logging.getLogger(__name__)
# The front door's launcher's slots in each engine it may drive (app/front_door/launch.c): one filling, one on the
# device, one being answered (launch.c's SLOTS: the two change together).
LAUNCHER_SLOTS = 3
RETIRE_POLL_S = 0.01  # how often a retiring model's queue is looked at until it is empty


@dataclass(eq=False)
class ServedModel:
    """One model: its spec, the options its engines were built with, and, once ready, engines and batcher."""

    spec: ModelSpec
    options: EngineOptions
    engines: list[Engine] = field(default_factory=list)  # one per options.devices, in order, as they are built
    batcher: BatchQueue | None = None  # once ready: a Batcher here, or the engine process's RemoteBatcher
    remote: bool = False  # the engines are the engine process's: none here to ask about their devices
    failure: str | None = None
    retired: bool = False  # replaced by a load or unloaded: answers what it admitted, then is freed
    admitted: int = 0  # requests admitted (app/dataplane.py's admit) and not yet answered
    # The front door's launcher drives its engine's launcher slots (app/front_door/launcher.py): retire waits until it
    # is closed, and never frees an engine whose launcher's last batch outlived its close (stuck).
    launcher_bound: bool = False
    launcher_stuck: bool = False

    def device_states(self) -> dict[str, str]:
        """Device → its engine's state: starting, ready, dead, failed (its start-up) or not started."""
        if self.remote and self.batcher is not None:  # the engine process's; dead if it is gone
            return {device: "dead" if self.batcher.dead else "ready" for device in self.options.devices}
        states = {}
        for index, device in enumerate(self.options.devices):
            if index < len(self.engines):
                dead = not self.engines[index].healthy() or (
                    self.batcher is not None and self.batcher.dead_device == device
                )
                states[device] = "dead" if dead else "ready"
            elif self.failure is None:
                states[device] = "starting"
            else:
                states[device] = "failed" if index == len(self.engines) else "not started"
        return states

    @property
    def title(self) -> str:
        """The model's name, with its version where that is not the unversioned "1"."""
        spec = self.spec
        return spec.name if spec.version == UNVERSIONED else f"{spec.name} (version {spec.version})"

    def readiness(self) -> tuple[bool, str]:
        """(ready, why not): the model's state in words. A dead device also turns its readiness gauges off here, the
        series labelled by the model's name (its title, "name (version 2)", is for the words)."""
        name, states = self.title, self.device_states()
        on = "" if len(states) == 1 else " (" + ", ".join(f"{d} {s}" for d, s in states.items()) + ")"
        if self.retired:
            return False, f"{name}: unloaded (replaced by a load, or unloaded); calls naming no version get the newest"
        if self.failure is not None:
            return False, f"{name}: start-up failed: {self.failure}{on}"
        if self.batcher is None:
            return False, f"{name}: starting: loading the model and preparing the {self.options.engine} engine{on}"
        dead = [device for device, state in states.items() if state == "dead"]
        if self.batcher.dead is not None or dead:
            metrics.MODEL_READY.labels(model=self.spec.name).set(0)
            metrics.READY.set(0)
            for device in dead:
                metrics.DEVICE_READY.labels(model=self.spec.name, device=device).set(0)
            device = self.batcher.dead_device or dead[0]
            return False, f"{name}: the {device} device is dead; the service is restarting{on}"
        return True, "ready"

    def ready_batcher(self) -> BatchQueue:
        """The batcher, or NotReadyError (503) while starting, after a failure, or on a broken device."""
        batcher = self.batcher
        healthy = self.failure is None and all(engine.healthy() for engine in self.engines)
        if batcher is not None and batcher.dead is None and healthy:
            return batcher  # every request's case: ready, without building readiness()'s states and text
        ready, detail = self.readiness()
        if not ready or self.batcher is None:
            raise NotReadyError(detail)
        return self.batcher

    def ready(self) -> bool:
        return self.batcher is not None and self.readiness()[0]


def prepare_models(settings: Settings) -> list[tuple[LoadedModel, EngineOptions]]:
    """Read the repository, load every model on the CPU and resolve its engine options.

    Raises ModelConfigError listing every problem. The CLI calls this before the server
    listens, so a bad model.toml or weights file stops start-up with one line per problem.
    """
    specs, problems = read_each_model(settings.model_repository)
    names = [name for name, _, _ in model_folders(settings.model_repository)]
    if (default := settings.default_model) is not None and default not in names:
        problems.append(f"CGSERVE_DEFAULT_MODEL: {default!r} is not in {settings.model_repository}: {names}")
    if settings.front_door_port and default is None and len(names) > 1:  # the door's rows are one model's images
        problems.append(
            f"CGSERVE_FRONT_DOOR_PORT: the front door opens for the default model's images, and "
            f"{settings.model_repository} holds several models {names}: set CGSERVE_DEFAULT_MODEL to one of them"
        )
    try:
        devices = resolve_devices(settings.device)
    except ModelConfigError as error:  # reported beside the models' problems; nothing is loaded without devices
        raise ModelConfigError(problems + error.problems) from None
    prepared = []
    for spec in specs:  # every model's problems at once, so that one run shows everything to fix
        try:
            prepared.append((load_model(spec), engine_options(settings, spec, devices)))
        except ModelConfigError as error:
            problems += error.problems
    if problems:
        raise ModelConfigError(problems)
    return prepared


def _engine_labels(engine: Engine, model: str) -> dict[str, str]:
    """cgserve_engine_info's labels for one of the model's engines."""
    dtype = str(engine.report.facts.get("dtype", "fp32"))
    return {"engine": engine.name, "device": engine.device, "dtype": dtype, "model": model}


class Service:
    def __init__(
        self,
        settings: Settings,
        *,
        prepared: list[tuple[LoadedModel, EngineOptions]] | None = None,
        on_fatal: Callable[[], None] = lambda: None,
        on_ready: Callable[[], None] = lambda: None,
        peers_ready: Callable[[], tuple[bool, str]] | None = None,
        engine_process: tuple[str, str] | None = None,
    ) -> None:
        """`engine_process`: (socket, segment folder) of the engine process that builds and runs the
        engines (app/engine_process/); this process then only serves HTTP."""
        self.settings = settings
        self.engine_link: EngineLink | None = None
        if engine_process is not None:
            socket, segments = engine_process
            self.engine_link = EngineLink(
                socket,
                segments,
                on_dead=lambda why: self._device_died("the engine process", why),
                frames_in_flight=self.settings.engine_frames_in_flight,
            )
        # name → version → the served model; and name → the version a call that names none gets.
        self.versions: dict[str, dict[str, ServedModel]] = {}
        # Every version whose engines are building or built, until retired: the metric series they set are theirs
        # (a retire zeroes only what no other of them says, _retire_metrics).
        self._holding: list[ServedModel] = []
        self.models: dict[str, ServedModel] = {}
        # POST /predict's model: CGSERVE_DEFAULT_MODEL, else the one model of the first set served (start-up's,
        # or the first load's where start-up served none), decided once (decide_default): loading or unloading
        # another model never makes /predict answer from a different one.
        self.default_name: str | None = settings.default_model
        self.default_decided = settings.default_model is not None
        self.on_install: list[Callable[[str], None]] = []  # told the name of each model install() changed
        self._applying = asyncio.Lock()  # a worker of the engine process applies one table at a time
        # Its requests are admitted here (ServedModel.admitted): a replaced version is freed once none is left.
        # The engine process's come in frames from workers that admitted them: it waits the whole timeout.
        self.counts_admissions = True
        self.started = False  # start-up is over: no model is then "the repository still being read"
        self.failure: str | None = None  # why start-up failed or the device died
        self.draining = False
        self.drain_began = asyncio.Event()  # set with `draining`: for what waits on something that may not end first
        self.device_dead = False
        # None: Pillow decodes every upload. A worker of the engine process: that process's (DeferringDecoder).
        self.jpeg_decoder: JpegBatchDecoder | DeferringDecoder | None = None
        self._prepared = prepared
        self._on_fatal = on_fatal
        self._on_ready = on_ready
        self._peers_ready = peers_ready  # other worker processes, where there are several
        self._startup: asyncio.Task[None] | None = None
        self._flusher: asyncio.Task[None] | None = None
        # What starts with the models (before readiness) and stops before the batchers: an ingress that needs
        # the models, registered from its own layer (app/front_door/server.py's attach).
        self.on_started: list[Callable[[], Awaitable[None]]] = []
        self.on_stop: list[Callable[[], Awaitable[None]]] = []
        # Told when the drain ends and the HTTP port stops accepting: such an ingress stops at that moment too,
        # not when the HTTP port's last connection has closed (on_stop).
        self.on_stop_accepting: list[Callable[[], None]] = []

    def start(self) -> None:
        metrics.READY.set(0)
        set_switch_interval(self.settings.switch_interval_ms)  # this process's helper threads (the module says why)
        self._startup = asyncio.create_task(self._start(), name="engine-startup")
        # The hot path's buffered metrics into Prometheus (app/ops/metric_buffers.py), here because the
        # engine process runs a Service without HTTP, and its batchers' metrics count too.
        self._flusher = asyncio.create_task(metric_buffers.flush_every(), name="metric-flush")

    def begin_drain(self) -> None:
        """SIGTERM: readiness 503 from now on, so load balancers stop sending; requests are still served."""
        if not self.draining:
            self.draining = True
            self.drain_began.set()
            metrics.READY.set(0)
            log.info("draining: readiness is 503; requests are served until the server stops accepting")

    def stop_accepting(self) -> None:
        """The drain is over and the HTTP port stops accepting: every ingress told of it stops accepting too."""
        for stopping in self.on_stop_accepting:
            stopping()

    def _device_died(self, source: str, reason: str) -> None:
        """A device is dead, as `source` found it (a model's batcher, or the link to the engine process, which holds
        every model's): every model's readiness says so and the process exits non-zero."""
        self.device_dead = True
        if self.failure is None:
            self.failure = f"{source}: the device is dead: {reason}"
            metrics.READY.set(0)
            for name in self.versions:
                metrics.MODEL_READY.labels(model=name).set(0)
            log.critical("%s; the server exits for its supervisor to restart it", self.failure)
            self._on_fatal()

    async def wait_started(self) -> None:
        """For tests and tools: returns once every model is ready or start-up failed."""
        if self._startup is not None:
            await asyncio.shield(self._startup)

    async def _start(self) -> None:
        if self.engine_link is not None:
            await self._start_remote(self.engine_link)
            return
        try:
            prepared = self._prepared
            if prepared is None:
                prepared = await asyncio.to_thread(prepare_models, self.settings)
            self._prepared = None  # the CPU copies are the engines' now
            for model, options in prepared:  # each model's newest version first
                self.versions.setdefault(model.spec.name, {})[model.spec.version] = ServedModel(model.spec, options)
            for name in self.versions:
                self.publish(name)
            self.decide_default()
            # The JPEG decoder first: its torchvision import holds the GIL for seconds (longest where
            # nothing imported torch._dynamo before it). Started after the models, that import ran
            # while they already served, at a fraction of their rate.
            devices = [device for _, options in prepared for device in options.devices]
            device = next((d for d in devices if d.startswith("cuda")), "cpu")
            self.jpeg_decoder = await self._start_jpeg_decoder(self.settings.jpeg_decoder, device)
            use_compile_cache(self.settings)
            gpu_dtypes = [options.dtype for _, options in prepared if options.devices[0].startswith("cuda")]
            if gpu_dtypes:  # TF32 is the process's: decided from every model, before any engine is built
                from app.engines import precision

                precision.decide(gpu_dtypes)
            for model, _ in prepared:
                await self._start_model(self.versions[model.spec.name][model.spec.version], model)
                self.publish(model.spec.name)
            for started in self.on_started:
                await started()
        except Exception as error:
            self._start_failed(error)
            return
        # Start-up is over: what it built lives as long as the process; full collections skip it.
        self.started = True
        frozen = freeze_startup_heap()
        metrics.READY.set(1)
        self._on_ready()
        log.info("ready: serving %s (%d start-up objects frozen out of gc)", ", ".join(self.models), frozen)

    async def _start_remote(self, link: EngineLink) -> None:
        """An HTTP worker of the engine process: the models' specs here, their engines there."""
        try:
            # Every table after the first is applied by the link's reader, one at a time (apply_table's
            # lock), each before its APPLIED: one that comes while this first one applies waits its turn.
            link.on_models = self.apply_table
            await link.connect()
            await self.apply_table(link.table)
            if link.decodes_jpeg and self.settings.jpeg_decode_in_workers:  # on the GPU, from this process
                self.jpeg_decoder = await self._own_jpeg_decoder(link)
            elif link.decodes_jpeg:  # JPEG uploads go to the GPU's decoder, in the engine process
                self.jpeg_decoder = RemoteJpegDecoder(link)
        except Exception as error:
            self._start_failed(error)
            return
        self.started = True
        metrics.READY.set(1)
        self._on_ready()
        log.info("ready: serving %s through the engine process", ", ".join(self.models))

    async def _start_jpeg_decoder(self, setting: str, device: str) -> JpegBatchDecoder | None:
        """The uploads' decoder `setting` calls for on `device`, with the decoder settings; started on a thread."""
        s = self.settings
        return await asyncio.to_thread(
            start_jpeg_decoder,
            setting,
            device,
            max_batch=s.jpeg_max_batch,
            launches=s.jpeg_launches,
            nvjpeg=s.nvjpeg,
            priority=s.jpeg_stream_priority,
            preallocate=s.jpeg_preallocate,
        )

    async def _own_jpeg_decoder(self, link: EngineLink) -> JpegBatchDecoder | DeferringDecoder | None:
        """A worker's own GPU decoder, on the first CUDA device the engine process serves a model on (it said
        it decodes JPEGs: that device and torchvision work); its uploads' pixels go there as raw requests'.
        No model on a CUDA device in the table yet, or a decoder this process cannot start (no CUDA context
        to be had, torchvision not importing here): the engine process's decoder, as without the setting."""
        devices = [d for versions in link.table.values() for info in versions.values() for d in info["devices"]]
        device = next((d for d in devices if d.startswith("cuda")), None)
        if device is None:
            return RemoteJpegDecoder(link)
        try:
            return await self._start_jpeg_decoder("gpu", device)
        except Exception as error:
            log.warning(
                "CGSERVE_JPEG_DECODE_IN_WORKERS: this worker cannot decode on %s (%s: %s); its JPEG uploads go "
                "to the engine process's decoder", device, type(error).__name__, error,
            )  # fmt: skip
            return RemoteJpegDecoder(link)

    async def apply_table(self, table: dict[str, dict[str, dict[str, Any]]]) -> None:
        """Serve what the engine process serves: each (model, version) of its table, by its id. A version
        already served keeps its stand-in; a new one's spec comes in the table, as the engine process
        built it (the routes decode with it; files changed since do not matter)."""
        async with self._applying:
            await self._apply_table(table)

    async def _apply_table(self, table: dict[str, dict[str, dict[str, Any]]]) -> None:
        link = self.engine_link
        assert link is not None
        devices = resolve_devices(self.settings.device)
        known = {
            served.batcher.model_id: served for served in self.served() if isinstance(served.batcher, RemoteBatcher)
        }
        versions: dict[str, dict[str, ServedModel]] = {}
        for name, entries in table.items():
            for version, info in entries.items():
                served = known.get(int(info["id"]))
                if served is None:  # the spec the engine process built it from (outputs as its probe found them)
                    spec = ModelSpec.from_wire(info["spec"])
                    served = ServedModel(spec, engine_options(self.settings, spec, devices), remote=True)
                    served.batcher = link.batcher(info)
                versions.setdefault(name, {})[version] = served
        for name in [name for name in self.versions if name not in versions]:
            self.versions.pop(name)
            self.publish(name)
        for name, served_versions in versions.items():
            self.versions[name] = served_versions
            self.publish(name)
        # As the engine process decided it: a worker restarted after a load or an unload would decide otherwise.
        self.default_name, self.default_decided = link.default

    def _start_failed(self, error: Exception) -> None:
        self.failure = f"{type(error).__name__}: {error}"
        log.critical("start-up failed, the server will exit: %s", self.failure)
        log.debug("start-up failure", exc_info=True)
        self._on_fatal()

    def _launcher_wanted(self, spec: ModelSpec, options: EngineOptions) -> bool:
        """Whether a model's engine gets the front door's launcher's slots: the door is on in this process with its
        launcher, the model is on one GPU, requests are not traced (launch.c makes no spans), and it is what the
        launcher can serve (launcher.py's eligible): the default model, /predict's (decided before any engine is
        built, for the process's life: decide_default), with class scores (launch.c writes no named outputs).
        Every version of it gets them: three more slots' pinned rows (uint8 pixels alone) and graphs; for ResNet-50
        at bucket 128, 3 × 128 × 150 KB ≈ 58 MB of pinned memory."""
        settings = self.settings
        return (spec.name == self.default_name and spec.layout.default and bool(settings.front_door_port)
                and settings.front_door_launcher and len(options.devices) == 1
                and options.devices[0].startswith("cuda") and not tracing.active())  # fmt: skip

    async def _start_model(self, served: ServedModel, model: LoadedModel, *, beside: bool = False) -> None:
        """Build the model's engines and start its batcher. `beside`: another version of it serves meanwhile
        (a load): its readiness metrics stay as they are until this one is ready."""
        name, options, settings = served.spec.name, served.options, self.settings
        self._holding.append(served)
        if not beside:
            metrics.MODEL_READY.labels(model=name).set(0)
            for device in options.devices:
                metrics.DEVICE_READY.labels(model=name, device=device).set(0)
        try:
            for index, device in enumerate(options.devices):
                # Each device's engine moves its module there: all but the last get a copy.
                replica = model if index == len(options.devices) - 1 else replica_of(model)
                engine = await on_build_thread(
                    build_engine,
                    replica,
                    options,
                    device=device,
                    in_flight=settings.in_flight,
                    event_wait=settings.event_wait,
                    host_io=settings.host_io,
                    launcher_slots=LAUNCHER_SLOTS if self._launcher_wanted(served.spec, options) else 0,
                )
                served.engines.append(engine)
                metrics.DEVICE_READY.labels(model=name, device=device).set(1)
        except Exception as error:
            served.failure = f"{type(error).__name__}: {error}"
            raise
        batcher = Batcher(
            served.engines,
            max_delay_s=options.max_delay_ms / 1000,
            queue_limit=settings.queue_limit,
            request_timeout_s=settings.request_timeout_s,
            batch_timeout_s=settings.batch_timeout_s,
            model=name,
            version=served.spec.version,
            on_dead=lambda reason: self._device_died(name, reason),
            just_in_time=settings.batch_launch == "just-in-time",
            fastest_bucket=settings.busy_batch == "fastest-bucket",
        )
        batcher.start()
        served.batcher = batcher
        reports = [engine.report for engine in served.engines]
        for bucket in reports[0].capture_seconds:  # every device's, one after the other
            seconds = sum(report.capture_seconds[bucket] for report in reports)
            metrics.CAPTURE_SECONDS.labels(model=name, bucket=str(bucket)).set(seconds)
        pool_bytes = sum(report.pool_bytes for report in reports)
        metrics.GRAPH_POOL_BYTES.labels(model=name, version=served.spec.version).set(pool_bytes)
        for engine in served.engines:
            metrics.ENGINE_INFO.labels(**_engine_labels(engine, name)).set(1)
            if engine.report.facts.get("torch_compile_mode") is not None:
                fell_back = engine.report.compile_fallback is not None
                metrics.COMPILE_FALLBACK.labels(model=name, device=engine.device).set(int(fell_back))
        metrics.MODEL_READY.labels(model=name).set(1)
        devices = ",".join(engine.device for engine in served.engines)
        log.info("%s ready: engine=%s device=%s buckets=%s", name, options.engine, devices, list(options.buckets))

    async def build(self, model: LoadedModel, options: EngineOptions) -> ServedModel:
        """A (model, version) built and ready beside the models serving, not yet served: install() serves it.
        A failure frees what was built and raises."""
        served = ServedModel(model.spec, options)
        try:
            await self._start_model(served, model, beside=True)
        except BaseException:
            await self.retire(served)
            raise
        return served

    def install(self, name: str, versions: dict[str, ServedModel]) -> list[ServedModel]:
        """Serve `versions` as model `name`'s (none: unload it), in one step of the event loop: every call
        from now on gets one of them. Returns the versions replaced, for retire()."""
        replaced = list(self.versions.get(name, {}).values())
        self.versions[name] = dict(versions)
        self.publish(name)
        self.decide_default()
        if not versions and replaced:  # only a served model's name is a label (never a client's)
            metrics.MODEL_READY.labels(model=name).set(0)
        for listener in self.on_install:  # the engine process tells its workers, before the call is answered
            listener(name)
        return replaced

    async def retire(self, served: ServedModel, *, since: float | None = None) -> None:
        """Answer what `served` admitted, then free it: its batcher stops, its engines close and their
        graphs and pinned slots go back to the device. `since` (a time.monotonic()): when it stopped
        getting new requests. A request admitted before may still be reading its body, and submits
        by its deadline at the latest, request_timeout_s after `since`: it is freed once every request it
        admitted is answered, or then."""
        batcher = served.batcher
        if batcher is not None and since is not None:
            latest = since + self.settings.request_timeout_s
            if not self.counts_admissions:  # the engine process: the workers admitted its requests
                await asyncio.sleep(max(0.0, latest - time.monotonic()))
            while served.admitted and time.monotonic() < latest:  # noqa: ASYNC110
                await asyncio.sleep(RETIRE_POLL_S)
            # The queue drains through the old engines as usual; the batcher signals no empty queue, and
            # this runs once a retirement, off the request path.
            while isinstance(batcher, Batcher) and batcher.queued_rows and batcher.dead is None:  # noqa: ASYNC110
                await asyncio.sleep(RETIRE_POLL_S)
        while served.launcher_bound:  # noqa: ASYNC110  # closing: within the batch timeout (launch.c's own)
            await asyncio.sleep(RETIRE_POLL_S)
        served.retired = True
        served.batcher = None
        if batcher is not None:
            await batcher.stop()  # nothing queued any more: it waits for the batches in flight
        if served.launcher_stuck:  # the launcher may yet launch its graphs: left to the process's end
            log.warning("%s version %s: its engines are kept (the front door's launcher outlived its close)",
                        served.spec.name, served.spec.version)  # fmt: skip
            return
        engines, served.engines = served.engines, []
        del batcher  # its engines tuple: the last reference but `engines`
        engine_labels = [_engine_labels(engine, served.spec.name) for engine in engines]
        # On the build thread, never beside a capture, which empty_cache's frees must not race
        # (device_streams.py); with no reference left here, so that the engines are gone when it runs.
        await on_build_thread(close_and_release, engines, served.options.devices, close=not self.device_dead)
        self._holding = [held for held in self._holding if held is not served]
        if not served.remote:
            self._retire_metrics(served, engine_labels)

    def _retire_metrics(self, served: ServedModel, engine_labels: list[dict[str, str]]) -> None:
        """Zero the series a retired version set that no other version building or built says too (a reload of
        the same version shares its labels; a load may be building beside an unload's retire): its queue and
        graph pool per version, its engines' info, its devices' readiness. Zeroed, not removed: under
        multiprocess /metrics a removed series keeps its last value in its process's file."""
        name, version = served.spec.name, served.spec.version
        others = [held for held in self._holding if held.spec.name == name]
        if all(other.spec.version != version for other in others):
            metrics.GRAPH_POOL_BYTES.labels(model=name, version=version).set(0)
            metrics.QUEUE_DEPTH.labels(model=name, version=version).set(0)
        in_use = [_engine_labels(engine, name) for other in others for engine in other.engines]
        for labels in engine_labels:
            if labels not in in_use:  # one building sets its own once all its engines are built
                metrics.ENGINE_INFO.labels(**labels).set(0)
        devices = {device for other in others for device in other.options.devices}
        for device in served.options.devices:
            if device not in devices:
                metrics.DEVICE_READY.labels(model=name, device=device).set(0)

    async def stop(self) -> None:
        metrics.READY.set(0)
        if self._startup is not None and not self._startup.done():
            self._startup.cancel()
        for stopping in self.on_stop:  # their requests answered while the batchers still run
            await stopping()
        for served in self.served():
            if served.batcher is not None:
                await served.batcher.stop()
            for engine in served.engines:
                # A dead engine's close could wait forever; a stuck launcher may yet launch its graphs.
                if not self.device_dead and not served.launcher_stuck:
                    engine.close()
        if self.jpeg_decoder is not None and not self.device_dead:
            self.jpeg_decoder.close()
        if self.engine_link is not None:
            await self.engine_link.close()
        if self._flusher is not None:
            self._flusher.cancel()  # it flushes once more as it ends
            await asyncio.gather(self._flusher, return_exceptions=True)

    def readiness(self) -> tuple[bool, str]:
        if self.failure is not None:
            return False, f"failed: {self.failure}"
        if self.draining:
            return False, "draining: the server is shutting down"
        if not self.started and not self.models:
            return False, "starting: reading the model repository"
        details = [detail for ready, detail in (m.readiness() for m in self.served()) if not ready]
        if details:
            return False, "; ".join(details)
        if self.on_started and not self.started:  # the models are ready, what starts with them not yet
            return False, "starting: opening what serves beside HTTP (the front door)"
        return self._peers_ready() if self._peers_ready is not None else (True, "ready")

    def served(self) -> list[ServedModel]:
        """Every served (model, version)."""
        return [served for versions in self.versions.values() for served in versions.values()]

    def publish(self, name: str) -> None:
        """Point the calls that name no version of `name` at its newest ready version (its newest while
        none is ready); forget the name once it has no version."""
        versions = self.versions.get(name)
        if not versions:
            self.versions.pop(name, None)
            self.models.pop(name, None)
            return
        newest_first = sorted(versions.values(), key=lambda served: int(served.spec.version), reverse=True)
        self.models[name] = next((served for served in newest_first if served.ready()), newest_first[0])

    def decide_default(self) -> None:
        """Without CGSERVE_DEFAULT_MODEL: the first time any model is served, /predict's model is the one served
        then, or none where several are (their names then). Kept for the process's life, served or not."""
        if not self.default_decided and self.models:
            self.default_decided = True
            self.default_name = next(iter(self.models)) if len(self.models) == 1 else None

    def model(self, name: str | None, version: str | None = None) -> ServedModel:
        """The named model (its `version`, else its newest ready one), or the default model for name None;
        UnknownModelError (404) for an unknown name or version."""
        served = self._named(name)
        if not version:
            return served
        chosen = self.versions.get(served.spec.name, {}).get(version)
        if chosen is None:
            known = sorted(self.versions.get(served.spec.name, {}), key=int)
            raise UnknownModelError(served.spec.name, [], version=version, versions=known)
        return chosen

    def _named(self, name: str | None) -> ServedModel:
        if name is None:
            name = self.default_name
            if name is None:
                if not self.models and not self.started:
                    raise NotReadyError("starting: reading the model repository")
                raise UnknownModelError(None, list(self.models))
        served = self.models.get(name)
        if served is None:
            if not self.models and not self.started:
                raise NotReadyError("starting: reading the model repository")
            raise UnknownModelError(name, list(self.models))
        return served
