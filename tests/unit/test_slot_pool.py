"""SlotPool alone: which device's slot a batch gets, and which slots come back."""

from __future__ import annotations

import asyncio

import pytest

from app.batching.slot_pool import SlotPool
from tests.unit.fake_engine import FakeEngine

pytestmark = pytest.mark.anyio


def two_devices(in_flight: int = 2) -> tuple[FakeEngine, FakeEngine, SlotPool]:
    first, second = FakeEngine(device="cuda:0", in_flight=in_flight), FakeEngine(device="cuda:1", in_flight=in_flight)
    return first, second, SlotPool([first, second])


def test_each_batch_goes_to_the_device_with_the_fewest_rows_in_flight() -> None:
    first, second, pool = two_devices()
    big = pool.take(8)
    assert big.engine is first  # both idle: the first device
    small = pool.take(2)
    assert small.engine is second
    assert pool.take(4).engine is second  # 2 rows in flight there against 8
    assert pool.rows_in_flight == [8, 6] and pool.batches_in_flight == [1, 2]
    pool.give_back(big, reusable=True)
    assert pool.take(1).engine is first


def test_idle_devices_take_turns() -> None:
    _, _, pool = two_devices()
    devices = []
    for _ in range(6):
        lease = pool.take(4)
        devices.append(lease.engine.device)
        pool.give_back(lease, reusable=True)  # back before the next: both idle every time
    assert devices == ["cuda:0", "cuda:1"] * 3
    assert pool.by_device(pool.launched) == {"cuda:0": 3, "cuda:1": 3}


def test_a_slot_only_ever_comes_from_and_returns_to_its_own_engine() -> None:
    first, second, pool = two_devices()
    for _ in range(20):
        leases = [pool.take(rows) for rows in (1, 8, 2, 4)]  # every slot of both devices
        for lease in leases:
            assert any(lease.slot is slot for slot in lease.engine.slots)
            pool.give_back(lease, reusable=True)
    assert pool.size == 4 and pool.batches_in_flight == [0, 0]
    assert {id(s) for s in first.slots}.isdisjoint(id(s) for s in second.slots)


async def test_a_slot_not_reusable_stays_out_and_wait_free_waits_for_a_slot() -> None:
    first, _, pool = two_devices(in_flight=1)
    lost = pool.take(8)
    held = pool.take(8)
    pool.give_back(lost, reusable=False)  # its batch never came back: the device may still write it
    with pytest.raises(RuntimeError, match="wait_free"):
        pool.take(1)
    waiting = asyncio.create_task(pool.wait_free())
    await asyncio.sleep(0)
    assert not waiting.done()
    pool.give_back(held, reusable=True)
    await asyncio.wait_for(waiting, timeout=5)
    assert pool.take(1).engine is not first  # the first device's only slot is gone for good


def test_an_empty_pool_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one engine"):
        SlotPool([])
