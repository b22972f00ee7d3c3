"""Inductor's fused kernels for the graph engine to capture (compile = "inductor" | "max-autotune").

torch.compile's own "reduce-overhead" mode wraps its kernels in cudagraph trees, whose per-call
bookkeeping costs host time on every batch. Here inductor compiles without CUDA graphs of its
own, one static shape per (bucket, input dtype) (dynamic=False), and the engine captures those
kernels in its plain CUDA graphs like any other module: a batch is still one replay.
Compilation happens at the warm-up that precedes each bucket's capture.

Dynamo runs a function eagerly, with a warning, once it has compiled it `recompile_limit` times,
and the limit is per code object: two models of one class share it. A bucket silently served by
the eager module is what this module exists to prevent, so every compile raises the limits by the
shapes it will need (cumulatively, over every engine of the process) and a limit that is hit
anyway raises (`fail_on_recompile_limit_hit`): the engine then serves a graph of the eager module
and says so (app/engines/cuda.py), or refuses to start under compile_strict.

Compiled code is cached on disk (CGSERVE_COMPILE_CACHE_DIR → TORCHINDUCTOR_CACHE_DIR), so a
restart with the same model, buckets and GPU loads the kernels instead of compiling them.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from typing import Any

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

_shapes_asked = 0  # static shapes every compile of this process asked for, all modules together


def compile_module(module: nn.Module, torch_mode: str | None, shapes: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """`module` itself, or torch.compile'd in `torch_mode` for `shapes` static input shapes."""
    if torch_mode is None:
        return module
    allow_recompiles(shapes)
    log.info("torch.compile mode %s; each bucket compiles at its first warm-up", torch_mode)
    compiled: Callable[[torch.Tensor], torch.Tensor] = torch.compile(module, mode=torch_mode, dynamic=False)
    return compiled


def allow_recompiles(shapes: int) -> None:
    """Raise dynamo's limits by `shapes` more compiled graphs, and make hitting them an error, not eager."""
    import torch._dynamo.config as dynamo_config

    global _shapes_asked
    _shapes_asked += shapes
    # Headroom for guards that split one shape in two (a mapped host view against a device tensor).
    limit = 2 * _shapes_asked + 8
    for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(dynamo_config, name):  # the names changed across torch releases
            setattr(dynamo_config, name, max(getattr(dynamo_config, name), limit))
    for name in ("fail_on_recompile_limit_hit", "fail_on_cache_limit_hit"):
        if hasattr(dynamo_config, name):
            setattr(dynamo_config, name, True)
            break
    dynamo_config.automatic_dynamic_shapes = False  # a new bucket size is a new static shape, never dynamic


def compile_errors() -> tuple[type[Exception], ...]:
    """What a failed compile raises at a warm-up: dynamo's and inductor's errors (a missing C toolchain or
    Python.h arrives as BackendCompilerFailed), and a recompile limit hit."""
    from torch._dynamo import exc

    errors: list[type[Exception]] = [exc.TorchDynamoException]
    limit_hit = getattr(exc, "FailOnRecompileLimitHit", None) or getattr(exc, "FailOnCacheLimitHit", None)
    if limit_hit is not None:
        errors.append(limit_hit)
    return tuple(errors)


Compiled = Callable[[torch.Tensor], torch.Tensor]  # a compiled module, called like the module


class CountedInductor:
    """Inductor as torch.compile(mode=…) runs it (the same wrapper, with the mode's config), noting the
    batch size and dtype of every graph it compiles.

    The engine compares them with its buckets once captured: a bucket (and, where inductor sees the
    pixels, an input dtype) that dynamo ran without a graph of its own (a limit, a frame it skipped)
    is missing here, and the engine says so. The batch input is the graph input that is none of the
    module's parameters or buffers (a learned (1, C, H, W) mean image must not pass for it). Dynamo
    keeps a compiled graph for the backend that compiled it, so one engine's backend sees exactly that
    engine's graphs, even where several models share a class.
    """

    def __init__(self, torch_mode: str, module: nn.Module) -> None:
        self._inductor = torch._TorchCompileInductorWrapper(torch_mode, None, False)
        self._weights = {id(tensor) for tensor in itertools.chain(module.parameters(), module.buffers())}
        self.compiled: list[tuple[int, torch.dtype]] = []  # (batch size, input dtype) of each graph

    def __call__(self, graph: torch.fx.GraphModule, example_inputs: list[Any], **kwargs: Any) -> Any:
        inputs = (x for x in example_inputs if isinstance(x, torch.Tensor) and id(x) not in self._weights)
        batch = next((x for x in inputs if x.dim() == 4), None)  # (b, C, H, W)
        if batch is not None:
            self.compiled.append((int(batch.shape[0]), batch.dtype))
        return self._inductor(graph, example_inputs, **kwargs)

    # What dynamo asks of a backend besides calling it, answered as torch.compile(mode=…)'s own wrapper does.
    def get_compiler_config(self) -> Any:
        return self._inductor.get_compiler_config()

    def reset(self) -> None:
        self._inductor.reset()


def compile_counted(module: nn.Module, torch_mode: str, shapes: int) -> tuple[Compiled, CountedInductor]:
    """torch.compile'd `module` in `torch_mode` for `shapes` static shapes, and the backend that counts its graphs."""
    allow_recompiles(shapes)
    backend = CountedInductor(torch_mode, module)
    compiled: Compiled = torch.compile(module, backend=backend, dynamic=False)
    return compiled, backend
