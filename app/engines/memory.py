"""Giving a freed engine's memory back: its graph pool and pinned slots, not kept in torch's caches.

An engine's graphs, static buffers and pinned staging slots are freed when nothing refers to them;
torch's caching allocators then keep the blocks for reuse. A model unloaded while the service runs
(app/model_control.py) hands them back, so the device and the host see the memory again.
"""

from __future__ import annotations

import gc
import sys
from typing import Any


def release_memory(devices: tuple[str, ...]) -> None:
    """Collect what the closed engines left (the start-up heap frozen out of gc included: an engine built
    at start-up is in it), then empty torch's device and pinned-host caches. Runs on a thread."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()  # what lives now is long-lived again, as after start-up (app/ops/heap.py)
    torch = sys.modules.get("torch")
    if torch is None or not any(device.startswith("cuda") for device in devices):
        return
    for device in devices:
        if device.startswith("cuda"):
            with torch.cuda.device(device):
                torch.cuda.empty_cache()
    host_empty_cache = getattr(torch._C, "_host_emptyCache", None)  # the pinned-memory cache (torch ≥ 2.1)
    if host_empty_cache is not None:
        host_empty_cache()


def close_and_release(engines: list[Any], devices: tuple[str, ...], *, close: bool = True) -> None:
    """Close `engines` (not on a dead device: its streams may still run), drop them — the caller's list
    is the last reference — and release what they held. Runs on the build thread."""
    if close:
        for engine in engines:
            engine.close()
    engines.clear()
    release_memory(devices)
