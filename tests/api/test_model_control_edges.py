"""Model control at its edges (the review of issue 27.2): an unload of a name nobody serves, a load
whose caller leaves half-way, a change made while a load builds, the index during a reload, and a
shutdown while versions retire; and the lifecycle review's: a poll of an emptied repository, an
unload beside another model's slow load, a load into an emptied repository. The app through its
lifespan on the CPU."""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from app.config import DEFAULT_REPOSITORY, Settings
from app.main import create_app
from app.model_control import ModelControl
from app.service import Service

MODEL = "fashion-cnn"
RAW = {"content-type": "application/octet-stream"}


def controlled_app(repository: Path, mode: str = "explicit", request_timeout_s: float = 0.5) -> TestClient:
    shutil.copytree(DEFAULT_REPOSITORY / MODEL, repository / MODEL, ignore=shutil.ignore_patterns("*.json"))
    settings = Settings(model_repository=repository, device="cpu", model_control=mode, model_poll_seconds=3600,
                        request_timeout_s=request_timeout_s)  # fmt: skip
    return TestClient(create_app(settings))


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    with controlled_app(tmp_path) as client:
        client.portal.call(service(client).wait_started)
        yield client


def service(client: TestClient) -> Service:
    return client.app.state.service  # type: ignore[attr-defined, no-any-return]


def control(client: TestClient) -> ModelControl:
    return client.app.state.control  # type: ignore[attr-defined, no-any-return]


def test_an_unload_of_a_name_nobody_serves_is_404_and_makes_no_metric_series(client: TestClient) -> None:
    for name in ("attacker-0", "attacker-1"):
        answer = client.post(f"/v2/repository/models/{name}/unload")
        assert answer.status_code == 404 and "no model of that name" in answer.json()["error"]
    assert "attacker" not in client.get("/metrics").text
    assert client.get(f"/v1/models/{MODEL}/ready").status_code == 200


def test_an_unload_of_a_model_in_the_repository_but_not_loaded_is_a_no_op(client: TestClient) -> None:
    assert client.post(f"/v2/repository/models/{MODEL}/unload").status_code == 200
    assert client.post(f"/v2/repository/models/{MODEL}/unload").status_code == 200  # again: nothing to do
    assert client.post(f"/v2/repository/models/{MODEL}/load").status_code == 200


def test_a_load_whose_caller_leaves_half_way_still_completes_and_leaves_nothing_unowned(client: TestClient) -> None:
    old = service(client).models[MODEL]

    started = asyncio.Event()
    load_when_free = control(client)._load_when_free

    async def noting(name: str) -> None:  # past the name's check against the repository's folders
        started.set()
        await load_when_free(name)  # its task made before its first wait

    control(client)._load_when_free = noting  # type: ignore[method-assign]

    async def leave_early() -> None:
        caller = asyncio.create_task(control(client).load(MODEL))
        await started.wait()  # the load has started building
        caller.cancel()  # a gRPC client's deadline passing
        with pytest.raises(asyncio.CancelledError):
            await caller
        await asyncio.gather(*control(client)._loads.values())  # the load itself goes on
        await control(client).retired()

    client.portal.call(leave_early)
    new = service(client).models[MODEL]
    assert new is not old and new.ready() and old.retired and not old.engines  # switched, the old one freed
    assert not control(client)._retiring and not control(client)._loads


def a_request_still_reading_its_body(client: TestClient) -> None:
    """What a request admitted just before a switch looks like to its version: admitted, not yet answered.
    The replaced version then drains until request_timeout_s after the switch."""
    service(client).models[MODEL].admitted += 1


def test_the_index_lists_each_version_once_during_a_reload(tmp_path: Path) -> None:
    with controlled_app(tmp_path, request_timeout_s=30) as client:  # the old version drains for 30 s
        client.portal.call(service(client).wait_started)
        a_request_still_reading_its_body(client)
        assert client.post(f"/v2/repository/models/{MODEL}/load").status_code == 200
        assert control(client)._retiring, "the replaced version should still be retiring"
        index = client.post("/v2/repository/index").json()
        assert index == [{"name": MODEL, "version": "1", "state": "READY", "reason": ""}]


def test_a_change_made_while_a_load_builds_is_loaded_by_the_next_poll(tmp_path: Path) -> None:
    with controlled_app(tmp_path, mode="poll") as client:
        client.portal.call(service(client).wait_started)
        client.portal.call(control(client)._poll_once_ready)
        toml = tmp_path / MODEL / "model.toml"
        toml.write_text("max_delay_ms = 3.0\n" + toml.read_text())
        prepare = control(client)._prepare

        def prepare_then_edit(repository: Path, name: str) -> object:
            prepared = prepare(repository, name)  # read: max_delay_ms 3
            toml.write_text(toml.read_text().replace("max_delay_ms = 3.0", "max_delay_ms = 5.0"))
            return prepared

        control(client)._prepare = prepare_then_edit  # type: ignore[method-assign]
        client.portal.call(control(client).poll_once)
        assert client.get(f"/v1/models/{MODEL}").json()["batching"]["max_delay_ms"] == 3.0
        control(client)._prepare = prepare  # type: ignore[method-assign]
        client.portal.call(control(client).poll_once)  # the edit made during the build
        assert client.get(f"/v1/models/{MODEL}").json()["batching"]["max_delay_ms"] == 5.0


def test_a_shutdown_while_a_version_retires_stops_and_closes_it(tmp_path: Path) -> None:
    with controlled_app(tmp_path, request_timeout_s=30) as client:
        client.portal.call(service(client).wait_started)
        old = service(client).models[MODEL]
        a_request_still_reading_its_body(client)
        assert client.post(f"/v2/repository/models/{MODEL}/load").status_code == 200
        batcher = old.batcher
        assert batcher is not None and control(client)._retiring
    # The lifespan has ended: the retiring version's batcher was stopped (its tasks gone) and its engines closed.
    assert batcher._loop_task is None and batcher._reaper_task is None  # type: ignore[attr-defined]


def test_model_control_with_several_workers_needs_the_engine_process() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="needs engine_process true"):
        Settings(model_control="explicit", workers=2)
    assert Settings(model_control="explicit", workers=2, engine_process=True).model_control == "explicit"


def test_a_reload_loop_holds_at_most_two_replaced_sets_while_they_drain(tmp_path: Path) -> None:
    """Each replaced version keeps its engines until request_timeout_s after the switch: reloads that come
    faster wait for the oldest, so the memory held stays bounded (review F5)."""
    with controlled_app(tmp_path, request_timeout_s=1.0) as client:
        client.portal.call(service(client).wait_started)
        retiring: list[int] = []
        for _ in range(4):
            a_request_still_reading_its_body(client)
            assert client.post(f"/v2/repository/models/{MODEL}/load").status_code == 200
            retiring.append(len(control(client)._retiring))
        assert max(retiring) == 2 and retiring[-1] == 2, retiring  # the third and fourth loads waited


def test_a_replaced_version_nobody_uses_is_freed_at_once(tmp_path: Path) -> None:
    """Every request it admitted answered: no need to hold its engines for request_timeout_s (30 s here)."""
    with controlled_app(tmp_path, request_timeout_s=30) as client:
        client.portal.call(service(client).wait_started)
        old = service(client).models[MODEL]
        for _ in range(3):
            assert client.post(f"/v1/models/{MODEL}/predict", content=bytes(784), headers=RAW).status_code == 200
        assert old.admitted == 0  # each answered request was counted out again
        began = time.monotonic()
        assert client.post(f"/v2/repository/models/{MODEL}/load").status_code == 200
        client.portal.call(control(client).retired)
        assert time.monotonic() - began < 10 and old.retired and not old.engines


def test_a_load_called_while_one_builds_loads_the_files_as_they_are_after_it(tmp_path: Path) -> None:
    """The running load read the files before this call: joining it would answer 200 for files never read."""
    with controlled_app(tmp_path) as client:
        client.portal.call(service(client).wait_started)
        toml = tmp_path / MODEL / "model.toml"
        toml.write_text("max_delay_ms = 3.0\n" + toml.read_text())
        prepare = control(client)._prepare

        def prepare_then_edit(repository: Path, name: str) -> object:
            prepared = prepare(repository, name)
            toml.write_text(toml.read_text().replace("max_delay_ms = 3.0", "max_delay_ms = 5.0"))
            return prepared

        control(client)._prepare = prepare_then_edit  # type: ignore[method-assign]

        async def two_loads() -> None:
            first = asyncio.create_task(control(client).load(MODEL))
            await asyncio.sleep(0)  # the first has started
            await control(client).load(MODEL)  # called while the first builds
            await first

        client.portal.call(two_loads)
        assert client.get(f"/v1/models/{MODEL}").json()["batching"]["max_delay_ms"] == 5.0


def series(client: TestClient, family: str, labels: dict[str, str]) -> float:
    """The value of `family`'s one series with exactly these labels on /metrics (other tests in this process
    may have made other series of the same model)."""
    for metric in text_string_to_metric_families(client.get("/metrics").text):
        for sample in metric.samples:
            if sample.name == family and sample.labels == labels:
                return float(sample.value)
    raise AssertionError(f"no {family}{labels} on /metrics")


def test_an_unload_zeroes_its_engines_series_and_a_reload_of_the_same_version_keeps_them(client: TestClient) -> None:
    """Found by a docs walk-through: after an unload, cgserve_engine_info and cgserve_device_ready still said 1.
    A reload retires the old version after the new one (same labels) serves: that must not zero the new one's."""
    served = service(client).models[MODEL]
    engine = served.engines[0]
    watched = {
        "cgserve_engine_info": {"engine": engine.name, "device": "cpu", "dtype": "fp32", "model": MODEL},
        "cgserve_device_ready": {"model": MODEL, "device": "cpu"},
        "cgserve_model_ready": {"model": MODEL},
        "cgserve_queue_depth_rows": {"model": MODEL, "version": served.spec.version},
    }
    assert client.post(f"/v2/repository/models/{MODEL}/unload").status_code == 200
    client.portal.call(control(client).retired)
    assert [series(client, family, labels) for family, labels in watched.items()] == [0, 0, 0, 0]
    for _ in range(2):  # loaded after the unload, then loaded again over itself
        assert client.post(f"/v2/repository/models/{MODEL}/load").status_code == 200
        client.portal.call(control(client).retired)
        assert [series(client, family, labels) for family, labels in list(watched.items())[:3]] == [1, 1, 1]


def test_an_unloaded_versions_retire_does_not_zero_a_device_a_load_building_beside_it_has_made_ready(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second review's race: an unload, then a load on two devices while the unloaded version still answers a
    request. Its retire ran between the load's two device builds and zeroed device 0's readiness for good."""
    import app.model_control as model_control
    import app.service as service_module

    two = ("cpu", "cpu:1")  # two devices, as cuda:0,cuda:1: each engine built on the CPU, named as the device
    monkeypatch.setattr(service_module, "resolve_devices", lambda setting: two)
    monkeypatch.setattr(model_control, "resolve_devices", lambda setting: two)
    build = service_module.build_engine

    def slow_build(*args: Any, device: str, **kwargs: Any) -> Any:
        time.sleep(1.0)  # the retire's turn on the build thread comes between the two devices
        engine = build(*args, device="cpu", **kwargs)
        engine.device = device
        return engine

    monkeypatch.setattr(service_module, "build_engine", slow_build)
    with controlled_app(tmp_path, request_timeout_s=10) as client:
        client.portal.call(service(client).wait_started)
        old = service(client).models[MODEL]
        old.admitted = 1  # a request it admitted, still reading its body

        async def unload_then_load() -> None:
            await control(client).unload(MODEL)
            asyncio.get_running_loop().call_later(0.9, setattr, old, "admitted", 0)  # answered as device 0 builds
            await control(client).load(MODEL)
            await control(client).retired()

        client.portal.call(unload_then_load)
        assert [engine.device for engine in service(client).models[MODEL].engines] == list(two)
        ready = [series(client, "cgserve_device_ready", {"model": MODEL, "device": device}) for device in two]
        assert ready == [1, 1]


# The lifecycle review's defects (D2, D4, D5).


def test_poll_unloads_the_last_model_when_its_folder_goes_and_loads_one_added_later(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An empty repository is a change like any other: its models go, polling goes on (it used to stop each
    round at "holds no model", the model served for ever)."""
    repository, aside = tmp_path / "repository", tmp_path / "aside"
    with controlled_app(repository, mode="poll") as client:
        client.portal.call(service(client).wait_started)
        client.portal.call(control(client)._poll_once_ready)
        shutil.move(repository / MODEL, aside)
        with caplog.at_level(logging.WARNING, logger="app.model_control"):
            for _ in range(3):
                client.portal.call(control(client).poll_once)
        assert client.post(f"/v1/models/{MODEL}/predict", content=bytes(784), headers=RAW).status_code == 404
        assert "READY" not in [entry["state"] for entry in client.post("/v2/repository/index").json()]
        said = [record.getMessage() for record in caplog.records if "holds no model" in record.getMessage()]
        assert len(said) == 1, said  # said once, not every round
        shutil.move(aside, repository / MODEL)
        client.portal.call(control(client).poll_once)
        assert client.get(f"/v1/models/{MODEL}/ready").status_code == 200


HELD_MODEL = '''"""The seed CNN, built once the test says so (weights on a slow mount): its load is held until then."""
import time
from pathlib import Path

from models.cnn import FashionCNN

GATES = Path(__file__).resolve().parents[2]  # beside the repository, so that its files stay as they are


def build() -> FashionCNN:
    (GATES / "building").touch()
    deadline = time.monotonic() + 20  # a test that fails still ends
    while not (GATES / "released").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    return FashionCNN()
'''


def a_held_load(client: TestClient, repository: Path, name: str = "held") -> Future[None]:
    """A load of a new model `name` under way, its factory waiting for released_loads(); the load's future."""
    shutil.copytree(repository / MODEL, repository / name)
    (repository / name / "model.py").write_text(HELD_MODEL)
    toml = repository / name / "model.toml"
    toml.write_text(toml.read_text().replace('"models.cnn:FashionCNN"', '"model:build"'))
    loading = client.portal.start_task_soon(control(client).load, name)
    building, deadline = repository.parent / "building", time.monotonic() + 60
    while not building.exists() and not loading.done() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert building.exists() and not loading.done(), "the held load should be building"
    return loading


def released_loads(repository: Path) -> None:
    (repository.parent / "released").touch()


def test_an_unload_of_one_model_does_not_wait_for_another_models_load(tmp_path: Path) -> None:
    """An unload stops the model's calls at once, whatever other model is loading (it waited for the one
    lock a load held while it read files and built engines, the unloaded model serving meanwhile)."""
    repository = tmp_path / "repository"
    with controlled_app(repository) as client:
        client.portal.call(service(client).wait_started)
        loading = a_held_load(client, repository)
        try:
            began = time.monotonic()
            answer = client.post(f"/v2/repository/models/{MODEL}/unload")
            took, still_loading = time.monotonic() - began, not loading.done()
            refused = client.post(f"/v1/models/{MODEL}/predict", content=bytes(784), headers=RAW).status_code
        finally:
            released_loads(repository)
        loading.result(timeout=60)
        assert answer.status_code == 200 and still_loading and took < 5, (answer.text, took)
        assert refused == 404  # stopped while the other model still loaded
        assert client.get("/v1/models/held/ready").status_code == 200


def test_an_unload_of_a_model_whose_load_is_held_waits_for_it_and_leaves_it_unloaded(tmp_path: Path) -> None:
    """Calls for one model still go one after the other: the unload comes last, so the model ends unloaded."""
    repository = tmp_path / "repository"
    with controlled_app(repository) as client:
        client.portal.call(service(client).wait_started)
        loading = a_held_load(client, repository)
        try:
            unloading = client.portal.start_task_soon(control(client).unload, "held")
            time.sleep(0.5)
            waited = not unloading.done()
        finally:
            released_loads(repository)
        loading.result(timeout=60)
        unloading.result(timeout=60)
        assert waited, "the unload should wait for the load of the same model"
        assert client.get("/v1/models/held/ready").status_code == 404
        assert client.get(f"/v1/models/{MODEL}/ready").status_code == 200


def test_a_load_into_an_emptied_repository_is_404_naming_the_model(tmp_path: Path) -> None:
    """As for any name the repository does not hold (it answered 400 with the repository's "holds no model")."""
    repository = tmp_path / "repository"
    with controlled_app(repository) as client:
        client.portal.call(service(client).wait_started)
        shutil.move(repository / MODEL, tmp_path / "aside")
        for name in (MODEL, "nowhere"):
            answer = client.post(f"/v2/repository/models/{name}/load")
            assert answer.status_code == 404, answer.text
            assert f"holds no model named '{name}'" in answer.json()["error"]
        assert client.get(f"/v1/models/{MODEL}/ready").status_code == 200  # what served still serves


def test_an_unload_called_while_a_load_waits_for_drains_comes_after_it(client: TestClient) -> None:
    """A load waits while two earlier sets of the model's versions still drain; an unload called meanwhile ran
    first, and the load then served the model the last call had unloaded (a second review's find)."""
    from app.model_control import RETIRING_SETS, Retiring

    async def call_in_order() -> None:
        held = asyncio.Event()
        stand_ins = [Retiring(service(client).models[MODEL], asyncio.create_task(held.wait()), i) for i in range(2)]
        assert len(stand_ins) == RETIRING_SETS  # as many sets as a load waits behind
        control(client)._retiring.extend(stand_ins)
        loading = asyncio.create_task(control(client).load(MODEL))
        await asyncio.sleep(0.2)  # the load is waiting for the drains
        unloading = asyncio.create_task(control(client).unload(MODEL))
        await asyncio.sleep(0.2)
        held.set()
        for stand_in in stand_ins:
            await stand_in.task
            control(client)._retiring.remove(stand_in)
        await asyncio.gather(loading, unloading)

    client.portal.call(call_in_order)
    assert client.get(f"/v1/models/{MODEL}/ready").status_code == 404  # the last call's state: unloaded


def test_a_load_of_a_name_no_folder_has_reads_nothing_and_keeps_nothing(
    client: TestClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A name was joined to the repository's path before it was checked: "/usr" or ".." walked that folder file by
    file (60 s, 1 GB, beside every other load), and each refused name kept its failure for ever (the lifecycle
    review). Now checked against the repository's folders first."""
    import app.model_control

    read: list[str] = []
    monkeypatch.setattr(app.model_control, "fingerprint", lambda repository, name: read.append(name) or ())
    names = ["..", "/usr", str(tmp_path), "../" + MODEL, "no-such-model", "x" * 30_000]
    for name in names:
        with pytest.raises(app.model_control.ControlError) as refused:
            client.portal.call(control(client).load, name)
        assert refused.value.status == 404 and "holds no model named" in refused.value.message
    answer = client.post("/v2/repository/models/%2E%2E/load")
    assert answer.status_code == 404 and "holds no model named '..'" in answer.json()["error"], answer.text
    assert read == [] and control(client)._failures == {} and not control(client)._loads
    assert client.post(f"/v2/repository/models/{MODEL}/load").status_code == 200 and read == [MODEL]


def test_a_load_or_unload_under_way_when_the_drain_begins_is_503_at_once(tmp_path: Path) -> None:
    """The load's request was held until the shutdown timeout cut it with a 500 (the lifecycle review): the call
    answers 503 as the drain begins, and later calls at once."""
    from app.errors import NotReadyError

    repository = tmp_path / "repository"
    with controlled_app(repository) as client:
        client.portal.call(service(client).wait_started)
        loading = a_held_load(client, repository)
        unloading = client.portal.start_task_soon(control(client).unload, "held")  # waits for the load's lock
        try:
            time.sleep(0.2)
            began = time.monotonic()
            client.portal.call(service(client).begin_drain)
            for call in (loading, unloading):
                with pytest.raises(NotReadyError, match=r"the server began to stop before the (un)?load of 'held'"):
                    call.result(timeout=10)
            took = time.monotonic() - began
            answer = client.post(f"/v2/repository/models/{MODEL}/load")
        finally:
            released_loads(repository)
        assert took < 5, took
        assert answer.status_code == 503 and "the server is stopping: no load of 'fashion-cnn'" in answer.json()[
            "error"], answer.text  # fmt: skip


def test_a_model_s_files_are_read_on_a_thread_a_stopping_process_does_not_wait_for(client: TestClient) -> None:
    """A factory reading a slow mount held the engine process's exit for as long (SIGKILLed 46 s after SIGTERM): the
    loop's executor threads and ThreadPoolExecutor's are joined at exit, a daemon thread is not."""
    import threading

    daemons: list[bool] = []
    prepare = control(client)._prepare

    def noting(*args: Any) -> Any:
        daemons.append(threading.current_thread().daemon)
        return prepare(*args)

    control(client)._prepare = noting  # type: ignore[method-assign]
    assert client.post(f"/v2/repository/models/{MODEL}/load").status_code == 200
    assert daemons == [True]


def test_a_model_of_two_versions_unloaded_loads_again_at_once_while_they_drain(tmp_path: Path) -> None:
    """A load waits while two earlier sets of the model drain; after an unload, no version served to tell a set's
    size by, and the two versions of one set made the load wait request_timeout_s (the lifecycle review)."""
    with controlled_app(tmp_path, request_timeout_s=30) as client:
        client.portal.call(service(client).wait_started)
        model = tmp_path / MODEL
        for version in ("1", "2"):
            (model / version).mkdir()
            shutil.copy(model / "fashion_cnn.pt", model / version)
        (model / "fashion_cnn.pt").unlink()
        toml = model / "model.toml"
        toml.write_text("version_policy = { all = {} }\n" + toml.read_text())  # above its [preprocess] table
        assert client.post(f"/v2/repository/models/{MODEL}/load").status_code == 200
        for version in ("1", "2"):  # a request each version admitted and has not answered: they drain 30 s
            service(client).versions[MODEL][version].admitted += 1
        assert client.post(f"/v2/repository/models/{MODEL}/unload").status_code == 200
        began = time.monotonic()
        assert client.post(f"/v2/repository/models/{MODEL}/load").status_code == 200
        took = time.monotonic() - began
        assert took < 10 and sorted(service(client).versions[MODEL]) == ["1", "2"], took


FAILING_MODEL = """
import sys
import weakref

import torch


class FailsOnItsFirstBatch(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1000))
        sys.modules["failed_load_probe"].made.append(weakref.ref(self))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("fails at warm-up")


def build() -> torch.nn.Module:
    return FailsOnItsFirstBatch()
"""


def test_a_failed_load_lets_go_of_the_model_it_read(
    tmp_path: Path, client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The failure's tracebacks held the model's module (the probe's forward had it as `self`) in reference cycles
    that only a full collection frees, rare in the frozen heap: ten failed loads of a model of 200 MB held 955 MB
    more, 764 in the engine process (bench/results/2026-12-07-cpu-review-probes/). With the collector off, as it is
    for long between full collections: every module a failed load built is gone once the answer is given."""
    import gc
    import sys
    import types

    probe = types.ModuleType("failed_load_probe")
    probe.made = []  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "failed_load_probe", probe)
    folder = tmp_path / "fails"
    folder.mkdir()
    (folder / "model.py").write_text(FAILING_MODEL)
    (folder / "model.toml").write_text('format = "python"\nfactory = "model:build"\ninput_shape = [1, 28, 28]\n'
                                       'labels = ["a", "b"]\n')  # fmt: skip
    gc.disable()
    try:
        for _ in range(3):
            answer = client.post("/v2/repository/models/fails/load")
            assert answer.status_code == 400 and "fails at warm-up" in answer.json()["error"]
        assert len(probe.made) == 3 and [ref() for ref in probe.made] == [None] * 3  # type: ignore[attr-defined]
    finally:
        gc.enable()
