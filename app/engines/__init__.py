"""Choosing and building the engine the settings ask for."""

from __future__ import annotations

import torch

from app.config import Settings
from app.engines.base import Engine, Slot
from app.model_spec import ModelSpec

__all__ = ["Engine", "Slot", "build_engine", "resolve_device"]


def resolve_device(setting: str) -> str:
    """auto → cuda:0 where CUDA is present, else cpu; cuda → cuda:0."""
    if setting == "auto":
        return "cuda:0" if torch.cuda.is_available() else "cpu"
    if setting.startswith("cuda"):
        if not torch.cuda.is_available():
            raise RuntimeError(f"device {setting} was asked for, but torch sees no CUDA device")
        return "cuda:0" if setting == "cuda" else setting
    return setting


def build_engine(settings: Settings, spec: ModelSpec) -> Engine:
    """Load the model and build the engine: slow (capture, validation), so run it off the event loop."""
    device = resolve_device(settings.device)
    engine = settings.engine
    if engine == "auto":
        engine = "cuda-graph" if device.startswith("cuda") else "eager"
    module = spec.build(settings.weights)
    if device == "cpu":
        if engine != "eager":
            raise RuntimeError(f"engine {engine} needs a CUDA device; this process has device {device}")
        from app.engines.cpu_eager import CpuEagerEngine

        return CpuEagerEngine(module, spec, settings.buckets)
    from app.engines.cuda import CudaEngine

    return CudaEngine(
        module,
        spec,
        settings.buckets,
        device=torch.device(device),
        use_graphs=engine == "cuda-graph",
        dtype=settings.dtype,
        channels_last=settings.channels_last,
        slots=settings.in_flight,
        event_wait=settings.event_wait,
    )
