"""Decoding that would stall the event loop runs on a small thread pool instead.

An image decode (Pillow releases the GIL while it inflates and resamples) or a large JSON body
(orjson and numpy over millions of numbers) can take tens to hundreds of milliseconds; on the
loop that is time no other request is read, batched or answered. The pool is bounded (its
threads), and so is what waits for it: bodies in flight are bounded by CGSERVE_MAX_INFLIGHT_BYTES.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar

T = TypeVar("T")

# JSON bodies below this decode in well under a millisecond: the thread hop would cost more.
LARGE_JSON_BYTES = 256 * 1024
_pool = ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1), thread_name_prefix="decode")


async def off_loop(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    return await asyncio.get_running_loop().run_in_executor(_pool, partial(fn, *args, **kwargs))
