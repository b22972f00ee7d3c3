"""LitServe with its batching on, serving a repository model: what a user would pick instead of
this service. Same model, device and dtype as the naive server and ours
(loadtest/servers/reference_model.py), same body decoders (app.codecs.bodies), same answer
(`encode_predictions`), same uvicorn options; LitServe's own machinery in between.

    python -m loadtest.servers.litserve_server --host 127.0.0.1 --port 8003 [--device auto]
        [--model-repository DIR --model NAME] [--max-batch-size 128] [--batch-timeout-ms 1]

How LitServe 0.2.19 runs it: the HTTP process's route reads the body (`read_request`, a FastAPI
dependency named by `decode_request`'s annotation) and puts it on a multiprocessing queue; one
inference worker process collects up to `max_batch_size` requests, waiting at most
`batch_timeout` for more, then calls decode_request per request, batch, predict, unbatch and
encode_response, and sends each answer back through a queue. The defaults match the service's:
the largest bucket, and max_delay_ms. One decode error fails its whole batch (LitServe's rule).
Needs `pip install 'cudagraph-serve[compare]'` (litserve==0.2.19).
"""

# No `from __future__ import annotations` here: LitServe builds its route from decode_request's
# and encode_response's annotations at run time, and strings would not do.

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import litserve as ls
import numpy as np
from fastapi import Depends, HTTPException, Request
from starlette.responses import Response

from app.codecs.bodies import decode_json, decode_raw, encode_predictions
from app.config import DEFAULT_BUCKETS, DEFAULT_REPOSITORY, Settings
from app.errors import InputError
from app.http.server_options import UVICORN_OPTIONS
from app.repository.model_spec import ModelSpec
from loadtest.servers.reference_model import ReferenceModel

MAX_INSTANCES: int = Settings.model_fields["max_instances"].default
MAX_DELAY_MS: float = Settings.model_fields["max_delay_ms"].default
ACCEPTED = "application/json or application/octet-stream (this reference server takes no uploads)"


@dataclass(frozen=True)
class RawRequest:
    """What the HTTP process hands the inference worker: it crosses a process boundary, pickled."""

    media: str  # the content type without parameters, lower case
    query: dict[str, str]
    body: bytes


async def read_request(request: Request) -> RawRequest:
    media = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    return RawRequest(media, dict(request.query_params), await request.body())


def decode(request: RawRequest, spec: ModelSpec) -> np.ndarray:
    """The body as (k, C, H, W) uint8 pixels or float32 intensities, by the service's decoders."""
    if request.media == "application/json":
        return decode_json(request.body, max_instances=MAX_INSTANCES, spec=spec)
    if request.media == "application/octet-stream":
        dtype, layout = request.query.get("dtype", "uint8"), request.query.get("layout", "nchw")
        return decode_raw(request.body, dtype=dtype, layout=layout, max_instances=MAX_INSTANCES, spec=spec)
    raise InputError(f"content type {request.media or '(none)'!r} is not accepted", expected=ACCEPTED, status=415)


class RepositoryModelAPI(ls.LitAPI):  # type: ignore[misc]  # litserve ships no type hints
    def __init__(self, repository: Path, model: str | None, *, max_batch_size: int, batch_timeout_s: float) -> None:
        super().__init__(max_batch_size=max_batch_size, batch_timeout=batch_timeout_s)
        self.repository, self.model_name = repository, model

    def setup(self, device: str) -> None:
        self.model = ReferenceModel.load(self.repository, self.model_name, device)

    def decode_request(
        self, request: Annotated[RawRequest, Depends(read_request)], context: dict[str, Any]
    ) -> np.ndarray:
        try:
            images = decode(request, self.model.spec)  # (k, C, H, W)
        except InputError as error:
            raise HTTPException(error.status, error.body()) from None
        context["rows"] = len(images)
        return images

    def batch(self, inputs: list[np.ndarray]) -> np.ndarray:
        return np.concatenate(inputs)  # (Σk, C, H, W): requests may carry several images each

    def predict(self, x: np.ndarray) -> np.ndarray:
        return self.model.probabilities(x)  # (Σk, classes)

    def unbatch(self, output: np.ndarray, context: list[dict[str, Any]]) -> list[np.ndarray]:
        ends = np.cumsum([c["rows"] for c in context])[:-1]
        return np.split(output, ends)  # one (k, classes) block per request, in order

    def encode_response(self, output: np.ndarray) -> Response:
        spec = self.model.spec
        body = encode_predictions(output, model=spec.name, engine=f"litserve-{self.model.engine}", spec=spec)
        return Response(body, media_type="application/json")


def build_server(args: argparse.Namespace) -> ls.LitServer:
    if args.max_batch_size < 1 or args.batch_timeout_ms < 0:
        raise SystemExit("--max-batch-size must be ≥ 1 and --batch-timeout-ms ≥ 0")
    api = RepositoryModelAPI(
        args.model_repository.resolve(),
        args.model,
        max_batch_size=args.max_batch_size,
        batch_timeout_s=args.batch_timeout_ms / 1000,
    )
    accelerator = "cuda" if args.device.startswith("cuda") else args.device
    # /readyz: the probe every server of the benchmark answers, 503 until the worker's setup ran.
    return ls.LitServer(api, accelerator=accelerator, devices=1, workers_per_device=1, healthcheck_path="/readyz")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--device", default="auto", help="auto | cpu | cuda (its first GPU)")
    p.add_argument("--model-repository", type=Path, default=DEFAULT_REPOSITORY)
    p.add_argument("--model", help="which model of the repository (default: its only one)")
    p.add_argument("--max-batch-size", type=int, default=DEFAULT_BUCKETS[-1], help="default: our largest bucket")
    p.add_argument("--batch-timeout-ms", type=float, default=MAX_DELAY_MS, help="default: our max_delay_ms")
    p.add_argument("--log-level", default="warning")
    args = p.parse_args()
    if args.device == "auto":
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    server = build_server(args)
    server.run(
        host=args.host,
        port=args.port,
        num_api_servers=1,
        log_level=args.log_level,
        generate_client_file=False,  # it would write client.py into the working directory
        **UVICORN_OPTIONS,
    )


if __name__ == "__main__":
    # Run from the module's importable name, so that the spawned inference worker unpickles
    # RepositoryModelAPI and RawRequest from loadtest.servers.litserve_server, not __main__.
    from loadtest.servers.litserve_server import main as imported_main

    imported_main()
