"""The baseline: one eager forward per request, on the GPU where there is one, and the answer
waited for (`.cpu()`) inside the handler — no batching, no graphs, no overlap. Bodies are
decoded with app.codecs, as the service does, so only the inference path differs.

    python -m loadtest.servers.naive --host 127.0.0.1 --port 8002 [--device auto] [--workers N]
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import numpy as np
import torch
from fastapi import FastAPI

from app.codecs import encode_predictions
from app.main import NO_TELEMETRY
from loadtest.servers.common import SEED, add_probes, parser, predict_endpoint, serve
from models.cnn import WEIGHTS_PATH, load_model

# Read in each uvicorn worker (workers re-import this module), set by main().
DEVICE_ENV, WEIGHTS_ENV = "LOADTEST_NAIVE_DEVICE", "LOADTEST_NAIVE_WEIGHTS"
state: dict[str, object] = {}


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    device = os.environ.get(DEVICE_ENV, "auto")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    model = load_model(os.environ.get(WEIGHTS_ENV) or WEIGHTS_PATH, device=device)
    with torch.inference_mode():
        model(torch.zeros(1, 1, 28, 28, device=device)).cpu()  # first call: cuDNN set-up, allocator
    state.update(model=model, device=torch.device(device), engine=f"naive-eager-{device}")
    yield
    state.clear()


app = FastAPI(title="loadtest naive server", lifespan=lifespan, telemetry=NO_TELEMETRY)
add_probes(app, lambda: "model" in state)


def eager_answer(images: np.ndarray) -> bytes:
    """(k, 1, 28, 28) → the model's answer, computed and waited for right here."""
    model, device = state["model"], state["device"]
    with torch.inference_mode():
        x = torch.from_numpy(images).to(device)  # (k, 1, 28, 28) uint8 pixels or float32 intensities
        x = x.float() / 255 if x.dtype == torch.uint8 else x
        probabilities = torch.softmax(model(x), dim=1).cpu().numpy()  # (k, 10); .cpu() waits for the GPU
    return encode_predictions(probabilities, model="fashion-cnn", engine=str(state["engine"]), spec=SEED)


app.post("/predict")(predict_endpoint(eager_answer))


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--weights", help="state dict (default models/repository/fashion-cnn/fashion_cnn.pt)")
    args = p.parse_args()
    os.environ[DEVICE_ENV] = args.device
    if args.weights:
        os.environ[WEIGHTS_ENV] = args.weights
    serve("loadtest.servers.naive:app", args)


if __name__ == "__main__":
    main()
