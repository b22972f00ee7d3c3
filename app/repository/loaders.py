"""Turning a model.toml into something an engine can run: an nn.Module, or an ONNX file.

Every loader builds on the CPU; the engine moves the module to its device. A failure names the
model.toml and the key to fix, in one line.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import zipfile
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import nn

from app.errors import error_line
from app.repository.model_config import ModelConfigError
from app.repository.model_spec import ModelSpec

TORCHVISION_FIX = (
    "install torchvision beside a CUDA build of torch (.venv/bin/pip install -e '.[torchvision]' in the project); "
    "PyPI's torchvision wheels do not import beside the CPU-only torch wheel"
)


def load_module(spec: ModelSpec) -> nn.Module:
    """The model as an eval-mode nn.Module on the CPU: (B, C, H, W) float32 → logits (B, classes).

    Engines take it as it is: they never call .eval() again (an exported program refuses it).
    """
    config = spec.config
    loader = {
        "torchscript": _torchscript,
        "exported": _exported,
        "torchvision": _torchvision,
        "python": _python,
    }[config.format]
    try:
        module = loader(spec)
    except (ModelConfigError, KeyboardInterrupt):
        raise
    except BaseException as error:  # SystemExit too (a factory of builtins:exit): a failed start-up, not exit 0
        key = {"torchvision": "architecture", "python": "factory"}.get(config.format, "file")
        raise ModelConfigError([f"{spec.toml}: {key}: {error_line(error)}"]) from error
    if config.format != "exported":  # an exported program is traced in eval mode and refuses .eval()
        module.eval()
    return module


def _torchscript(spec: ModelSpec) -> nn.Module:
    module: nn.Module = torch.jit.load(str(spec.path(spec.config.file or "")), map_location="cpu")
    return module


def _exported(spec: ModelSpec) -> nn.Module:
    program = torch.export.load(str(spec.path(spec.config.file or "")))
    return program.module()


def _torchvision(spec: ModelSpec) -> nn.Module:
    try:
        import torchvision
    except Exception as error:  # ImportError, or RuntimeError from its _C.so beside a CPU torch
        raise ModelConfigError(
            [f"{spec.toml}: format: torchvision cannot be imported ({error_line(error)}); "
             f"{TORCHVISION_FIX}"]
        ) from None  # fmt: skip
    config = spec.config
    # Random weights (allow_random_weights) are seeded: every worker and restart serves the same model.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        module: nn.Module = torchvision.models.get_model(config.architecture or "", weights=None, **config.arguments)
    if config.weights is not None:
        _load_weights(module, spec)
    return module


def _python(spec: ModelSpec) -> nn.Module:
    module_name, _, function_name = (spec.config.factory or "").partition(":")
    if not module_name or not function_name:
        raise ModelConfigError([f"{spec.toml}: factory: expected 'module:function', got {spec.config.factory!r}"])
    factory = getattr(_import(spec, module_name), function_name)
    module = factory()
    if not isinstance(module, nn.Module):
        raise ModelConfigError(
            [f"{spec.toml}: factory: {spec.config.factory} returned a "
             f"{type(module).__name__}, not a torch.nn.Module"]
        )  # fmt: skip
    if spec.config.weights is not None:
        _load_weights(module, spec)
    return module


def _import(spec: ModelSpec, module_name: str) -> ModuleType:
    """`module_name` from the model's own folder first (as Triton's model.py), else from sys.path."""
    local = spec.path(str(Path(*module_name.split(".")).with_suffix(".py")))
    if not local.is_file():
        return importlib.import_module(module_name)
    unique = f"cgserve_model_{spec.name.replace('-', '_')}_{spec.version}_{module_name.replace('.', '_')}"
    found = importlib.util.spec_from_file_location(unique, local)
    assert found is not None and found.loader is not None
    module = importlib.util.module_from_spec(found)
    sys.modules[unique] = module
    found.loader.exec_module(module)
    return module


def _load_weights(module: nn.Module, spec: ModelSpec) -> None:
    path: Path = spec.path(spec.config.weights or "")
    problem = f"{spec.toml}: weights: {path.name}: "
    try:
        state: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except KeyboardInterrupt:
        raise
    except BaseException as error:
        raise ModelConfigError([f"{problem}{_unread(path, error)}"]) from None
    try:
        module.load_state_dict(state)
    except KeyboardInterrupt:
        raise
    except BaseException as error:
        raise ModelConfigError([f"{problem}its tensors do not fit the model: {error_line(error)}"]) from None


def _unread(path: Path, error: BaseException) -> str:
    """Why torch.load refused a weights file, in words. A file cut short, or still being copied in where a poll saw
    it, reads as torch's bare "OSError: [Errno 22] Invalid argument" (its mmap) or a zip reader's error: for those,
    its size and the likely cause; a whole file torch refuses (a pickled module, the legacy format) says only that.
    An empty file, or one that does not begin as torch.save's do, is the first kind too: torch answers it with
    advice to save with _use_new_zipfile_serialization, which misleads (a review)."""
    if (isinstance(error, OSError | EOFError | zipfile.BadZipFile) or "PytorchStreamReader failed" in str(error)
            or not _begins_as_torch_save_does(path)):  # fmt: skip
        try:
            size = f"{path.stat().st_size:,} bytes"
        except OSError:  # gone meanwhile
            size = "no such file"
        return f"not a file torch.save wrote whole ({size}: cut short or still being written?): {error_line(error)}"
    return f"torch.load (weights_only) refused it: {error_line(error)}"


def _begins_as_torch_save_does(path: Path) -> bool:
    """Whether the file begins as torch.save's files do: a zip's local file header (its format since torch 1.6) or a
    pickle's protocol opcode (the legacy format, which torch refuses in words of its own)."""
    try:
        with path.open("rb") as file:
            head = file.read(4)
    except OSError:  # gone meanwhile: the size says so
        return False
    return head == b"PK\x03\x04" or head[:1] == b"\x80"
