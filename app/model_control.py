"""Model control without a restart: Triton's model repository extension and its poll mode.

    index    every model folder of the repository, with each version's state (READY, LOADING,
             UNLOADING, UNAVAILABLE) and why
    load     read <name>/ afresh (its model.toml, versions and files), build every version it serves
             beside the ones serving — engines built, graphs captured and validated on a thread while
             the other models serve —, then switch the model's calls to them in one step; the versions
             replaced are retired
    unload   the model's calls stop at once (404); its versions are retired
    poll     CGSERVE_MODEL_CONTROL=poll: the repository is re-read every CGSERVE_MODEL_POLL_SECONDS,
             a model whose files changed is loaded, one whose folder went away unloaded

A retired version answers every request it admitted (Service.retire), then frees its engines: the
graph pool and the pinned slots go back. A failed load leaves the versions serving as they were.
One operation at a time per model (a lock per name): a load never races an unload of the same model,
and a slow load of one model (a factory reading weights from a slow mount) never holds up another's
load or unload. Engine builds still go one at a time, on the one build thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Protocol, TypeVar

from app.engine_process.frames import EngineProcessError
from app.engines.factory import EngineOptions, engine_options, resolve_devices
from app.errors import NotReadyError, ServiceError
from app.ops.daemon_thread import in_daemon_thread
from app.repository import LoadedModel, ModelConfigError, load_model, model_folders, read_model
from app.service import ServedModel, Service

T = TypeVar("T")
log = logging.getLogger(__name__)
RETIRING_SETS = 2  # a model's replaced versions held while they drain, in sets of its versions
Files = tuple[tuple[str, int, int], ...]  # (path, mtime ns, size) of each file of a model's folder
# Triton's own words when model control is off (its clients and scripts look for them).
NOT_ALLOWED = "explicit model load / unload is not allowed if polling is enabled"
# Load parameters taken and not acted on: a load always re-reads the model's folder. Triton's "config"
# (a config.pbtxt as JSON) and "file:…" (the model's files in the call) are refused with LOAD_EXPECTED.
IGNORED_LOAD_PARAMETERS = frozenset({"unload_dependents"})
LOAD_EXPECTED = (
    "a load without parameters: it reads the model's folder afresh; change model.toml and the files there, then load"
)


class RepositoryControl(Protocol):
    """What the repository extension's routes (REST and gRPC) call: ModelControl here, or
    RemoteModelControl in a worker of the engine process."""

    @property
    def mode(self) -> str: ...

    def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def index(self, *, ready_only: bool = False) -> list[dict[str, str]]: ...

    async def load(self, name: str) -> None: ...

    async def unload(self, name: str) -> None: ...


class ControlError(ServiceError):
    """A refused or failed load or unload, with Triton's status: 503 (control off), 400 (the model's
    problems), 404 (no such model folder)."""

    reason = "model_control"

    def __init__(self, status: int, message: str, *, expected: str = "") -> None:
        super().__init__(message, expected=expected)
        self.status = status
        self.code = {503: "unavailable", 400: "load_failed", 404: "unknown_model"}.get(status, "model_control")


@dataclass
class Retiring:
    served: ServedModel
    task: asyncio.Task[None]
    set: int  # the load or unload that replaced it: a model's versions are retired a set at a time


class NameLocks:
    """One asyncio.Lock per model name: a load and an unload of one model run one after the other (its
    final state is the last call's), those of different models side by side. A name's lock is dropped
    once nobody holds or awaits it, so that the names clients ask for do not pile up."""

    def __init__(self) -> None:
        self._locks: dict[str, asyncio.Lock] = {}
        self._users: dict[str, int] = {}  # name → calls holding or awaiting its lock

    @contextlib.asynccontextmanager
    async def hold(self, name: str) -> AsyncIterator[None]:
        lock = self._locks.setdefault(name, asyncio.Lock())
        self._users[name] = self._users.get(name, 0) + 1
        try:
            async with lock:
                yield
        finally:
            self._users[name] -= 1
            if not self._users[name]:
                del self._users[name], self._locks[name]


class ModelControl:
    def __init__(self, service: Service) -> None:
        self.service = service
        self.settings = service.settings
        self.mode = service.settings.model_control
        self._locks = NameLocks()
        self._loading: set[str] = set()
        self._failures: dict[str, str] = {}  # name → why its last load failed
        self._retiring: list[Retiring] = []
        self._set_numbers = itertools.count()
        self._seen: dict[str, Files] = {}  # poll: name → its files, as last loaded
        self._failed_at: dict[str, Files] = {}  # poll: name → its files when a load of them failed
        self._poller: asyncio.Task[None] | None = None
        self._loads: dict[str, asyncio.Task[None]] = {}  # name → its load under way
        self._poll_problem: str | None = None  # poll: what the last round said was wrong, said once

    def start(self) -> None:
        if self.mode == "poll":
            self._poller = asyncio.create_task(self._poll_forever(), name="model-poll")

    async def stop(self) -> None:
        """At shutdown: no more polling; the versions still retiring stop now (the server stops anyway)."""
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)
        if self._loads:  # a load under way: what it built is retired by its own clean-up
            for task in self._loads.values():
                task.cancel()
            await asyncio.gather(*self._loads.values(), return_exceptions=True)
        retiring_now = list(self._retiring)  # each task's done-callback empties the list as it ends
        for retiring in retiring_now:
            retiring.task.cancel()
        await asyncio.gather(*(r.task for r in retiring_now), return_exceptions=True)
        for retiring in retiring_now:  # cancelled while draining: stopped as the serving ones are
            if retiring.served.batcher is not None:
                await retiring.served.batcher.stop()
            for engine in retiring.served.engines:
                if not self.service.device_dead:
                    engine.close()

    # The repository extension's three calls.

    async def index(self, *, ready_only: bool = False) -> list[dict[str, str]]:
        """Triton's repository index: name, version, state and reason of every model and version."""
        names = await asyncio.to_thread(self._folder_names)
        names += [name for name in self.service.versions if name not in names]
        entries: list[dict[str, str]] = []
        for name in sorted(names):
            versions = self.service.versions.get(name, {})
            for version in sorted(versions, key=int):
                served = versions[version]
                ready, detail = served.readiness()
                starting = served.batcher is None and served.failure is None  # a dead device is UNAVAILABLE
                state = "READY" if ready else "LOADING" if starting else "UNAVAILABLE"
                entries.append({"name": name, "version": version, "state": state, "reason": "" if ready else detail})
            for retiring in self._retiring:  # one entry a (name, version): a version served again is its new state
                if retiring.served.spec.name == name and retiring.served.spec.version not in versions:
                    version = retiring.served.spec.version
                    entries.append({"name": name, "version": version, "state": "UNLOADING", "reason": "draining"})
            if not versions:
                reason = "loading" if name in self._loading else self._failures.get(name, "unloaded")
                state = "LOADING" if name in self._loading else "UNAVAILABLE"
                entries.append({"name": name, "state": state, "reason": reason})
        return [entry for entry in entries if entry["state"] == "READY"] if ready_only else entries

    async def load(self, name: str) -> None:
        """Load `name`, waiting for it (503 once the server begins to stop: `unless_stopping`). The load is
        this object's task, not the caller's: a client that leaves (a gRPC deadline, a closed connection) does
        not stop a build half-way and strand what it built; a second call for the same name while one runs
        waits for that one."""
        self._allowed()
        # The name against the repository's folders before anything is read: a name such as "/usr" or ".." made
        # `repository / name` that folder, walked file by file before the 404 (the lifecycle review).
        if name not in await asyncio.to_thread(self._folder_names):
            raise self._not_in_repository(name)
        await unless_stopping(self.service, f"load of {name!r}", self._load_when_free, name)

    async def _load_when_free(self, name: str) -> None:
        running = self._loads.get(name)
        if running is not None:  # it read the files before this call: wait for it, then load what is there now
            await asyncio.wait({running})
        task = self._loads.get(name)
        if task is None or task is running:  # another caller that waited too may have started the next one
            task = self._loads[name] = asyncio.create_task(self._load(name), name=f"load-{name}")
            task.add_done_callback(lambda done: self._loads.pop(name, None) if self._loads.get(name) is done else None)
        await asyncio.shield(task)

    async def unload(self, name: str) -> None:
        self._allowed()
        await unless_stopping(self.service, f"unload of {name!r}", self._unload_when_free, name)

    async def _unload_when_free(self, name: str) -> None:
        async with self._locks.hold(name):  # waits for a load of this model under way, not another's
            self._started()
            if name not in self.service.versions:
                folders = await asyncio.to_thread(self._folder_names)
                if name not in folders:  # not a client's name for a label or a log line beyond this answer
                    raise ControlError(404, f"failed to unload '{name}': no model of that name is served or in the "
                                       "repository", expected=f"one of {sorted(self.service.versions)}")  # fmt: skip
                return  # in the repository, not loaded: nothing to do (as Triton)
            self._unload(name)

    def _folder_names(self) -> list[str]:
        try:
            return repository_names(self.settings.model_repository)
        except OSError:
            return []

    def _allowed(self) -> None:
        if self.mode != "explicit":  # Triton's words, in mode none too; then which mode this server is in
            mode = "model control is off" if self.mode == "none" else "the repository is polled"
            raise ControlError(503, f"{NOT_ALLOWED} (here {mode}: CGSERVE_MODEL_CONTROL={self.mode})",
                               expected="CGSERVE_MODEL_CONTROL=explicit for load and unload calls")  # fmt: skip

    def _started(self) -> None:
        if not self.service.started:
            raise NotReadyError("starting: the models of the repository are still being built")

    async def _load(self, name: str) -> None:
        async with self._locks.hold(name):  # an unload of `name` called meanwhile comes after: its state is the last
            await self._wait_for_retirements(name)  # other models' calls go on meanwhile (a lock per name)
            self._started()
            self._loading.add(name)
            try:
                built = await self._build(name)
            except ServiceError as error:
                # Kept for the index's entry of a folder the repository holds, not of any name a client sends
                # (4000 names refused as no model's folder kept 350 MB for ever:
                # bench/results/2026-12-06-cpu-review-probes/).
                if not (isinstance(error, ControlError) and error.status == 404):
                    self._failures[name] = error.message
                forget_frames(error)
                raise
            finally:
                self._loading.discard(name)
            self._failures.pop(name, None)
            self._retire_set(self.service.install(name, built))
            log.info("%s loaded: serving versions %s", name, ", ".join(sorted(built, key=int)))

    async def _build(self, name: str) -> dict[str, ServedModel]:
        """Every version `name`'s folder serves now, read and built beside the serving ones."""
        repository = self.settings.model_repository
        # The files as read, before reading them: a change made while this builds is seen by the next poll.
        files = await asyncio.to_thread(fingerprint, repository, name)
        try:  # a factory may take minutes (a slow mount): a stopping process does not wait for it
            prepared = await in_daemon_thread(self._prepare, repository, name, name=f"prepare-{name}")
        except ModelConfigError as error:
            raise await self._load_refused(name, error) from None
        built: dict[str, ServedModel] = {}
        try:
            for model, options in prepared:
                built[model.spec.version] = await self.service.build(model, options)
        except BaseException as error:  # cancelled too (a shutdown): nothing built is left unowned
            for served in built.values():
                await asyncio.shield(self.service.retire(served))
            if not isinstance(error, Exception):
                raise
            log.warning("loading %s failed; what served before still serves: %s", name, error, exc_info=True)
            raise ControlError(400, f"failed to load '{name}': {type(error).__name__}: {error}") from None
        self._seen[name] = files
        return built

    async def _load_refused(self, name: str, error: ModelConfigError) -> ControlError:
        """404 for a name the repository does not hold (an empty repository holds none), else 400 with the
        model's problems. Asked of the folders, not of the problems' words, which differ for each case."""
        if name not in await asyncio.to_thread(self._folder_names):  # gone since load() looked
            return self._not_in_repository(name)
        return ControlError(400, f"failed to load '{name}': {'; '.join(error.problems)}")

    def _not_in_repository(self, name: str) -> ControlError:
        repository = self.settings.model_repository
        return ControlError(404, f"failed to load '{name}': {repository}: holds no model named {name!r}")

    def _prepare(self, repository: Path, name: str) -> list[tuple[LoadedModel, EngineOptions]]:
        """On a thread: the model's versions read and loaded on the CPU, each with its engine options."""
        devices = resolve_devices(self.settings.device)
        return [
            (load_model(spec), engine_options(self.settings, spec, devices)) for spec in read_model(repository, name)
        ]

    async def _wait_for_retirements(self, name: str) -> None:
        """Hold a load while RETIRING_SETS earlier sets of the model's versions still drain: each holds its
        engines (graphs, pinned slots) for up to request_timeout_s, and a reload loop must not stack them
        until the device runs out of memory. At most serving + RETIRING_SETS retiring + one building. Counted in
        sets, not versions: after an unload no version serves to tell a set's size by (a model of two versions,
        unloaded, held its next load for request_timeout_s: the lifecycle review)."""
        while len(sets := sorted({r.set for r in self._retiring if r.served.spec.name == name})) >= RETIRING_SETS:
            await asyncio.wait([r.task for r in self._retiring if r.served.spec.name == name and r.set == sets[0]])

    def _unload(self, name: str) -> None:
        self._retire_set(self.service.install(name, {}))
        self._seen.pop(name, None)
        self._failures.pop(name, None)
        log.info("%s unloaded: its requests answered, its engines are freed", name)

    def _retire_set(self, replaced: list[ServedModel]) -> None:
        """Retire the versions one load or unload replaced, as one set, from now."""
        since, one_set = time.monotonic(), next(self._set_numbers)
        for served in replaced:
            task = asyncio.create_task(self.service.retire(served, since=since), name=f"retire-{served.title}")
            retiring = Retiring(served, task, one_set)
            self._retiring.append(retiring)
            task.add_done_callback(partial(self._forget, retiring))

    def _forget(self, retiring: Retiring, _: object) -> None:
        self._retiring.remove(retiring)

    async def retired(self) -> None:
        """For tests and tools: returns once every retired version is freed."""
        await asyncio.gather(*(r.task for r in list(self._retiring)), return_exceptions=True)

    # Poll mode.

    async def _poll_forever(self) -> None:
        await self._poll_once_ready()
        while True:
            await asyncio.sleep(self.settings.model_poll_seconds)
            try:
                await self.poll_once()
            except Exception:  # one bad round must not end polling
                log.exception("polling the model repository failed")

    async def _poll_once_ready(self) -> None:
        """The files of the models start-up built, as they were: changes are measured from here."""
        await self.service.wait_started()
        repository = self.settings.model_repository
        for name in self.service.versions:
            self._seen.setdefault(name, await asyncio.to_thread(fingerprint, repository, name))

    async def poll_once(self) -> None:
        """Load what changed or appeared, unload what went away: every model, where the repository is empty."""
        repository = self.settings.model_repository
        try:
            names = await asyncio.to_thread(repository_names, repository)
        except OSError as error:  # unreadable (a mount gone): serve on as is rather than unload everything
            self._say_poll_problem(f"polling {repository}: {error}; the models served stay served")
            return
        if names:
            self._poll_problem = None
        else:
            self._say_poll_problem(f"polling {repository}: it holds no model; every model served is unloaded, "
                                   "and a model folder added there is loaded")  # fmt: skip
        for name in [name for name in self.service.versions if name not in names]:
            async with self._locks.hold(name):
                self._unload(name)
        for name in names:
            now = await asyncio.to_thread(fingerprint, repository, name)
            if now != self._seen.get(name) and now != self._failed_at.get(name):
                try:
                    await self._load(name)
                except ServiceError as error:
                    self._failed_at[name] = now  # tried: again once its files change
                    log.warning("poll: %s", error.message)

    def _say_poll_problem(self, problem: str) -> None:
        """Log a problem of the repository as a whole once, not every round while it lasts."""
        if problem != self._poll_problem:
            log.warning("%s", problem)
        self._poll_problem = problem


class RemoteModelControl:
    """Model control in an HTTP worker of the engine process (CGSERVE_ENGINE_PROCESS): the engine process
    builds, serves and frees the models, so every call is made there (a CONTROL frame) and answered as
    it answers it. The MODELS frame of a change reaches every worker before the call's answer, so a load
    answered 200 here is served by this worker's next request, and by every other worker's."""

    def __init__(self, service: Service) -> None:
        assert service.engine_link is not None
        self.service = service
        self.link = service.engine_link
        self.mode = service.settings.model_control

    def start(self) -> None:
        pass  # the engine process polls, where the setting asks for it

    async def stop(self) -> None:
        pass

    async def index(self, *, ready_only: bool = False) -> list[dict[str, str]]:
        entries: list[dict[str, str]] = (await self._call("index", ready=ready_only))["index"]
        return entries

    async def load(self, name: str) -> None:
        await unless_stopping(self.service, f"load of {name!r}", self._call, "load", name)

    async def unload(self, name: str) -> None:
        await unless_stopping(self.service, f"unload of {name!r}", self._call, "unload", name)

    async def _call(self, op: str, name: str | None = None, **fields: Any) -> dict[str, Any]:
        if name is not None:
            fields["name"] = name
        answer = await self.link.control({"op": op, **fields})
        if "error" in answer:
            raise EngineProcessError(answer["error"])  # its status, code and message, as the engine answered
        return answer


async def unless_stopping(service: Service, what: str, call: Callable[..., Awaitable[T]], *args: Any) -> T:
    """call(*args)'s answer, or 503 once the server begins to drain. A load held up (a factory reading a slow
    mount, the model's lock) held its request through the whole shutdown timeout, its caller then cut off with a
    500 (the lifecycle review). The call is no longer waited for: a load goes on, or stop() cancels it."""
    if service.draining:
        raise NotReadyError(f"the server is stopping: no {what} now; call it again on a server that is not")
    waiting = asyncio.ensure_future(call(*args))
    drain = asyncio.ensure_future(service.drain_began.wait())
    try:
        done, _ = await asyncio.wait({waiting, drain}, return_when=asyncio.FIRST_COMPLETED)
    finally:  # neither is waited for past here (this caller cancelled too: a client that left)
        waiting.cancel()
        drain.cancel()
    if waiting in done:
        return waiting.result()
    raise NotReadyError(f"the server began to stop before the {what} ended; it may or may not have taken effect "
                        "there: call it again on a server that is not stopping")  # fmt: skip


def repository_names(repository: Path) -> list[str]:
    """The names of the repository's models; none for an empty repository, which model_folders refuses
    (start-up needs a model; a poll unloads them all). OSError: the repository cannot be read."""
    try:
        return [name for name, _, _ in model_folders(repository)]
    except ModelConfigError:  # model_folders' one refusal: no model folder at all
        return []


def fingerprint(repository: Path, name: str) -> Files:
    """Every file under the model's folder (but __pycache__ and hidden ones): what a change changes."""
    folder = repository / name
    if (repository / "model.toml").is_file():  # one model in the repository folder itself
        folder = repository
    with contextlib.suppress(OSError):
        return tuple(
            sorted((str(p.relative_to(folder)), p.stat().st_mtime_ns, p.stat().st_size)
                   for p in folder.rglob("*") if p.is_file() and not _skipped(p.relative_to(folder)))
        )  # fmt: skip
    return ()


def _skipped(relative: Path) -> bool:
    return any(part == "__pycache__" or part.startswith(".") for part in relative.parts)


def forget_frames(error: BaseException) -> None:
    """Drop the tracebacks of `error` and of every exception it was raised from or during. Their frames hold what a
    failed load read (the model's module, its weights: a probe's forward that raised has the module as `self`), in
    reference cycles that only a full collection frees, rare in the frozen heap (app/ops/heap.py): ten failed loads
    of a model of 200 MB held 955 MB more (bench/results/2026-12-07-cpu-review-probes/). What the answer says is in
    the messages."""
    chain: list[BaseException | None] = [error]
    seen: set[int] = set()
    while chain:
        if (link := chain.pop()) is None or id(link) in seen:
            continue
        seen.add(id(link))
        link.__traceback__ = None
        chain += [link.__cause__, link.__context__]
