"""The service's one Settings object: env prefix CGSERVE_, a .env file, CLI flags on top.

Imports neither torch nor models/: `cudagraph-serve --help` and a bad setting answer at once.
Per-model choices (engine, dtype, buckets …) live in each model's model.toml; the settings of
the same name here are the defaults a model.toml may override.
"""

from __future__ import annotations

import difflib
import importlib.util
import re
import ssl
import types
import typing
from functools import lru_cache
from importlib.resources import files
from pathlib import Path
from typing import Annotated, Literal

from dotenv import dotenv_values
from pydantic import AfterValidator, Field, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from app.access.tokens import Origins, TokenFile, Tokens

# The shipped repository: the seed CNN alone. `models` is a plain package (its __init__ is empty).
DEFAULT_REPOSITORY = Path(str(files("models"))) / "repository"
# Where KServe's storage initializer puts an InferenceService's storageUri: served when it exists
# and CGSERVE_MODEL_REPOSITORY is unset, so that a forgotten setting does not serve the seed model.
KSERVE_MODELS = Path("/mnt/models")
DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
# One device (auto, cpu, cuda, cuda:N), every visible GPU (all), or a list of GPUs (cuda:0,cuda:1).
_DEVICE = re.compile(r"^(auto|cpu|all|cuda(:\d+)?(,cuda(:\d+)?)*)$")


def named_gpus(device: str) -> list[str]:
    """The GPUs a device setting names by itself, each as cuda:N (cuda means cuda:0); none for
    auto, cpu and all, which depend on what torch sees (app/engines/factory.resolve_devices)."""
    return [f"cuda:{part.partition(':')[2] or 0}" for part in device.split(",") if part.startswith("cuda")]


Engine = Literal["auto", "eager", "cuda-graph", "compile", "onnxruntime"]
Dtype = Literal["fp32", "fp16", "bf16"]
Compile = Literal["none", "inductor", "max-autotune"]


def default_repository() -> Path:
    """/mnt/models where KServe mounted a storageUri, else the shipped repository."""
    return KSERVE_MODELS if KSERVE_MODELS.is_dir() else DEFAULT_REPOSITORY


def split_buckets(value: object) -> object:
    """ "1,2,4" (env, flag) → (1, 2, 4); anything else is left for pydantic to check."""
    if isinstance(value, str):
        try:
            return tuple(int(part) for part in value.split(",") if part.strip())
        except ValueError:
            raise ValueError(f"buckets must be comma-separated integers such as 1,2,4,8; got {value!r}") from None
    return value


def check_buckets(value: tuple[int, ...]) -> tuple[int, ...]:
    if not value:
        raise ValueError("buckets must name at least one batch size, e.g. 1,2,4,8")
    if any(b < 1 for b in value):
        raise ValueError(f"every bucket must be a positive batch size; got {list(value)}")
    return tuple(sorted(set(value)))


def _readable(value: Path | None) -> Path | None:
    """A TLS file that exists and can be read, or a start-up error naming its path."""
    if value is not None:
        try:
            with value.open("rb") as file:
                file.read(1)
        except OSError as error:
            raise ValueError(f"cannot read {value}: {error.strerror or error}") from None
    return value


# A PEM file of the TLS settings, checked readable at start-up.
TlsFile = Annotated[Path | None, AfterValidator(_readable)]

# The GPU decoder's batches launched at once where jpeg_launches is 0, by the nvJPEG call it makes (the decoder
# started decides, app/codecs/gpu_jpeg.py): torchvision's decodes one batch at a time (its lock), so a second launch
# only overlaps host work; the direct decoder's three states (gpu_jpeg.DIRECT_STATES) decode side by side, and a fourth
# launch thread prepares a batch while they do: ≥ 0.6× of the engine's peak for JPEG bodies through the front door in
# four calls of four, against two of four for three launches, with a p99 at 70 % of 43–48 ms (one of 82) against
# 39–42 (run 62; four states did less, with a longer tail: runs 50, 51).
JPEG_LAUNCHES = {"torchvision": 2, "direct": 4}


class Settings(BaseSettings):
    # hide_input_in_errors: a bad token must not be repeated in an error (or a traceback's) text.
    model_config = SettingsConfigDict(
        env_prefix="CGSERVE_", env_file=".env", extra="ignore", frozen=True, hide_input_in_errors=True
    )

    host: str = Field("127.0.0.1", description="Address to listen on (0.0.0.0 in a container).")
    port: int = Field(8000, ge=1, le=65535, description="HTTP port.")
    grpc_port: int = Field(
        8001, ge=0, le=65535, description="gRPC port of the Open Inference Protocol (GRPCInferenceService); 0: off."
    )
    front_door_port: int = Field(
        0,
        ge=0,
        le=65535,
        description="A second HTTP port, served by C threads in the process that runs the engines, for the one "
        "request most clients send: one image's uint8 pixels, as POST /predict's raw body (the default model) "
        "or as the v2 infer's one UINT8 binary tensor of any model that takes the default model's images "
        "(Triton's clients, perf_analyzer), with the v2 metadata "
        "GETs (app/front_door/). Every other request gets a 4xx there and goes to port. Plain HTTP; 0: off.",
    )
    front_door_grpc_port: int = Field(
        0,
        ge=0,
        le=65535,
        description="gRPC (HTTP/2 without TLS) on the front door's C threads, where front_door_port is set: "
        "ModelInfer with one image's uint8 pixels as its one raw_input_contents entry (any model that takes the "
        "default model's images), and the models' metadata, configuration and readiness calls a client makes "
        "first. Every other call is UNIMPLEMENTED there and goes to grpc_port. 0: off.",
    )
    front_door_threads: int = Field(4, ge=1, le=64, description="C threads serving front_door_port.")
    front_door_launcher: bool = Field(
        True,
        description="Where front_door_port is set and the default model runs CUDA graphs on one GPU with class "
        "scores, its POST /predict rows are copied by the door's threads into pinned memory of three slots of its "
        "engine's own, launched and answered by a C thread, never Python's (app/front_door/launch.c): for the seed "
        "CNN, 2.2-2.9x the batcher's rate (docs/tuning.md). Rows past those slots, and every other request, go "
        "through the batcher as before. The default model's engine then captures three more slots, for uint8 "
        "pixels. false: every row goes through the batcher.",
    )
    front_door_library: Path | None = Field(
        None,
        description="app/front_door/door.c built as a shared library (the image builds it); unset: built on first "
        "use with the machine's C compiler (cc) into ~/.cache/cgserve.",
    )
    model_repository: Path = Field(
        default_factory=default_repository,
        description="Folder of models, one sub-folder with a model.toml each, or one model's folder (its "
        "model.toml at the top, named from INFERENCE_SERVICE_NAME, else the folder's name). Default: /mnt/models "
        "where it exists (KServe's storageUri), else the shipped repository of the seed CNN.",
    )
    default_model: str | None = Field(
        None,
        description="Model that POST /predict serves; may be left out when the server starts with one model: "
        "that model is then the default for the process's life (unloaded, /predict answers 404 naming it; a model "
        "loaded beside it does not change it).",
    )
    device: str = Field(
        "auto",
        description="auto | cpu | cuda | cuda:N | all | a list such as cuda:0,cuda:1; auto takes cuda:0 where "
        "present, all every visible GPU (the CPU where there is none). Several GPUs: one engine each, every batch "
        "to the least-loaded one.",
    )
    engine: Engine = Field(
        "auto",
        description="Default engine (a model.toml may choose its own). auto: cuda-graph on a GPU, eager on the "
        "CPU, onnxruntime for ONNX files.",
    )
    compile: Compile = Field(
        "inductor",
        description="Default for cuda-graph models: capture inductor's compiled kernels (max-autotune: autotuned; "
        "none: the eager module). inductor won at every bucket on the H200 (bench/results/README.md).",
    )
    compile_strict: bool = Field(
        False,
        description="A model whose torch.compile fails (no C toolchain or Python.h, a recompile limit) is served "
        "from graphs of its eager module, with a warning, its description and cgserve_compile_fallback saying so; "
        "true refuses to start instead (a model.toml may choose its own).",
    )
    compile_cache_dir: Path | None = Field(
        None, description="Inductor's on-disk cache, so that a restart does not recompile (a volume in containers)."
    )
    buckets: Annotated[tuple[int, ...], NoDecode] = Field(
        DEFAULT_BUCKETS, description="Default batch sizes to capture, comma-separated (e.g. 1,2,4,8)."
    )
    max_delay_ms: float = Field(
        1.0,
        ge=0.0,
        le=1000.0,
        description=(
            "While every device is busy, the oldest queued request waits at least this long for a fuller batch "
            "(batch_launch just-in-time: then until its device is about to be free; max-delay: this long at most). "
            "An idle device takes it at once."
        ),
    )
    batch_launch: Literal["just-in-time", "max-delay"] = Field(
        "just-in-time",
        description="While every device is busy, a partial batch launches after max_delay_ms and not before its "
        "device is about to finish what it has, so that it carries the requests that arrive meanwhile "
        "(just-in-time: expected from the batches measured so far); max-delay: after max_delay_ms alone.",
    )
    busy_batch: Literal["all-queued", "fastest-bucket"] = Field(
        "all-queued",
        description="While every device is busy, a batch takes every queued row up to the largest bucket (all-queued), "
        "or as many as the bucket that computes the most of them a device second holds, by the batches measured "
        "(fastest-bucket: 80 ResNet-50 rows go as a full 64 and 16 lead the next batch, not padded to 128). "
        "fastest-bucket helps where the device is the limit; where the front end is, it only makes the batches "
        "smaller (docs/tuning.md). An idle device always takes everything.",
    )
    queue_limit: int = Field(4096, ge=1, description="Rows allowed to wait per model; more are shed with 503.")
    in_flight: int = Field(
        2, ge=1, le=16, description="Batches launched but not yet handed back, per model and device."
    )
    request_timeout_s: float = Field(
        10.0,
        gt=0.0,
        description="End to end, from a request's first byte to its answer (read, decode, queue, compute); past "
        "it: 504, not launched. A client may ask for less (header X-Request-Timeout-Ms, or its gRPC deadline).",
    )
    batch_timeout_s: float = Field(
        10.0,
        gt=0.0,
        description="A launched batch not back after this marks the GPU dead: its requests get 503 and the "
        "process exits non-zero, for its supervisor to restart it. On the CPU such a batch is logged (a slow or stuck "
        "model's code, not a hung device) and its requests get 504 at their deadlines.",
    )
    max_body_bytes: int = Field(
        16 * 2**20,
        ge=1024,
        description="Larger request bodies get 413. A v2 infer body in the binary form (HTTP) or message (gRPC) may "
        "also be as large as a model's max_batch_size of FP32 images and 1 MiB (the models served at start-up; what "
        "Triton's clients send), up to max_inflight_bytes.",
    )
    max_inflight_bytes: int = Field(
        256 * 2**20,
        ge=1024,
        description="Request bodies being read and decoded at once, counted as their bytes arrive (inflated, where "
        "compressed); a request whose declared length would go over is refused with 503 before its body is read, "
        "and one that goes over as it arrives is refused then; a body larger than this whole budget, declared or "
        "found as it arrives, is 413. The front door keeps a budget of its own this size for its bodies and gRPC "
        "messages being received.",
    )
    max_connections: int = Field(
        0,
        ge=0,
        description="Open connections per port and process (HTTP, gRPC and the front door's two ports together, each "
        "this many); more are answered 503 and closed at once. 0: the process's open-file limit less 128 (kept for "
        "models and the GPU driver), a quarter of it to gRPC and a quarter to the front door where they listen, the "
        "rest to HTTP.",
    )
    max_header_bytes: int = Field(65536, ge=1024, description="Request line and headers over this: 431, closed.")
    header_timeout_s: float = Field(
        10.0, gt=0.0, description="Longest to wait for a request's headers (and for a new connection's first one)."
    )
    body_timeout_s: float = Field(10.0, gt=0.0, description="Longest a body may pause between two chunks: 408.")
    body_min_rate_bytes_s: int = Field(
        16384,
        ge=1,
        description="A body arriving in pieces slower than this over each window is answered 408 and its "
        "connection closed, so that slow uploads cannot hold the bytes-in-flight budget.",
    )
    body_rate_window_s: float = Field(5.0, gt=0.0, description="The window over which the minimum body rate is judged.")
    inline_predict: bool = Field(
        True,
        description="Answer small inference bodies (POST /predict JSON, raw, an image or a multipart upload, Open "
        "Inference Protocol infer JSON or binary; up to 256 KiB) inside the HTTP protocol, below the ASGI stack; off "
        "whenever an access layer (tokens, CORS, request ids, access log) or tracing is on. false: every request "
        "through the ASGI routes.",
    )
    keepalive_timeout_s: float = Field(5.0, gt=0.0, description="An idle keep-alive connection is closed after this.")
    drain_seconds: float = Field(
        5.0,
        ge=0.0,
        description="On SIGTERM: readiness turns 503 at once and requests are still served this long, for load "
        "balancers to stop sending; then the server stops accepting.",
    )
    shutdown_timeout_s: float = Field(
        30.0, gt=0.0, description="After the drain, longest to finish the requests already read before exiting."
    )
    max_instances: int = Field(1024, ge=1, description="Images allowed in one request.")
    max_image_pixels: int = Field(
        0,
        ge=0,
        description="Uploads with more pixels are refused before decoding (413). 0: per model, 16 times its "
        "input's pixels and at least 1024×1024: what its preprocessing can use, not what an attacker sends.",
    )
    dtype: Dtype = Field("fp32", description="Default compute dtype on the GPU (fp16 and bf16 need CUDA).")
    channels_last: bool = Field(False, description="Default: run convolutions in channels_last memory format.")
    event_wait: Literal["poll", "spin", "block"] = Field(
        "poll",
        description="How a finished batch is noticed: the event loop polls its event, or a thread "
        "waits on it spinning or sleeping (bench/results has the measured difference).",
    )
    switch_interval_ms: float = Field(
        1.0,
        gt=0,
        le=100,
        description="Every server process's GIL switch interval: how long a helper thread (the CUDA event waiter, "
        "the GPU JPEG decoder's launches, grpcio's poller) waits for the GIL while the event loop holds it before "
        "the loop must hand it over (CPython's default: 5). Shorter: the GPU JPEG decoder's batches wait less "
        "(bench/results/HISTORY.md, run 24).",
    )
    host_io: Literal["auto", "copy", "mapped"] = Field(
        "auto",
        description="How a graph reaches the pinned slots: copy (memcpy nodes), mapped (kernels read and write "
        "them in place), auto (probabilities written in place; pixels read in place where the largest "
        "bucket's float32 staging is at most 1 MiB).",
    )
    workers: int = Field(
        1,
        ge=1,
        le=64,
        description="Server processes on one port, each with its own engines and graphs (with engine_process: the "
        "engine process's, shared); /metrics merges them.",
    )
    engine_process: bool = Field(
        False,
        description="One engine process holds every engine and one batcher per model (one CUDA context per "
        "GPU, batches across all workers' requests); the server processes hand it their requests' pixels "
        "through shared memory. Off: each server process builds its own engines.",
    )
    engine_frames_in_flight: int = Field(
        4,
        ge=1,
        le=1024,
        description="With the engine process: frames (each the requests a worker read in one loop iteration) a "
        "worker keeps unanswered; more requests wait and go together in one frame when an answer comes back.",
    )
    model_control: Literal["none", "explicit", "poll"] = Field(
        "none",
        description="Changing the served models without a restart (Triton's model control modes). none: the "
        "models read at start-up, for good; explicit: POST /v2/repository/models/{name}/load and /unload (and "
        "gRPC's RepositoryModelLoad/Unload) load a model afresh from the repository or unload it; poll: the "
        "repository is re-read every model_poll_seconds and what changed is loaded or unloaded. Either way a "
        "new version is built beside the one serving and takes the traffic once ready. With several workers, "
        "needs engine_process true (which builds every worker's models).",
    )
    model_poll_seconds: float = Field(
        5.0, gt=0.0, description="model_control poll: how often the repository is re-read for changes."
    )
    jpeg_decoder: Literal["auto", "cpu", "gpu"] = Field(
        "auto",
        description="Who decodes JPEG uploads: gpu batches concurrent ones through nvJPEG (torchvision) on the "
        "models' CUDA device, cpu decodes each with Pillow on the decode pool. auto: gpu where the device is CUDA "
        "and torchvision imports, else cpu. PNG, CMYK JPEGs and what nvJPEG rejects always take Pillow.",
    )
    jpeg_decode_in_workers: bool = Field(
        False,
        description="With engine_process: each HTTP worker decodes its own JPEG uploads on the GPU and hands the "
        "engine process their pixels as a raw request's; false: the engine process decodes every worker's uploads, "
        "one decoder beside its batchers. Each worker then holds a CUDA context (some hundreds of MB of device "
        "memory the engine process does not count) that time-slices the GPU with the engine's (no MPS); a worker "
        "that cannot start one logs why and sends its uploads to the engine process.",
    )
    jpeg_max_batch: int = Field(
        128,
        ge=1,
        le=1024,
        description="GPU decoder: uploads decoded in one nvJPEG call at most (its decoded pixels are on the device "
        "at once: 128 photos of 1024² are 400 MB). Larger batches let the decoder keep up with many uploads in flight "
        "(bench/results/HISTORY.md); a lone upload still goes at once.",
    )
    jpeg_launches: int = Field(
        0,
        ge=0,
        le=8,
        description="GPU decoder: batches being launched at once, so that one batch's host work (reading its "
        "uploads, torchvision's calls) overlaps the previous one's decode, and the direct decoder's states decode "
        "batches side by side. 1: one after the other; 0: the count of the decoder started, 2 for torchvision's (one "
        "batch decodes at a time, even where direct was asked for and the GPU has no JPEG engines) and 4 for direct "
        "(three decoder states, which decode 3 batches at once at most, and a thread preparing the next: run 62).",
    )
    jpeg_nvjpeg: Literal["auto", "torchvision", "direct"] = Field(
        "auto",
        description="GPU decoder: torchvision's decode_jpeg, one batch at a time in the process (its lock); direct "
        "calls nvJPEG's hardware decoder (the JPEG engines of A100, H100, H200) with decoder states of its own, "
        "so that batches decode at once (a GPU without those engines keeps torchvision's). auto: direct where the "
        "front door serves in one process, torchvision otherwise. Through the front door, at 3 launches, direct won "
        "in eight of nine calls by 1–10 % on H100s, with a shorter tail in all nine (runs 51, 58–60; 4 launches since "
        "run 62); for multipart "
        "uploads in the engine process it did 7–10 % more photos a second but had a p99 at 70 % of 66–67 ms against "
        "39–41 (run 52; bench/results/HISTORY.md).",
    )
    jpeg_preallocate: str = Field(
        "0",
        pattern=r"^(0|[1-9][0-9]{0,4}x[1-9][0-9]{0,4})$",
        description="GPU decoder, direct: WIDTHxHEIGHT (e.g. 1024x768) sizes each decoder state's buffers at "
        "start-up for jpeg_max_batch photos that large, so that a larger batch than any before does not make "
        "nvJPEG reallocate them while serving (a cudaFree waits for the whole device); 0: nvJPEG grows them as "
        "batches come. Each process holding a GPU decoder sizes its own (each worker's, with several workers "
        "and no engine process or with jpeg_decode_in_workers: that many times the memory). A size the device "
        "cannot take stops start-up saying so (a worker with jpeg_decode_in_workers logs it and sends its uploads "
        "to the engine process); bench/nvjpeg_states.py --preallocate records what the states take.",
    )
    jpeg_stream_priority: Literal["normal", "high"] = Field(
        "normal",
        description="GPU decoder: the CUDA stream priority of its resizes and copies out, and of the direct "
        "decoder's decodes. high: the device runs them ahead of the models' batches, which wait for their pixels "
        "(torchvision's decode runs on a stream of its own, at normal).",
    )
    jpeg_pinned_rows: bool = Field(
        True,
        description="GPU decoder at the front door: its bulks' rows are registered as pinned memory at start-up, and "
        "the device copies each photo's pixels straight into its row (no host copy a photo on the event loop). "
        "Pins the door's buffers whole (MOST_ROWS × C×H×W bytes each, 1.8 GB for ResNet-50's 12 at the defaults): "
        "false leaves them pageable, touched as rows come.",
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="Log verbosity.")
    auth_tokens: Tokens = Field(
        None,
        description="Bearer tokens for inference (POST /predict, /v1/models/{name}/predict, /v2 but its health "
        "routes), comma-separated, 16+ characters each; set, those answer 401 without one. A secret: give it in "
        "the environment or a file, not as a flag (ps shows flags).",
    )
    auth_tokens_file: TokenFile = Field(
        None, description="File of inference tokens, one a line (# comments), read at start-up; adds to auth_tokens."
    )
    admin_tokens: Tokens = Field(
        None,
        description="Bearer tokens for /metrics and the model descriptions (GET /v1/models…), comma-separated; "
        "set, those answer 401 without one. Inference tokens are not accepted there, nor these for inference.",
    )
    admin_tokens_file: TokenFile = Field(
        None, description="File of admin tokens, one a line (# comments), read at start-up; adds to admin_tokens."
    )
    cors_origins: Origins = Field(
        (),
        description="Origins whose web pages may call the API (CORS), comma-separated, or *; empty: no CORS "
        "headers, preflights get 405.",
    )
    request_ids: bool = Field(
        False,
        description="X-Request-ID: the client's (1-128 of A-Za-z0-9._-) or a new one, echoed on every answer "
        "(x-request-id metadata over gRPC) and at the head of every log line written for the request.",
    )
    access_log: bool = Field(
        False,
        description="One JSON line per HTTP request and gRPC call on stdout (logger cgserve.access): time, "
        "request_id, method, path, status, duration_ms, bytes_in, bytes_out, client, model. Turns request_ids on.",
    )
    tracing: Literal["off", "otlp", "console"] = Field(
        "off",
        description="OpenTelemetry traces: a span per request (its parent the W3C traceparent header or gRPC "
        "metadata) and one per batch, linked to the requests it carried. otlp: sent over OTLP/HTTP to "
        "otlp_endpoint; console: printed on stdout; off: no span is made and no SDK is loaded. On, it turns "
        "request_ids on and inline_predict off. Needs the `tracing` extra.",
    )
    otlp_endpoint: str = Field(
        "http://127.0.0.1:4318/v1/traces",
        description="Where tracing otlp sends its spans (OTLP over HTTP, protobuf).",
    )
    tls_cert_file: TlsFile = Field(
        None,
        description="PEM certificate (chain) that HTTP and gRPC present: both serve TLS only (https, a secure gRPC "
        "port). Set with tls_key_file, or neither.",
    )
    tls_key_file: TlsFile = Field(
        None, description="PEM private key of tls_cert_file, unencrypted (a mounted secret, readable by the service)."
    )
    tls_client_ca_file: TlsFile = Field(
        None,
        description="PEM CA certificate(s): set, clients must present a certificate signed by one of them, on "
        "both ports (mutual TLS). Needs tls_cert_file.",
    )

    @property
    def nvjpeg(self) -> Literal["torchvision", "direct"]:
        """jpeg_nvjpeg, auto decided: direct for the front door in one process, whose JPEG bodies it decoded faster
        and with a shorter tail (runs 51, 58–60); torchvision's where the engine process decodes the workers'
        multipart uploads, which direct's did with a longer tail (run 52), and where JPEGs come by the port alone.
        (The GPU decoder keeps torchvision's where the GPU has no JPEG engines.)"""
        if self.jpeg_nvjpeg != "auto":
            return self.jpeg_nvjpeg
        return "direct" if self.front_door_port and not self.engine_process else "torchvision"

    _split_buckets = field_validator("buckets", mode="before")(split_buckets)
    _check_buckets = field_validator("buckets")(check_buckets)

    @field_validator("device")
    @classmethod
    def _check_device(cls, value: str) -> str:
        value = value.replace(" ", "")
        if not _DEVICE.match(value):
            raise ValueError(
                f"device must be auto, cpu, all, cuda, cuda:N or a comma-separated list such as cuda:0,cuda:1; "
                f"got {value!r}"
            ) from None
        gpus = named_gpus(value)
        repeated = sorted({gpu for gpu in gpus if gpus.count(gpu) > 1})
        if repeated:
            raise ValueError(f"device lists {', '.join(repeated)} more than once (cuda means cuda:0); got {value!r}")
        return value

    @field_validator("model_repository")
    @classmethod
    def _check_repository(cls, value: Path) -> Path:
        if not value.is_dir():
            raise ValueError(f"model repository {value} is not a folder")
        return value

    @model_validator(mode="after")
    def _check_combinations(self) -> Settings:
        if self.device == "cpu" and self.engine in ("cuda-graph",):
            raise ValueError("engine cuda-graph needs a CUDA device; use device auto or cuda, or engine eager")
        if self.device == "cpu" and self.dtype != "fp32":
            raise ValueError(f"dtype {self.dtype} needs a CUDA device; on the CPU the models run in fp32")
        if self.device == "cpu" and self.jpeg_decoder == "gpu":
            raise ValueError("jpeg_decoder gpu needs a CUDA device; use device auto or cuda, or jpeg_decoder cpu")
        self._check_tls()
        if self.grpc_port == self.port:  # both would listen (SO_REUSEPORT with workers), splitting the connections
            raise ValueError(f"grpc_port and port are both {self.port}: give gRPC a port of its own, or 0 for none")
        if self.front_door_port:
            self._check_front_door()
        elif self.front_door_grpc_port:
            raise ValueError("front_door_grpc_port is served by the front door's threads: set front_door_port too")
        if self.model_control != "none" and self.workers > 1 and not self.engine_process:
            raise ValueError(
                f"model_control {self.model_control} with {self.workers} workers needs engine_process true: each "
                "worker holds its own engines, so a load would reach the one worker that took the call; with "
                "engine_process every worker's models are its, and a load reaches them all. Or use workers 1"
            )
        if self.tracing != "off":
            self._check_tracing_installed()
        if self.queue_limit < self.max_instances:
            raise ValueError(
                f"queue_limit ({self.queue_limit}) must be at least max_instances ({self.max_instances}), "
                "or the largest allowed request could never be queued"
            )
        return self

    def _check_tracing_installed(self) -> None:
        """The SDK (and OTLP's exporter) is an extra: without it the server stopped in its lifespan with a traceback."""
        needed = ["opentelemetry.sdk"] + (["opentelemetry.exporter.otlp.proto.http"] if self.tracing == "otlp" else [])
        for module in needed:
            try:
                found = importlib.util.find_spec(module) is not None
            except ModuleNotFoundError:  # its parent package is missing
                found = False
            if not found:
                raise ValueError(
                    f"tracing {self.tracing} needs OpenTelemetry's {module}, which is not installed: install the "
                    "tracing extra (pip install 'cudagraph-serve[tracing]'), or set tracing off"
                )

    def _check_front_door(self) -> None:
        """The front door runs where every request meets one batcher, and speaks plain HTTP only."""
        if self.front_door_port in (self.port, self.grpc_port):
            raise ValueError(f"front_door_port {self.front_door_port} is also port or grpc_port: give it its own")
        if self.front_door_grpc_port and self.front_door_grpc_port in (self.port, self.grpc_port, self.front_door_port):
            raise ValueError(
                f"front_door_grpc_port {self.front_door_grpc_port} is also port, grpc_port or front_door_port: give it "
                "its own"
            )
        if self.workers > 1 and not self.engine_process:
            raise ValueError(
                f"front_door_port with {self.workers} workers needs engine_process true: the front door runs in "
                "the process that holds the engines, and here each worker holds its own. Or use workers 1"
            )
        if self.tls_cert_file is not None:
            raise ValueError("front_door_port serves plain HTTP and TLS is set: leave it 0, or end TLS before it")

    def _check_tls(self) -> None:
        """Certificate and key together, and usable as a pair: a start-up error naming both otherwise."""
        cert, key, client_ca = self.tls_cert_file, self.tls_key_file, self.tls_client_ca_file
        if (cert is None) != (key is None):
            have, lack = ("tls_cert_file", "tls_key_file") if key is None else ("tls_key_file", "tls_cert_file")
            raise ValueError(
                f"TLS needs CGSERVE_TLS_CERT_FILE and CGSERVE_TLS_KEY_FILE together: {have} is set, {lack} is not"
            )
        if client_ca is not None and cert is None:
            raise ValueError(
                "tls_client_ca_file asks clients for certificates over TLS; set tls_cert_file and tls_key_file too"
            )
        if cert is not None and key is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            try:  # an encrypted key would make OpenSSL prompt for its passphrase on the terminal: refused
                context.load_cert_chain(cert, key, password=_no_passphrase)
            except (ssl.SSLError, ValueError) as error:
                raise ValueError(
                    f"tls_cert_file {cert} and tls_key_file {key} are not a PEM certificate and its unencrypted "
                    f"private key: {error}"
                ) from None
            if client_ca is not None:
                try:
                    context.load_verify_locations(cafile=client_ca)
                except ssl.SSLError as error:
                    raise ValueError(f"tls_client_ca_file {client_ca} holds no PEM CA certificate: {error}") from None


def _no_passphrase() -> str:
    raise ValueError("the key is encrypted; give it unencrypted (openssl pkey -in KEY -out PLAIN)")


def env_name(name: str) -> str:
    """A setting's environment variable: CGSERVE_ and its field's name in capitals."""
    return f"CGSERVE_{name.upper()}"


# CGSERVE_ variables that are not settings: those the server sets for its own processes (app/runtime/drain.py,
# app/runtime/workers.py, app/engine_process/), the published ports docker-compose reads from .env, and the
# address Kubernetes' service links give a Service named cgserve (the manifests turn those off).
NOT_SETTINGS = re.compile(
    r"CGSERVE_(DRAIN_MANAGED|ENGINE_SOCKET|ENGINE_SEGMENTS|START_UP_FAILED_MARKER|([A-Z_]+_)?PUBLISHED_PORT"
    r"|SERVICE_[A-Z0-9_]+|PORT_[A-Z0-9_]+)"
)


def unknown_variables(environ: typing.Mapping[str, str], env_file: Path = Path(".env")) -> list[str]:
    """A line for each CGSERVE_ variable of the environment or `env_file` that is no setting (a misspelt one is
    otherwise ignored without a word), with the setting it most resembles."""
    names = {name for name in environ if name.startswith("CGSERVE_")}
    if env_file.is_file():
        names |= {name for name in dotenv_values(env_file) if name.startswith("CGSERVE_")}
    known = [env_name(name) for name in Settings.model_fields]
    lines = []
    for name in sorted(names - set(known)):
        if NOT_SETTINGS.fullmatch(name):
            continue
        close = difflib.get_close_matches(name, known, n=1)
        lines.append(f"{name} is not a setting and is ignored" + (f": did you mean {close[0]}?" if close else ""))
    return lines


def flag_name(name: str) -> str:
    """A setting's flag of `serve` and `tune`: its field's name with dashes."""
    return f"--{name.replace('_', '-')}"


def choices(field: FieldInfo) -> tuple[str, ...]:
    """A Literal setting's values (also inside `| None`), else ()."""
    annotation = field.annotation
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        annotation = next(arg for arg in typing.get_args(annotation) if arg is not type(None))
    return tuple(str(v) for v in typing.get_args(annotation)) if typing.get_origin(annotation) is typing.Literal else ()


def describe_errors(error: ValidationError) -> str:
    """One line per invalid setting, named as the user would set it (env var and flag)."""
    lines = []
    for item in error.errors():
        if item["loc"]:
            name = ".".join(str(part) for part in item["loc"])
            where = f"{env_name(name)} / {flag_name(name)}"
        else:  # a combination of settings (_check_combinations): the variables its message names by field
            found = ((re.search(rf"\b{name}\b", item["msg"]), name) for name in Settings.model_fields)
            named = [name for _, name in sorted((match.start(), name) for match, name in found if match)]
            where = ", ".join(env_name(name) for name in named) or "settings"
        lines.append(f"  {where}: {item['msg']}")
    return "invalid configuration:\n" + "\n".join(lines)


@lru_cache
def get_settings() -> Settings:
    return Settings()
