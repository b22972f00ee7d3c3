"""Device views of pinned host memory: kernels read a slot's pixels and write its probabilities in place.

With unified addressing (every 64-bit CUDA platform), host memory from cudaHostAlloc — what
`pin_memory()` hands out — is mapped into each device's address space at the same address, so a
CUDA tensor over that address lets a kernel read or write host memory directly, over PCIe. In a
graph that replaces the H2D and D2H memcpy nodes: the first kernel reads the staged pixels, the
softmax writes its (b, classes) probabilities straight into the slot.

torch makes such a tensor from any object offering `__cuda_array_interface__` (numba's protocol);
it asks the driver which device the pointer belongs to, and pinned host memory answers with the
device it was allocated against. Where that is not the engine's device, torch would copy instead
of aliasing: `device_view` refuses that rather than hand back a silent copy.
"""

from __future__ import annotations

from typing import Any

import torch


class _CudaArrayInterface:
    """The minimum numba's protocol asks for, over a pinned host tensor it keeps alive."""

    def __init__(self, host: torch.Tensor) -> None:
        self._host = host
        self.__cuda_array_interface__: dict[str, Any] = {
            "shape": tuple(host.shape),
            "typestr": host.numpy().dtype.str,  # "|u1", "<f4"
            "data": (host.data_ptr(), False),  # (address, read-only)
            "strides": None,  # C-contiguous
            "version": 3,
        }


def device_view(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A CUDA tensor on `device` aliasing the pinned, contiguous `host` tensor; ValueError where none can."""
    if not (host.is_pinned() and host.is_contiguous()):
        raise ValueError("a device view needs pinned, contiguous host memory")
    view = torch.as_tensor(_CudaArrayInterface(host), device=device)
    if view.data_ptr() != host.data_ptr():
        raise ValueError(f"pinned memory at {host.data_ptr():#x} is not mapped on {device}: torch made a copy")
    return view
