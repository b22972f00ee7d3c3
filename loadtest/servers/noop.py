"""The HTTP stack's ceiling: decodes each body with app.codecs.bodies exactly as the service does and
answers a same-shaped result (uniform scores, one prediction per image) without any model.

    python -m loadtest.servers.noop --host 127.0.0.1 --port 8001 [--workers N] [--lean]
"""

from __future__ import annotations

import numpy as np
from fastapi import FastAPI
from starlette.routing import Route

from app.codecs.bodies import encode_predictions
from app.main import NO_TELEMETRY
from loadtest.servers.common import SEED, add_probes, parser, predict_endpoint, serve


def uniform_answer(images: np.ndarray) -> bytes:
    """(k, 1, 28, 28) → k predictions of 0.1 for every class: the service's answer, no model."""
    probabilities = np.full((len(images), 10), 0.1, dtype=np.float32)  # (k, 10)
    return encode_predictions(probabilities, model="noop", engine="noop", spec=SEED)


predict = predict_endpoint(uniform_answer)
app = FastAPI(title="loadtest no-op server", telemetry=NO_TELEMETRY)
add_probes(app)
app.post("/predict")(predict)

# The same no-op behind a plain Starlette route, as the service serves POST /predict (app/main.py):
# the ceiling of the stack the service actually runs, beside the FastAPI-route ceiling above.
lean_app = FastAPI(title="loadtest no-op server, plain route", telemetry=NO_TELEMETRY)
add_probes(lean_app)
lean_app.router.routes.insert(0, Route("/predict", predict, methods=["POST"]))


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--lean", action="store_true", help="serve /predict through a plain Starlette route")
    args = p.parse_args()
    serve("loadtest.servers.noop:lean_app" if args.lean else "loadtest.servers.noop:app", args)


if __name__ == "__main__":
    main()
