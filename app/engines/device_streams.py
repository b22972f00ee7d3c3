"""The streams CUDA engines run on, and the one thread they are built on: both reused across versions.

torch keeps a cuBLAS workspace (tens of MiB) for every (cuBLAS handle, stream) pair it has
run a GEMM on, for the life of the process, and a captured graph bakes that workspace's address
in: closing an engine frees its graphs but not the workspace its warm-up allocated. An engine
on a fresh pool stream, built on whichever thread asyncio's executor offered (each thread has
its own handle), left one more workspace behind at every load: 34 MiB a reload of the seed CNN
on the H200, none after this (bench/results/README.md).

So a closed engine's stream goes to the next engine built for that device, and every engine is
built on one thread (one handle): a reload warms up, captures and validates on the pair its
predecessor used, and finds its workspace there. The cache then holds one workspace per engine
alive at once on a device (two for a model being reloaded), whatever the number of reloads. Two
live engines never share a stream: their batches stay independent on the device, and no graph
ever sees another live graph's workspace. A stream with work still queued (a batch that never
came back) is not reused. What a retired version held is released on this thread as well
(app/engines/memory.py), never beside a capture: empty_cache's frees beside one hung a load.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:  # torch is imported by the engines that use these, not by every HTTP worker
    import torch

T = TypeVar("T")

_free: dict[str, list[torch.cuda.Stream]] = {}  # device → streams of closed engines
_lock = threading.Lock()  # engines are built on the build thread, closed on others
_builds = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine-build")


def take_stream(device: torch.device) -> torch.cuda.Stream:
    """A stream for a new engine on `device`: a closed engine's, else a new one from torch's pool."""
    import torch

    with _lock:
        free = _free.get(str(device))
        if free:
            return free.pop()
    return torch.cuda.Stream(device)  # non-blocking w.r.t. the default stream


def give_back_stream(device: torch.device, stream: torch.cuda.Stream) -> None:
    """`stream`'s engine is closed and nothing is queued there any more (stream.query()): a batch
    that never came back would make the next engine's warm-up wait behind it."""
    with _lock:
        _free.setdefault(str(device), []).append(stream)


async def on_build_thread(fn: Callable[..., T], /, *args: object, **kwargs: object) -> T:
    """Run an engine build on the one build thread (builds were one at a time before too)."""
    return await asyncio.get_running_loop().run_in_executor(_builds, partial(fn, *args, **kwargs))
