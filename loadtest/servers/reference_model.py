"""The reference servers' model: one model of a repository, run eagerly the way a user would
write it by hand, on the device and in the dtype the service would give it.

The naive and the LitServe servers both call `probabilities`: the module in eval mode on the
device, channels_last and autocast to the model.toml's dtype (resolved by the service's own
`engine_options`, so a model's settings mean the same thing here), the service's ModelInput
(uint8 → [0, 1] → (x − mean) / std) on the device, softmax, and `.cpu()`, which waits for the
GPU. No graphs, no compiler, no stream of its own, no overlap: what the service adds is exactly
what this leaves out. cuDNN's autotuner stays at torch's default (off): LitServe's batches take
every size from 1 to its maximum, and a user serving them does not tune each one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from app.config import Settings
from app.engines.factory import engine_options, resolve_devices
from app.engines.model_input import ModelInput
from app.repository import load_model, read_repository
from app.repository.model_config import ModelConfigError
from app.repository.model_spec import ModelSpec

AUTOCAST = {"fp16": torch.float16, "bf16": torch.bfloat16}


def find_spec(repository: Path, name: str | None) -> ModelSpec:
    """The model `name` of the repository, or its only model where `name` is None."""
    specs = {spec.name: spec for spec in read_repository(repository)}
    if name is None and len(specs) == 1:
        return next(iter(specs.values()))
    if name not in specs:
        raise ModelConfigError([f"{repository}: no model {name!r}; it holds {sorted(specs)} (pass --model NAME)"])
    return specs[name]


@dataclass(frozen=True)
class ReferenceModel:
    spec: ModelSpec
    module: nn.Module  # on `device`, eval mode, channels_last where the model asks for it
    model_input: ModelInput
    device: torch.device
    dtype: str  # fp32 | fp16 | bf16, as the service resolves it for this model
    channels_last: bool

    @classmethod
    def load(cls, repository: Path, name: str | None, device: str) -> ReferenceModel:
        """Build the model on `device` (auto | cpu | cuda | cuda:N); ModelConfigError names what to fix."""
        spec = find_spec(repository, name)
        resolved = resolve_devices(device)[0]  # one device: the reference servers run one forward at a time
        if spec.config.format == "onnx":
            raise ModelConfigError([f"{spec.folder}: an ONNX model; the reference servers run torch modules"])
        options = engine_options(Settings(device=resolved), spec, (resolved,))
        module = load_model(spec).module
        assert isinstance(module, nn.Module)
        module = module.to(resolved)
        if options.channels_last:
            module = module.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        model_input = ModelInput(spec.preprocess.mean, spec.preprocess.std).to(resolved)
        model = cls(spec, module, model_input, torch.device(resolved), options.dtype, options.channels_last)
        model.probabilities(np.zeros((1, *spec.input_shape), dtype=np.uint8))  # first call: cuDNN, allocator
        return model

    @property
    def engine(self) -> str:
        """The `engine` the answers name, e.g. eager-cuda-fp16."""
        return f"eager-{self.device.type}-{self.dtype}"

    def probabilities(self, images: np.ndarray) -> np.ndarray:
        """(k, C, H, W) uint8 pixels or float32 intensities → (k, classes) float32 probabilities,
        computed and waited for right here."""
        if not images.flags.writeable:  # a view of the request's bytes: torch wants memory it may write
            images = images.copy()
        with torch.inference_mode():
            x = self.model_input(torch.from_numpy(images).to(self.device))  # (k, C, H, W) fp32
            if self.channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            low = AUTOCAST.get(self.dtype)
            with torch.autocast(self.device.type, dtype=low or torch.float32, enabled=low is not None):
                logits = self.module(x).float()  # (k, classes) fp32
            return torch.softmax(logits, dim=1).cpu().numpy()  # .cpu() waits for the GPU
