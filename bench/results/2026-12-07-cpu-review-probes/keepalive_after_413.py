"""20 pairs on one keep-alive httpx client: a gzip body inflating past the body limit (413 while it is read), then a
good 784-byte POST /predict. Prints the 413's Connection header and how many good requests failed. Usage:
keepalive_after_413.py PORT (a server from the tree under test, `serve --port PORT --grpc-port 0`)."""

import gzip
import sys

import httpx

bomb = gzip.compress(bytes(1 << 30), 9)  # ~1 MB on the wire
good = bytes(784)
failed, answers = 0, set()
with httpx.Client(base_url=f"http://127.0.0.1:{sys.argv[1]}", timeout=30) as client:
    for _ in range(40):
        refused = client.post(
            "/predict", content=bomb, headers={"content-encoding": "gzip", "content-type": "application/octet-stream"}
        )
        answers.add((refused.status_code, refused.headers.get("connection")))
        try:
            ok = client.post("/predict", content=good, headers={"content-type": "application/octet-stream"})
            failed += ok.status_code != 200
        except httpx.HTTPError:
            failed += 1
print("early answers (status, connection):", answers, "; good requests failed:", failed, "of 40")
