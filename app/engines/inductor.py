"""Inductor's fused kernels for the graph engine to capture (compile = "inductor" | "max-autotune").

torch.compile's own "reduce-overhead" mode wraps its kernels in cudagraph trees, whose per-call
bookkeeping costs host time on every batch. Here inductor compiles without CUDA graphs of its
own, one static shape per bucket (dynamic=False), and the engine captures those kernels in its
plain CUDA graphs like any other module: a batch is still one replay (bench/results has the
comparison). Compilation happens at the warm-up that precedes each bucket's capture.

Compiled code is cached on disk (CGSERVE_COMPILE_CACHE_DIR → TORCHINDUCTOR_CACHE_DIR), so a
restart with the same model, buckets and GPU loads the kernels instead of compiling them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from torch import nn

log = logging.getLogger(__name__)

# The `compile` setting → torch.compile's mode. "default" is inductor without CUDA graphs;
# max-autotune's own mode would add cudagraph trees, so its no-cudagraphs twin is captured.
CAPTURE_MODES: dict[str, str | None] = {
    "none": None,
    "inductor": "default",
    "max-autotune": "max-autotune-no-cudagraphs",
}


def compile_module(module: nn.Module, torch_mode: str | None, shapes: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """`module` itself, or torch.compile'd in `torch_mode` for `shapes` static input shapes."""
    if torch_mode is None:
        return module
    allow_recompiles(shapes)
    log.info("torch.compile mode %s; each bucket compiles at its first warm-up", torch_mode)
    compiled: Callable[[torch.Tensor], torch.Tensor] = torch.compile(module, mode=torch_mode, dynamic=False)
    return compiled


def allow_recompiles(shapes: int) -> None:
    """One compiled graph per bucket: dynamo's recompile limit (8) must not send the rest to eager."""
    import torch._dynamo.config as dynamo_config

    limit = max(8, shapes + 4)
    for name in ("recompile_limit", "cache_size_limit"):  # the name changed across torch releases
        if hasattr(dynamo_config, name):
            setattr(dynamo_config, name, max(getattr(dynamo_config, name), limit))
    dynamo_config.automatic_dynamic_shapes = False  # a new bucket size is a new static shape, never dynamic
