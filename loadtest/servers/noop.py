"""The HTTP stack's ceiling: decodes each body with app.codecs exactly as the service does and
answers a same-shaped result (uniform scores, one prediction per image) without any model.

    python -m loadtest.servers.noop --host 127.0.0.1 --port 8001 [--workers N]
"""

from __future__ import annotations

import numpy as np
from fastapi import FastAPI, Request, Response

from app.codecs import encode_predictions
from app.errors import InputError
from app.main import NO_TELEMETRY
from loadtest.servers.common import add_probes, decode_request, error_response, parser, serve

app = FastAPI(title="loadtest no-op server", telemetry=NO_TELEMETRY)
add_probes(app)


@app.post("/predict")
async def predict(request: Request) -> Response:
    try:
        images = await decode_request(request)  # (k, 1, 28, 28) float32
    except InputError as error:
        return error_response(error)
    probabilities = np.full((len(images), 10), 0.1, dtype=np.float32)  # (k, 10)
    return Response(encode_predictions(probabilities, model="noop", engine="noop"), media_type="application/json")


def main() -> None:
    serve("loadtest.servers.noop:app", parser(__doc__).parse_args())


if __name__ == "__main__":
    main()
