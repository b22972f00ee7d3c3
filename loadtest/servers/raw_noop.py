"""The HTTP server's own ceiling: a raw ASGI app (no framework, no route) that reads the body and answers a
fixed 10-class /predict answer. What a front end costs is measured against this.

    python -m loadtest.servers.raw_noop --host 127.0.0.1 --port 8001 [--workers N]
"""

from __future__ import annotations

from typing import Any

import orjson

from loadtest.servers.common import parser, serve

ANSWER = orjson.dumps(
    {"model": "noop", "engine": "noop", "postprocess": "softmax",
     "predictions": [{"label": 0, "class_name": "T-shirt/top", "scores": [0.1] * 10}]}
)  # fmt: skip
HEADERS = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(ANSWER))]
READY = orjson.dumps({"status": "ready"})


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    while (await receive()).get("more_body"):
        pass
    body = ANSWER if scope["method"] == "POST" else READY
    headers = HEADERS if body is ANSWER else [(b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def main() -> None:
    serve("loadtest.servers.raw_noop:app", parser(__doc__).parse_args())


if __name__ == "__main__":
    main()
