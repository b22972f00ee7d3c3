"""What the data plane and the routes need of a model's batcher, wherever its batches run.

Satisfied by app/batching/batcher.py's Batcher (the engines in this process) and by
app/engine_process/client.py's RemoteBatcher (the engines in the engine process): the layers above
hold a BatchQueue and never ask which.

What a request brings is `Images` (app/codecs/uploads.py): (k, C, H, W) pixels, or `Uploads`, encoded
images that the process holding the batcher decodes itself (a worker's JPEGs, decoded on the engine
process's GPU and inferred there in one trip, app/engine_process/client.py's EngineUploads).
`enqueue` takes either.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

import numpy as np

from app.codecs.uploads import Images


class NamedEngine(Protocol):
    @property
    def name(self) -> str:
        """eager | cuda-graph | compile | onnxruntime"""
        ...

    @property
    def device(self) -> str:
        """cpu | cuda:N"""
        ...


class BatchQueue(Protocol):
    dead_device: str | None  # the device that died, once one did

    @property
    def engines(self) -> tuple[NamedEngine, ...]:
        """One per device, all of one kind."""
        ...

    @property
    def dead(self) -> str | None:
        """Why the model's device (or the engine process) is dead, once it is."""
        ...

    def admit(self, deadline: float) -> None:
        """Refuse before a byte of the body is read: NotReadyError (dead), QueueFullError (503: full, or the
        queue ahead would outlast `deadline`, a time.monotonic())."""
        ...

    def enqueue(self, images: np.ndarray, deadline: float | None = None) -> asyncio.Future[np.ndarray]:
        """(k, C, H, W) uint8 or float32 images → the future of their (k, classes) float32 scores, once their
        batch ran; cancelling it drops the rows not yet launched."""
        ...

    def device_figures(self) -> dict[str, dict[str, Any]]:
        """Device → batches launched and in flight, where this process knows them ({} where it does not)."""
        ...

    async def stop(self) -> None: ...


def enqueue(queue: BatchQueue, images: Images, deadline: float) -> asyncio.Future[np.ndarray]:
    """A request's images onto its model's queue (admitted there already): pixels as they are, uploads by
    the way to where they are decoded (that process's queue admits them again on arrival)."""
    if isinstance(images, np.ndarray):
        return queue.enqueue(images, deadline)
    return images.enqueue(queue, deadline)
