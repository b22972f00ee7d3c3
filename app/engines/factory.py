"""Which engine each model gets, with which options, and building it.

A model.toml's own choice wins over the service's setting of the same name, which is only the
default. Resolving is pure and cheap (the CLI checks every model before the server listens);
building loads the device and is slow (capture, validation), so it runs off the event loop.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from dataclasses import dataclass

from app.config import Settings, named_gpus
from app.engines.base import Engine
from app.repository import LoadedModel
from app.repository.model_config import ModelConfigError
from app.repository.model_spec import ModelSpec


@dataclass(frozen=True, slots=True)
class EngineOptions:
    engine: str  # eager | cuda-graph | compile | onnxruntime
    devices: tuple[str, ...]  # (cpu,) or (cuda:N, …): one engine each
    dtype: str
    channels_last: bool
    compile: str  # cuda-graph: none | inductor | max-autotune
    compile_mode: str  # engine compile: torch.compile's mode
    compile_strict: bool  # a failed compile stops the start-up instead of serving the eager module
    buckets: tuple[int, ...]
    max_delay_ms: float
    providers: tuple[str, ...]


def resolve_devices(setting: str) -> tuple[str, ...]:
    """The devices a `device` setting names, each as cpu or cuda:N. Imports torch.

    auto → cuda:0 where CUDA is present, else cpu; all → every visible GPU, else cpu;
    cuda → cuda:0; "cuda:0,cuda:1" → both. Raises ModelConfigError for a GPU torch does not see.
    """
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if setting == "auto":
        return ("cuda:0",) if count else ("cpu",)
    if setting == "all":
        return tuple(f"cuda:{index}" for index in range(count)) or ("cpu",)
    if setting == "cpu":
        return ("cpu",)
    devices = tuple(named_gpus(setting))
    if not count:
        raise ModelConfigError([f"device {setting} was asked for, but torch sees no CUDA device; use device auto"])
    missing = [device for device in devices if int(device.partition(":")[2]) >= count]
    if missing:
        raise ModelConfigError(
            [f"device {setting}: {', '.join(missing)} not present; torch sees {count} CUDA device(s)"]
        )
    return devices


def engine_options(settings: Settings, spec: ModelSpec, devices: tuple[str, ...]) -> EngineOptions:
    config = spec.config
    device = devices[0]
    toml = spec.toml
    engine = config.engine or settings.engine
    if config.format == "onnx":
        engine = "onnxruntime"
    elif engine in ("auto", "onnxruntime"):
        engine = "cuda-graph" if device.startswith("cuda") else "eager"
    dtype = config.dtype or settings.dtype
    problems = []
    if device == "cpu" and engine == "cuda-graph":
        problems.append(f"{toml}: engine: cuda-graph needs a CUDA device and this process has none; use eager")
    if device == "cpu" and engine != "onnxruntime" and dtype != "fp32":
        source = "dtype" if config.dtype else "CGSERVE_DTYPE"
        problems.append(f"{toml}: {source}: {dtype} needs a CUDA device; on the CPU models run in fp32")
    buckets = config.buckets or settings.buckets
    if (too_large := _slots_past_memory(buckets, spec.input_shape, settings.in_flight)) is not None:
        problems.append(f"{toml}: {'buckets' if config.buckets else 'CGSERVE_BUCKETS'}: {too_large}")
    if problems:
        raise ModelConfigError(problems)
    if engine == "onnxruntime":  # its providers choose its one device (model.toml's providers)
        devices = devices[:1]
    return EngineOptions(
        engine=engine,
        devices=devices,
        dtype=dtype,
        channels_last=settings.channels_last if config.channels_last is None else config.channels_last,
        compile=config.compile or settings.compile,
        compile_mode=config.compile_mode,
        compile_strict=settings.compile_strict if config.compile_strict is None else config.compile_strict,
        buckets=buckets,
        max_delay_ms=settings.max_delay_ms if config.max_delay_ms is None else config.max_delay_ms,
        providers=config.providers,
    )


def _slots_past_memory(buckets: tuple[int, ...], input_shape: tuple[int, int, int], in_flight: int) -> str | None:
    """Why the engine's slots could never be allocated, or None: each of its `in_flight` slots holds the largest
    bucket's inputs as uint8 and float32 (5 bytes a value) on the host, and a bucket of millions of images asks for
    more than the machine has (a MemoryError naming neither the model nor the key, before)."""
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not on this platform: the allocation says
        return None
    c, h, w = input_shape
    need = in_flight * max(buckets) * c * h * w * 5
    if need <= memory:
        return None
    return (
        f"the largest bucket, {max(buckets)}, needs {need / 2**30:.1f} GiB of host memory for {in_flight} slots of "
        f"({c}, {h}, {w}) inputs, more than this machine's {memory / 2**30:.1f} GiB; use smaller buckets"
    )


def build_engine(
    model: LoadedModel,
    options: EngineOptions,
    *,
    device: str | None = None,
    in_flight: int,
    event_wait: str,
    host_io: str = "auto",
    launcher_slots: int = 0,
) -> Engine:
    """Build the engine `options` name for `model` (loaded on the CPU) on `device` (default: the first of
    options.devices); slow: run it off the event loop. A CUDA engine moves `model.module` to its device:
    give each device its own copy (replica_of)."""
    spec = model.spec
    device = device or options.devices[0]
    if options.engine == "onnxruntime":
        from app.engines.onnx_runtime import OnnxRuntimeEngine

        return OnnxRuntimeEngine(spec, options.buckets, providers=options.providers, in_flight=in_flight)
    import torch
    from torch import nn

    module = model.module
    assert isinstance(module, nn.Module)
    if device == "cpu":
        from app.engines.cpu_eager import CpuEagerEngine

        if options.engine == "compile":
            from app.engines.cpu_compiled import cpu_compiled_engine

            return cpu_compiled_engine(module, spec, options.buckets, mode=options.compile_mode,
                                       strict=options.compile_strict, in_flight=in_flight)  # fmt: skip
        return CpuEagerEngine(module, spec, options.buckets, in_flight=in_flight)
    from app.engines.cuda import CudaEngine
    from app.engines.inductor import CAPTURE_MODES

    torch_mode = {"compile": options.compile_mode, "cuda-graph": CAPTURE_MODES[options.compile]}.get(options.engine)
    return CudaEngine(
        module,
        spec,
        options.buckets,
        device=torch.device(device),
        use_graphs=options.engine == "cuda-graph",
        dtype=options.dtype,
        channels_last=options.channels_last,
        torch_compile_mode=torch_mode,
        in_flight=in_flight,
        event_wait=event_wait,
        host_io=host_io,
        compile_strict=options.compile_strict,
        name=options.engine,
        launcher_slots=launcher_slots if options.engine == "cuda-graph" else 0,
    )


def replica_of(model: LoadedModel) -> LoadedModel:
    """A copy of `model` with its own module: an engine moves (and may compile) the module it is given."""
    return dataclasses.replace(model, module=copy.deepcopy(model.module))


def use_compile_cache(settings: Settings) -> None:
    """Point inductor's on-disk cache at CGSERVE_COMPILE_CACHE_DIR (read when it compiles); ValueError naming the
    setting where the folder cannot be made."""
    folder = settings.compile_cache_dir
    if folder is not None:
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise ValueError(
                f"CGSERVE_COMPILE_CACHE_DIR {folder}: the folder cannot be made ({error.strerror or error}); name a "
                "folder this process may write, or unset it"
            ) from None
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder)
