"""What one load run is (`LoadSpec`), and the bounds every run is held to: this machine only,
a finite duration, a sane rate. The CLI's flags map one to one onto its fields (`to_args`).
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

ALLOWED_HOSTS = ("127.0.0.1", "localhost", "::1")
MAX_DURATION_S = 3600.0  # a run always ends by itself
MAX_RATE = 200_000.0
MAX_CONCURRENCY = 4096
# --client: the bare HTTP driver, the full HTTP client that checks it, and gRPC (the v2 form: a
# ModelInfer call a request, or ModelStreamInfer streams, one request in flight on each)
GRPC_CLIENTS = ("grpc", "grpc-stream")
CLIENTS = ("lean", "httpx", *GRPC_CLIENTS)


def validate_url(url: str, scheme: str = "http") -> str:
    """The base URL (scheme://host:port), if it points at this machine over plain HTTP (or gRPC, grpc://)."""
    parts = urlsplit(url)
    if parts.scheme != scheme or parts.hostname not in ALLOWED_HOSTS:
        raise ValueError(f"--url must be {scheme}:// on {', '.join(ALLOWED_HOSTS)}, got {url!r}")
    if parts.path not in ("", "/") or parts.query:
        raise ValueError(f"--url is the server's base URL (no path); got {url!r} — use --path")
    return f"{parts.scheme}://{parts.netloc}"


@dataclass(frozen=True)
class LoadSpec:
    url: str
    rate: float | None = None  # open loop: total Poisson rate, req/s
    concurrency: int | None = None  # closed loop: total requests in flight
    processes: int = 1
    connections: int | None = None  # total pool limit; default: concurrency, or 64 per process
    warmup_s: float = 2.0
    duration_s: float = 10.0
    timeout_s: float = 10.0
    seed: int = 0
    client: str = "lean"  # one of CLIENTS

    @property
    def scheme(self) -> str:
        """What --url must start with: grpc:// for the gRPC clients, http:// for the others."""
        return "grpc" if self.client in GRPC_CLIENTS else "http"

    @property
    def base_url(self) -> str:
        return validate_url(self.url, self.scheme)

    @property
    def mode(self) -> str:
        return "open" if self.rate is not None else "closed"

    def validate(self) -> None:
        validate_url(self.url, self.scheme)
        if (self.rate is None) == (self.concurrency is None):
            raise ValueError("give exactly one of --rate (open loop) or --concurrency (closed loop)")
        if self.rate is not None and not 0 < self.rate <= MAX_RATE:
            raise ValueError(f"--rate must be within (0, {MAX_RATE:.0f}], got {self.rate}")
        if self.concurrency is not None and not 1 <= self.concurrency <= MAX_CONCURRENCY:
            raise ValueError(f"--concurrency must be within [1, {MAX_CONCURRENCY}], got {self.concurrency}")
        if not 0 < self.duration_s <= MAX_DURATION_S or not 0 <= self.warmup_s <= MAX_DURATION_S:
            raise ValueError(f"--duration must be within (0, {MAX_DURATION_S:.0f}] s and --warmup ≥ 0")
        if not 0 < self.timeout_s <= 300:
            raise ValueError(f"--timeout must be within (0, 300] s, got {self.timeout_s}")
        if self.processes < 1 or self.processes > 256:
            raise ValueError(f"--processes must be within [1, 256], got {self.processes}")
        if self.client not in CLIENTS:
            raise ValueError(f"--client must be one of {', '.join(CLIENTS)}, got {self.client!r}")
        if self.connections is not None and self.connections < self.processes:
            raise ValueError(f"--connections ({self.connections}) must be ≥ --processes ({self.processes})")

    def to_args(self) -> list[str]:
        """The CLI flags that reproduce this spec (for the records' `command`)."""
        args = ["--url", self.url]
        args += ["--rate", f"{self.rate:g}"] if self.rate is not None else ["--concurrency", str(self.concurrency)]
        args += ["--processes", str(self.processes)]
        if self.connections is not None:
            args += ["--connections", str(self.connections)]
        args += ["--warmup", f"{self.warmup_s:g}", "--duration", f"{self.duration_s:g}"]
        return [*args, "--timeout", f"{self.timeout_s:g}", "--seed", str(self.seed), "--client", self.client]
