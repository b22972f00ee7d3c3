"""The baseline: one eager forward per request, on the GPU where there is one, and the answer
waited for (`.cpu()`) inside the handler — no batching, no graphs, no overlap. Bodies are
decoded with app.codecs.bodies, as the service does, so only the inference path differs.

    python -m loadtest.servers.naive --host 127.0.0.1 --port 8002 [--device auto] [--workers N]
        [--model-repository DIR --model NAME]     # default: the seed CNN, models/repository

Any model of a repository (e.g. resnet50 of models/examples/repository), on the device and in
the dtype the service would give it (loadtest/servers/reference_model.py).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import numpy as np
from fastapi import FastAPI

from app.codecs.bodies import encode_predictions
from app.config import DEFAULT_REPOSITORY
from app.main import NO_TELEMETRY
from app.repository.model_spec import ModelSpec
from loadtest.servers.common import add_probes, parser, predict_endpoint, serve
from loadtest.servers.reference_model import ReferenceModel

# Read in each uvicorn worker (workers re-import this module), set by main().
DEVICE_ENV, REPOSITORY_ENV, MODEL_ENV = "LOADTEST_NAIVE_DEVICE", "LOADTEST_NAIVE_REPOSITORY", "LOADTEST_NAIVE_MODEL"
state: dict[str, ReferenceModel] = {}


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    repository = Path(os.environ.get(REPOSITORY_ENV) or DEFAULT_REPOSITORY)
    device = os.environ.get(DEVICE_ENV, "auto")
    state["model"] = ReferenceModel.load(repository, os.environ.get(MODEL_ENV) or None, device)
    yield
    state.clear()


app = FastAPI(title="loadtest naive server", lifespan=lifespan, telemetry=NO_TELEMETRY)
add_probes(app, lambda: "model" in state)


def served_spec() -> ModelSpec:
    return state["model"].spec


def eager_answer(images: np.ndarray) -> bytes:
    """(k, C, H, W) → the model's answer, computed and waited for right here."""
    model = state["model"]
    probabilities = model.probabilities(images)  # (k, classes)
    return encode_predictions(probabilities, model=model.spec.name, engine=f"naive-{model.engine}", spec=model.spec)


app.post("/predict")(predict_endpoint(eager_answer, served_spec))


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--model-repository", type=Path, help="a model repository (default models/repository)")
    p.add_argument("--model", help="which model of it (default: its only one)")
    args = p.parse_args()
    os.environ[DEVICE_ENV] = args.device
    if args.model_repository:
        os.environ[REPOSITORY_ENV] = str(args.model_repository.resolve())
    if args.model:
        os.environ[MODEL_ENV] = args.model
    serve("loadtest.servers.naive:app", args)


if __name__ == "__main__":
    main()
