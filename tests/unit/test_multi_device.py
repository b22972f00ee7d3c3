"""One model on two devices: the batcher over two fake engines, and what readiness says of each."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time

import numpy as np
import pytest
from prometheus_client import REGISTRY

from app.batching import shares as batch_shares
from app.batching.batcher import Batcher
from app.config import Settings
from app.engines.base import InputDtype, Slot
from app.errors import EngineError, NotReadyError
from app.http.routes.models import devices
from app.ops import metrics
from app.service import ServedModel, prepare_models
from tests.unit.fake_engine import FakeEngine, expected, images

pytestmark = pytest.mark.anyio

FOREVER = 60.0


def two_device_batcher(first: FakeEngine, second: FakeEngine, deaths: list[str] | None = None) -> Batcher:
    on_dead = deaths.append if deaths is not None else (lambda reason: None)
    return Batcher([first, second], max_delay_s=FOREVER, queue_limit=1024, request_timeout_s=FOREVER, on_dead=on_dead)


async def test_a_busy_device_gets_no_more_than_its_slots_and_the_rest_go_to_the_idle_one() -> None:
    busy, idle = FakeEngine(device="cuda:0"), FakeEngine(device="cuda:1")
    busy.gate.clear()  # cuda:0 never finishes a batch until the end
    batcher = two_device_batcher(busy, idle)
    batcher.start()
    try:
        values = [float(v) for v in range(1, 7)]
        requests = [asyncio.create_task(batcher.submit(images(*[v] * 8))) for v in values]  # 6 full batches
        # Batches 1 and 3 fill cuda:0's two slots (the first at a tie, the third at 8 rows each);
        # the idle device works through the rest while cuda:0 holds them.
        await asyncio.wait_for(asyncio.gather(*(requests[i] for i in (1, 3, 4, 5))), timeout=10)
        assert not requests[0].done() and not requests[2].done()
        assert len(busy.launches) == 2, "the busy device got more batches than it has slots"
        assert batcher.pool.by_device(batcher.pool.batches_in_flight) == {"cuda:0": 2, "cuda:1": 0}
        busy.gate.set()
        results = await asyncio.wait_for(asyncio.gather(*requests), timeout=10)
    finally:
        busy.gate.set()
        await batcher.stop()
    for value, result in zip(values, results, strict=True):
        np.testing.assert_array_equal(result, expected(*[value] * 8))
    assert batcher.pool.by_device(batcher.pool.launched) == {"cuda:0": 2, "cuda:1": 4}
    for engine in (busy, idle):  # every launch used one of its own engine's slots
        assert all(any(used is slot for slot in engine.slots) for used in engine.used_slots)


async def test_both_devices_share_a_steady_load_and_every_request_gets_its_own_rows() -> None:
    first, second = FakeEngine(device="cuda:0"), FakeEngine(device="cuda:1")
    batcher = Batcher([first, second], max_delay_s=0.0, queue_limit=1024, request_timeout_s=FOREVER)
    batcher.start()
    try:
        values = [float(v) for v in range(200)]
        results = await asyncio.wait_for(asyncio.gather(*(batcher.submit(images(v, v)) for v in values)), 10)
    finally:
        await batcher.stop()
    for value, result in zip(values, results, strict=True):
        np.testing.assert_array_equal(result, expected(value, value))
    launched = batcher.pool.launched
    assert min(launched) >= sum(launched) // 3, f"one device took most batches: {launched}"


async def test_a_lone_request_goes_at_once_to_the_idle_device_while_the_other_is_busy() -> None:
    busy, idle = FakeEngine(device="cuda:0"), FakeEngine(device="cuda:1")
    busy.gate.clear()
    batcher = two_device_batcher(busy, idle)  # max_delay FOREVER: only an idle device launches a partial batch
    batcher.start()
    try:
        first = asyncio.create_task(batcher.submit(images(1.0)))
        await busy.launched.wait()
        lone = await asyncio.wait_for(batcher.submit(images(2.0)), timeout=10)
        np.testing.assert_array_equal(lone, expected(2.0))
        assert [len(e.launches) for e in (busy, idle)] == [1, 1]
        busy.gate.set()
        await asyncio.wait_for(first, timeout=10)
    finally:
        busy.gate.set()
        await batcher.stop()


async def test_a_sticky_fault_on_one_device_declares_the_whole_service_dead() -> None:
    healthy, faulty = FakeEngine(device="cuda:0"), FakeEngine(device="cuda:1", poison=9.0, sticky=True)
    healthy.gate.clear()  # cuda:0 holds the first batch, so the poisoned one goes to cuda:1
    deaths: list[str] = []
    batcher = two_device_batcher(healthy, faulty, deaths)
    batcher.start()
    try:
        first = asyncio.create_task(batcher.submit(images(*[1.0] * 8)))
        await healthy.launched.wait()
        with pytest.raises(EngineError, match="poisoned"):
            await asyncio.wait_for(batcher.submit(images(*[9.0] * 8)), timeout=10)
        assert batcher.dead_device == "cuda:1" and deaths == [batcher.dead]
        assert "cuda:1" in deaths[0]
        with pytest.raises(NotReadyError, match="dead"):  # the healthy device does not keep the service up
            await batcher.submit(images(2.0))
        healthy.gate.set()
        await asyncio.wait_for(first, timeout=10)  # a batch already running on cuda:0 still comes back
    finally:
        healthy.gate.set()
        await batcher.stop()


async def test_a_hung_batch_on_one_device_declares_that_device_dead() -> None:
    hung, other = FakeEngine(device="cuda:0"), FakeEngine(device="cuda:1")
    hung.gate.clear()
    deaths: list[str] = []
    batcher = two_device_batcher(hung, other, deaths)
    batcher.start()
    try:
        request = asyncio.create_task(batcher.submit(images(*[1.0] * 8)))
        await hung.launched.wait()
        batcher.reap(time.monotonic() + batcher.batch_timeout_s + 1.0)
        with pytest.raises(NotReadyError, match="dead"):
            await request
        assert batcher.dead_device == "cuda:0" and len(deaths) == 1 and "a batch on cuda:0" in deaths[0]
    finally:
        hung.gate.set()
        await batcher.stop()


def test_engines_with_different_buckets_are_refused() -> None:
    with pytest.raises(ValueError, match="same buckets"):
        Batcher([FakeEngine((1, 2)), FakeEngine((1, 4))], max_delay_s=0, queue_limit=8, request_timeout_s=1)


def served_on_two_gpus() -> ServedModel:
    ((model, options),) = prepare_models(Settings(device="cpu"))
    return ServedModel(model.spec, dataclasses.replace(options, devices=("cuda:0", "cuda:1")))


async def test_readiness_and_the_model_card_name_each_devices_state() -> None:
    served = served_on_two_gpus()
    served.engines.append(FakeEngine(device="cuda:0"))
    ready, detail = served.readiness()
    assert not ready and "starting" in detail and "(cuda:0 ready, cuda:1 starting)" in detail
    served.engines.append(FakeEngine(device="cuda:1"))
    served.batcher = Batcher(served.engines, max_delay_s=0, queue_limit=8, request_timeout_s=1)
    assert served.readiness() == (True, "ready")
    card = devices(served)
    assert card["cuda:1"] == {"state": "ready", "batches_launched": 0, "batches_in_flight": 0}
    served.batcher.declare_dead("the cuda:1 device reported a fault", "cuda:1")
    ready, detail = served.readiness()
    assert not ready and "the cuda:1 device is dead" in detail and "(cuda:0 ready, cuda:1 dead)" in detail
    assert devices(served)["cuda:1"]["state"] == "dead"


def test_a_start_up_failure_on_the_second_device_is_reported_for_it() -> None:
    served = served_on_two_gpus()
    served.engines.append(FakeEngine(device="cuda:0"))
    served.failure = "RuntimeError: out of memory"
    ready, detail = served.readiness()
    assert not ready and "out of memory" in detail and "(cuda:0 ready, cuda:1 failed)" in detail


async def test_large_batches_are_staged_on_a_thread_with_the_same_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    threads: list[str] = []
    real_stage = batch_shares.stage

    def recording_stage(shares: list[batch_shares.Share], slot: Slot) -> InputDtype:
        threads.append(threading.current_thread().name)
        return real_stage(shares, slot)

    monkeypatch.setattr(batch_shares, "stage", recording_stage)
    monkeypatch.setattr(batch_shares, "STAGE_OFF_LOOP_BYTES", 64)  # the 1-row batch is 16 bytes, the 8-row one 80
    engine = FakeEngine()
    batcher = Batcher(engine, max_delay_s=0.0, queue_limit=1024, request_timeout_s=FOREVER)
    batcher.start()
    try:
        pixels = np.full((1, 1, 2, 2), 51, dtype=np.uint8)  # 0.2 once scaled
        small = await batcher.submit(images(1.0))
        large = await asyncio.wait_for(
            asyncio.gather(*(batcher.submit(x) for x in [pixels] * 4 + [images(0.5)] * 4)), 10
        )
    finally:
        await batcher.stop()
    assert threads[0] == threading.current_thread().name and threads[-1].startswith("stage")
    np.testing.assert_array_equal(small, expected(1.0))
    for result in large[:4]:
        np.testing.assert_allclose(result, expected(0.2), rtol=1e-6)
    for result in large[4:]:
        np.testing.assert_array_equal(result, expected(0.5))


def test_a_dead_device_of_a_second_version_turns_off_the_models_own_gauge() -> None:
    """The gauge was labelled with the version's title: a series model="cnn (version 2)" went to 0, and the model's
    own stayed at 1."""
    served = served_on_two_gpus()
    served = ServedModel(dataclasses.replace(served.spec, version="2"), served.options)
    served.engines.extend([FakeEngine(device="cuda:0"), FakeEngine(device="cuda:1")])
    served.batcher = Batcher(served.engines, max_delay_s=0, queue_limit=8, request_timeout_s=1)
    name = served.spec.name
    metrics.DEVICE_READY.labels(model=name, device="cuda:1").set(1)
    served.batcher.declare_dead("the cuda:1 device reported a fault", "cuda:1")
    assert not served.readiness()[0]
    assert REGISTRY.get_sample_value("cgserve_device_ready", {"model": name, "device": "cuda:1"}) == 0
    assert REGISTRY.get_sample_value("cgserve_device_ready", {"model": served.title, "device": "cuda:1"}) is None
