"""app/front_door/launcher.py's bookkeeping, with a stand-in door and service: a stop that finds the tend's close
under way waits for it (the door must not be freed while the launcher's thread answers through it); a load that
makes another version the default stops the launcher in the same step and binds it to that version; a close that
times out leaves the version's engines and the door to the process's end, and nothing is bound after it. launch.c
itself is tests/integration's."""

from __future__ import annotations

import asyncio
import threading
import time
import types
from typing import Any

import numpy as np
import pytest

from app.front_door import launcher as launcher_module
from app.front_door.feeder import FORM, PROTOCOL
from app.front_door.launcher import Launcher
from app.ops import metrics

pytestmark = pytest.mark.anyio


class FakeBatcher:
    def __init__(self) -> None:
        self.engines = [types.SimpleNamespace(launcher_slots=3, name="cuda-graph", device="cuda:0",
                                              launcher_handles=lambda: object())]  # fmt: skip
        self.dead = None


def version(number: str) -> Any:
    spec = types.SimpleNamespace(name="m", version=number, input_shape=(1, 28, 28),
                                 layout=types.SimpleNamespace(default=True))  # fmt: skip
    return types.SimpleNamespace(spec=spec, batcher=FakeBatcher(), retired=False, launcher_bound=False,
                                 launcher_stuck=False)  # fmt: skip


class FakeDoor:
    """The calls launcher.py makes of app/front_door/door.py's Door; a close takes `close_s`."""

    def __init__(self, close_s: float = 0.0, ends: bool = True) -> None:
        self.close_s, self.ends = close_s, ends
        self.calls: list[str] = []
        self.closed = threading.Event()

    def open_launcher(self, *_: Any) -> None:
        self.calls.append("open")

    figures: Any = None  # what the next launcher_figures() gives, once

    def launcher_figures(self) -> Any:
        figures, self.figures = self.figures, None
        return figures

    def stop_launcher(self) -> None:
        self.calls.append("stop")

    def close_launcher(self, timeout_s: float) -> bool:
        self.calls.append("close")
        time.sleep(self.close_s)
        self.closed.set()
        return self.ends

    def free_launcher(self) -> None:
        self.calls.append("free")


@pytest.fixture
def parts(monkeypatch: pytest.MonkeyPatch) -> tuple[Any, dict[str, Any]]:
    monkeypatch.setattr(launcher_module, "Batcher", FakeBatcher)
    monkeypatch.setattr(launcher_module, "Answers", lambda *_: types.SimpleNamespace(prefix=b"", names=[]))
    monkeypatch.setattr(launcher_module, "V2Codec", lambda *_: None)
    default = {"served": version("1")}
    service = types.SimpleNamespace(settings=types.SimpleNamespace(batch_timeout_s=1.0, front_door_launcher=True),
                                    model=lambda name: default["served"], on_install=[])  # fmt: skip
    return service, default


async def test_a_stop_waits_for_the_close_the_tend_began(parts: tuple[Any, dict[str, Any]]) -> None:
    service, default = parts
    door = FakeDoor(close_s=0.5)
    launcher = Launcher(service, door, (1, 28, 28))  # type: ignore[arg-type]
    await launcher.tend()
    bound = default["served"]
    assert launcher.bound is bound and bound.launcher_bound and door.calls == ["open"]
    default["served"] = version("2")  # the tend below closes the launcher on version 1
    tend = asyncio.create_task(launcher.tend())
    await asyncio.to_thread(lambda: [time.sleep(0.01) for _ in range(100) if "close" not in door.calls])
    tend.cancel()  # FrontDoor.stop's first step
    await asyncio.gather(tend, return_exceptions=True)
    assert await launcher.unbind(1.0, for_good=True)
    assert door.closed.is_set() and not bound.launcher_bound  # the close had ended when the stop went on
    assert door.calls == ["open", "close", "free"]  # closed once, never bound again
    await launcher.tend()
    assert door.calls == ["open", "close", "free"]


async def test_a_load_stops_the_launcher_at_once_and_binds_the_new_version(parts: tuple[Any, dict[str, Any]]) -> None:
    service, default = parts
    door = FakeDoor()
    launcher = Launcher(service, door, (1, 28, 28))  # type: ignore[arg-type]
    await launcher.tend()
    old = default["served"]
    default["served"] = new = version("2")
    for listener in service.on_install:  # Service.install's step
        listener("m")
    assert door.calls == ["open", "stop"]  # new rows go to the feeder from this step on
    for _ in range(100):
        if launcher.bound is new:
            break
        await asyncio.sleep(0.01)
    assert launcher.bound is new and new.launcher_bound and not old.launcher_bound
    assert door.calls == ["open", "stop", "close", "free", "open"]


async def test_a_close_that_times_out_keeps_the_engines_and_the_door(parts: tuple[Any, dict[str, Any]]) -> None:
    service, default = parts
    door = FakeDoor(ends=False)
    launcher = Launcher(service, door, (1, 28, 28))  # type: ignore[arg-type]
    await launcher.tend()
    served = default["served"]
    default["served"] = version("2")
    await launcher.tend()  # its close times out
    assert served.launcher_stuck and not served.launcher_bound
    assert door.calls == ["open", "close"]  # not freed: its thread may still answer
    await launcher.tend()  # a new default: nothing is bound while the stuck thread may still answer
    default["served"] = served
    await launcher.tend()  # nor the stuck version again (a second launcher on its slots)
    assert door.calls == ["open", "close"]
    assert not await launcher.unbind(1.0, for_good=True)  # the stop leaves the door to the process's end


async def test_a_failed_batchs_503s_are_counted_as_rejections_and_its_device_declared_dead(
    parts: tuple[Any, dict[str, Any]],
) -> None:
    service, default = parts
    door = FakeDoor()
    launcher = Launcher(service, door, (1, 28, 28))  # type: ignore[arg-type]
    await launcher.tend()
    served = default["served"]
    declared: list[tuple[str, str]] = []
    served.batcher.declare_dead = lambda why, device: declared.append((why, device))
    empty = np.zeros(0)
    door.figures = types.SimpleNamespace(latencies=empty, rows=empty, buckets=empty, seconds=empty, lost=0, pending=0,
                                         dead="a batch failed", failed=3, batches_lost=0)  # fmt: skip
    codes = metrics.REQUESTS.labels(model="m", protocol=PROTOCOL, format=FORM, code="503")
    rejections = metrics.REJECTIONS.labels(model="m", reason="not_ready")
    before = (codes._value.get(), rejections._value.get())
    launcher.count()
    assert (codes._value.get() - before[0], rejections._value.get() - before[1]) == (3, 3)
    assert declared == [("a batch failed", "cuda:0")]


def test_only_the_default_models_engine_gets_launcher_slots() -> None:
    """The launcher serves the default model alone (decided before any engine is built), where its outputs are class
    scores: another model's engine, or one of named outputs, captures no slots for it (pinned rows and graphs never
    launched)."""
    from app.config import Settings
    from app.service import Service

    def spec(name: str, scores: bool = True) -> Any:
        return types.SimpleNamespace(name=name, layout=types.SimpleNamespace(default=scores))

    one_gpu, two_gpus, cpu = (types.SimpleNamespace(devices=d) for d in (["cuda:0"], ["cuda:0", "cuda:1"], ["cpu"]))
    service = Service(Settings(front_door_port=8002, default_model="a"))
    assert service._launcher_wanted(spec("a"), one_gpu)  # type: ignore[arg-type]
    assert not service._launcher_wanted(spec("b"), one_gpu)  # type: ignore[arg-type]
    assert not service._launcher_wanted(spec("a", scores=False), one_gpu)  # type: ignore[arg-type]
    assert not service._launcher_wanted(spec("a"), two_gpus) and not service._launcher_wanted(spec("a"), cpu)  # type: ignore[arg-type]
    service.default_name = None  # several served at first, none named: /predict has no model
    assert not service._launcher_wanted(spec("a"), one_gpu)  # type: ignore[arg-type]
    for off in (
        Settings(front_door_port=8002, default_model="a", front_door_launcher=False),
        Settings(default_model="a"),
    ):
        assert not Service(off)._launcher_wanted(spec("a"), one_gpu)  # type: ignore[arg-type]


async def test_a_dead_devices_launcher_is_closed_and_not_bound_again(parts: tuple[Any, dict[str, Any]]) -> None:
    """Once the batcher has declared the device dead (its own batch failed), the launcher takes no more rows: they
    would wait for the batch timeout, where the batcher refuses them at once."""
    service, default = parts
    door = FakeDoor()
    launcher = Launcher(service, door, (1, 28, 28))  # type: ignore[arg-type]
    await launcher.tend()
    served = default["served"]
    served.batcher.dead = "a batch failed"
    await launcher.tend()
    await launcher.tend()
    assert door.calls == ["open", "close", "free"] and launcher.bound is None and not served.launcher_bound
